"""Fetch files of a Hub repository into a model directory with the huggingface_hub client.

Run by the model_fetch module with the Python of the model store's tools venv (roles/model_store/files/
hf-client.lock). It reads one JSON job on stdin, so that the token never appears in argv or the
environment:

    {"repo", "revision" (a commit), "endpoint", "dest", "files": [paths], "token" (or null),
     "workers", "xet" (bool), "deadline_s" (or null: no new file is started after it),
     "sizes": {path: bytes}, "git_oid": [paths whose git blob id is wanted as well],
     "chunk_bytes", "read_bytes" (or null: the client's defaults, see tune())}

and writes one JSON line per event on stdout, each with its wall-clock time `t`: {"imported"} once the
client is loaded, {"start": path} when a file is handed to the client, {"body": path} when its bytes start
to arrive (the metadata request is done), and {"done": path, "sha256", "git_oid"} or {"failed": path,
"kind", "status", "error"}. Files go straight into `dest` (`local_dir`); the client keeps its own metadata
and partial downloads under `dest/.cache/huggingface/`, which the model store leaves out of its manifest.

The sha256 (and the git blob id where asked) is computed from the bytes as the client writes them
(huggingface_hub 2.4.0, src/huggingface_hub/file_download.py: `_download_to_tmp_and_move` hands its
temporary file to `http_get`, which writes the body into it in chunks of `constants.DOWNLOAD_CHUNK_SIZE`,
appends after a retry and rewinds to the start when a server ignores the Range of a resume). A file whose
bytes did not all pass through here (Xet storage, a rewind to anywhere but the start) is reported without
digests, and the module reads it once to verify it.
"""

from __future__ import annotations

import hashlib
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


class HashingFile:
    """The client's temporary file: what it writes is hashed on the way (sha256, git blob id if asked)."""

    def __init__(self, handle, size: int | None, want_git: bool) -> None:
        self.handle = handle
        self.valid = handle.tell() == 0
        self.size = size
        self.want_git = want_git
        self.written = 0
        self.reset()

    def reset(self) -> None:
        self.sha256 = hashlib.sha256()
        self.git = None
        if self.want_git and self.size is not None:
            self.git = hashlib.sha1(b"blob %d\0" % self.size, usedforsecurity=False)
        self.written = 0

    def write(self, data: bytes) -> int:
        written = self.handle.write(data)
        self.sha256.update(data)
        if self.git is not None:
            self.git.update(data)
        self.written += len(data)
        return written

    def seek(self, offset: int, whence: int = 0) -> int:
        position = self.handle.seek(offset, whence)
        if position == 0:
            self.reset()  # rewound to the start (a server ignored the Range): what follows is the whole file
        elif position != self.written:
            self.valid = False
        return position

    def truncate(self, size: int | None = None) -> int:
        result = self.handle.truncate(size)
        if result != self.written:
            self.valid = False
        return result

    def digests(self) -> dict:
        if not self.valid or (self.size is not None and self.written != self.size):
            return {}
        found = {"sha256": self.sha256.hexdigest()}
        if self.git is not None:
            found["git_oid"] = self.git.hexdigest()
        return found

    def __getattr__(self, name: str):
        return getattr(self.handle, name)


def tune(constants, job: dict) -> None:
    """Sizes of the client's reads and writes (fewer, larger copies per byte: bench_model_fetch.py measured
    the client's CPU time). `chunk_bytes`: huggingface_hub's `constants.DOWNLOAD_CHUNK_SIZE`, the size of each
    write (10 MiB by default, read at every download). `read_bytes`: httpcore2's `HTTP11Connection.
    READ_NUM_BYTES`, the size of each socket read (64 KiB by default); left alone where it is not there."""
    if job.get("chunk_bytes"):
        constants.DOWNLOAD_CHUNK_SIZE = int(job["chunk_bytes"])
    if job.get("read_bytes"):
        try:
            from httpcore2._sync.http11 import HTTP11Connection
        except ImportError:
            return
        if isinstance(getattr(HTTP11Connection, "READ_NUM_BYTES", None), int):
            HTTP11Connection.READ_NUM_BYTES = int(job["read_bytes"])


def hash_while_writing(file_download, current: threading.local, say) -> None:
    """Wrap the client's `http_get` so that the bytes of the file this thread fetches are hashed as written."""
    original = file_download.http_get

    def http_get(url, temp_file, *args, **kwargs):
        job = getattr(current, "job", None)
        if job is not None and not isinstance(temp_file, HashingFile):
            if job["file"] is None:
                job["file"] = HashingFile(temp_file, job["size"], job["want_git"])
                say({"body": job["path"]})
            else:
                job["file"].valid = False  # a second body for one file: leave it to the module's read
            temp_file = job["file"]
        return original(url, temp_file, *args, **kwargs)

    file_download.http_get = http_get


def main() -> int:
    job = json.load(sys.stdin)
    configure(job)
    lock = threading.Lock()

    def say(doc: dict) -> None:
        line = json.dumps({**doc, "t": time.time()}) + "\n"
        with lock:
            sys.stdout.write(line)
            sys.stdout.flush()

    from huggingface_hub import constants, file_download, hf_hub_download

    tune(constants, job)
    current = threading.local()
    hash_while_writing(file_download, current, say)
    say({"imported": True})

    files = list(job["files"])
    sizes = job.get("sizes") or {}
    want_git = set(job.get("git_oid") or [])
    deadline = time.monotonic() + job["deadline_s"] if job.get("deadline_s") is not None else None
    started = [0]

    def next_file() -> str | None:
        with lock:
            if not files or (deadline is not None and started[0] and time.monotonic() >= deadline):
                return None
            started[0] += 1
            return files.pop(0)

    def worker() -> None:
        while (path := next_file()) is not None:
            current.job = {"path": path, "file": None, "size": sizes.get(path), "want_git": path in want_git}
            say({"start": path})
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
            finally:
                hashing, current.job = current.job["file"], None
            say({"done": path, **(hashing.digests() if hashing is not None else {})})

    threads = [threading.Thread(target=worker) for _ in range(max(1, int(job.get("workers") or 1)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
