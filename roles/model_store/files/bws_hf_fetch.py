"""Fetch files of a Hub repository into a model directory with the huggingface_hub client.

Run by the model_fetch module with the Python of the model store's tools venv (roles/model_store/files/
hf-client.lock). It reads one JSON job on stdin, so that the token never appears in argv or the
environment:

    {"repo", "revision" (a commit), "endpoint", "dest", "files": [paths], "token" (or null),
     "workers", "xet" (bool), "deadline_s" (or null: no new file is started after it)}

and writes one JSON line per finished file on stdout: {"done": path} or {"failed": path, "kind", "status",
"error"}. Files go straight into `dest` (`local_dir`); the client keeps its own metadata and partial
downloads under `dest/.cache/huggingface/`, which the model store leaves out of its manifest and checks.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def configure(job: dict) -> None:
    """Environment of the client, set before it is imported (it reads these at import time)."""
    dest = job["dest"]
    os.environ["HF_HUB_DISABLE_XET"] = "0" if job.get("xet") else "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_IMPLICIT_TOKEN"] = "1"
    # its cache and token file inside the model directory's client area, not the account's home
    os.environ["HF_HOME"] = os.path.join(dest, ".cache", "huggingface", "home")
    if job.get("endpoint"):
        os.environ["HF_ENDPOINT"] = job["endpoint"]


def classify(exc: BaseException) -> tuple[str, int | None]:
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(exc, GatedRepoError):
        return "gated", status
    if isinstance(exc, RepositoryNotFoundError) or status in (401, 403):
        return "auth", status
    if isinstance(exc, HfHubHTTPError):
        return "http", status
    return "error", status


def main() -> int:
    job = json.load(sys.stdin)
    configure(job)
    from huggingface_hub import hf_hub_download

    files = list(job["files"])
    deadline = time.monotonic() + job["deadline_s"] if job.get("deadline_s") is not None else None
    lock = threading.Lock()
    started = [0]

    def say(doc: dict) -> None:
        with lock:
            sys.stdout.write(json.dumps(doc) + "\n")
            sys.stdout.flush()

    def next_file() -> str | None:
        with lock:
            if not files or (deadline is not None and started[0] and time.monotonic() >= deadline):
                return None
            started[0] += 1
            return files.pop(0)

    def worker() -> None:
        while (path := next_file()) is not None:
            try:
                hf_hub_download(
                    repo_id=job["repo"],
                    filename=path,
                    revision=job["revision"],
                    local_dir=job["dest"],
                    endpoint=job.get("endpoint") or None,
                    token=job.get("token") or False,
                )
            except Exception as exc:
                kind, status = classify(exc)
                say({"failed": path, "kind": kind, "status": status, "error": f"{type(exc).__name__}: {exc}"})
                with lock:
                    files.clear()  # start nothing more: the module reports this one
                continue
            say({"done": path})

    threads = [threading.Thread(target=worker) for _ in range(max(1, int(job.get("workers") or 1)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
