"""Model store: Hub sources fetched by the huggingface_hub client of the model store's tools venv.

Standard library only (runs on the target). The plan (listing, disk check, never-overwrite rule) is made
by bws_model_transfer before this runs; here only the missing files are handed to the client, as a JSON job
on stdin (the token never goes through argv or the environment), and each file it finishes is verified
against the sha256 / git blob id the Hub's tree listing publishes: the client does not hash while it
downloads, so the file is read once more, in parallel with the downloads still running (`verify: read`),
or the client's own size check is trusted (`verify: trust`, recorded as method `hf-client`).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from ansible.module_utils.bws_model import PART_SUFFIX, Digest, ModelStoreError, RemoteFile

CLIENT_DIR = ".cache/huggingface"
RUNNER = "bws_hf_fetch.py"
TOKEN_VARIABLE = "model_store_hf_token"


def client_paths(venv: str) -> tuple[str, str]:
    return os.path.join(venv, "bin", "python"), os.path.join(venv, RUNNER)


def incomplete_bytes(dest: str) -> int:
    """Bytes the client holds in its partial downloads (for progress)."""
    total = 0
    for directory, _, names in os.walk(os.path.join(dest, CLIENT_DIR, "download")):
        for name in names:
            if name.endswith(".incomplete"):
                with contextlib.suppress(OSError):
                    total += os.path.getsize(os.path.join(directory, name))
    return total


def failure_message(event: dict, repo: str, endpoint: str) -> str:
    path, kind, status = event.get("failed"), event.get("kind"), event.get("status")
    if kind in ("gated", "auth"):
        what = "is gated" if kind == "gated" else "is private, missing or refuses the token"
        return (
            f"{path}: HTTP {status} from {endpoint} for {repo}: the repository {what}. Accept its terms on the Hub "
            f"with the account of the token and set {TOKEN_VARIABLE} (default: HF_TOKEN in the controller's "
            "environment)"
        )
    return f"{path}: the huggingface_hub client failed: {event.get('error')}; re-run to resume"


def check_fetched(dest: str, item: RemoteFile, verify: str) -> tuple[str, str | None]:
    """Verify one file the client finished; a mismatch leaves nothing that looks complete."""
    full = os.path.join(dest, item.path)
    size = os.path.getsize(full)
    if size != item.size:
        mismatch = f"{size} bytes instead of {item.size}"
    elif verify == "trust":
        return "hf-client", item.sha256
    else:
        digest = Digest(item.size, want_git_oid=bool(item.git_oid))
        digest.update_from_file(full)
        mismatch = digest.mismatch(item)
        if not mismatch:
            return ("sha256" if item.sha256 else "git-oid" if item.git_oid else "size"), digest.sha256.hexdigest()
    bad = full + PART_SUFFIX + ".rejected"
    os.replace(full, bad)
    metadata = os.path.join(dest, CLIENT_DIR, "download", item.path + ".metadata")
    if os.path.exists(metadata):
        os.unlink(metadata)
    raise ModelStoreError(
        f"{item.path} downloaded with {mismatch}. It was set aside as {bad} (remove it); re-run to fetch it "
        "again, and check the source if it happens again"
    )


class HubClientRun:
    """One run of the client over some files, with progress and verification while it runs."""

    def __init__(self, store, source, items: list[RemoteFile], revision: str, deadline: float | None) -> None:
        self.store = store
        self.source = source
        self.items = {item.path: item for item in items}
        self.revision = revision
        self.deadline = deadline
        self.events: queue.Queue = queue.Queue()

    def job(self) -> dict:
        return {
            "repo": self.source.spec["repo"],
            "revision": self.revision,
            "endpoint": self.source.endpoint(),
            "dest": self.store.dest,
            "files": list(self.items),
            "token": self.source.token or None,
            "workers": self.source.client["workers"],
            "xet": self.source.client["xet"],
            "deadline_s": None if self.deadline is None else max(0.0, self.deadline - time.monotonic()),
        }

    def start(self) -> subprocess.Popen:
        python, runner = client_paths(self.source.client["venv"])
        if not (os.access(python, os.X_OK) and os.path.isfile(runner)):
            raise ModelStoreError(
                f"the Hub client is not installed in {self.source.client['venv']}: the model_store role creates "
                "it (model_store_tools_venv); run playbooks/fetch_models.yml"
            )
        env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
        process = subprocess.Popen(
            [python, runner], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env,
        )
        threading.Thread(target=self.read_events, args=(process,), daemon=True).start()
        process.stdin.write(json.dumps(self.job()))
        process.stdin.close()
        return process

    def read_events(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                continue
        self.events.put(None)

    def run(self) -> list[str]:
        process = self.start()
        verify = self.source.client["verify"] if self.store.verify_checksums else "trust"
        checks: dict[str, Future] = {}
        failures: list[dict] = []
        done_bytes = 0
        with ThreadPoolExecutor(max_workers=2) as pool:
            finished = False
            while not finished:
                try:
                    event = self.events.get(timeout=1.0)
                except queue.Empty:
                    event = {}
                if event is None:
                    finished = True
                elif "done" in event and event["done"] in self.items:
                    item = self.items[event["done"]]
                    done_bytes += item.size
                    checks[item.path] = pool.submit(check_fetched, self.store.dest, item, verify)
                elif "failed" in event:
                    failures.append(event)
                self.store.progress.update(done_bytes + incomplete_bytes(self.store.dest))
            stderr = process.stderr.read()
            process.wait()
            fetched = []
            errors = []
            for path, check in checks.items():
                try:
                    method, sha256 = check.result()
                except ModelStoreError as exc:
                    errors.append(str(exc))
                    continue
                self.store.record_method(self.items[path], method, sha256)
                fetched.append(path)
        if failures:
            raise ModelStoreError(failure_message(failures[0], self.source.spec["repo"], self.source.endpoint()))
        if errors:
            raise ModelStoreError(errors[0])
        if process.returncode != 0:
            tail = stderr.strip()[-2000:]
            raise ModelStoreError(f"the huggingface_hub client exited with {process.returncode}: {tail}")
        return fetched
