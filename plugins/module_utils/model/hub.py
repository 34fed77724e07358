"""Model store: Hub sources fetched by the huggingface_hub client of the model store's tools venv.

Standard library only (runs on the target). The plan (listing, disk check, never-overwrite rule) is made
by bws_model_transfer before this runs; here only the missing files are handed to the client, as a JSON job
on stdin (the token never goes through argv or the environment), and each file it finishes is verified
against the sha256 / git blob id the Hub's tree listing publishes (`verify: read`): with the digests the
client's runner computed from the bytes as it wrote them, or, where the client wrote them itself (Xet
storage), by reading the file once more while the other downloads run. `verify: trust` keeps the client's
size check only (recorded as method `hf-client`). The run's timeline (client start, metadata, transfer,
verification, memory) is kept in `profile` for progress.json and the benchmark.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import resource
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from ansible_collections.blackwell.serving.plugins.module_utils.model.store import (
    PART_SUFFIX,
    Digest,
    ModelStoreError,
    RemoteFile,
    verification_method,
)

CLIENT_DIR = ".cache/huggingface"
RUNNER = "bws_hf_fetch.py"
INSTALLED_LOCK = "hf-client.lock.installed"  # the role copies the lock here once pip has installed it
TOKEN_VARIABLE = "model_store_hf_token"
# The client's write size (huggingface_hub's default is 10 MiB) and socket read size (httpcore2's is 64 KiB):
# 1 MiB chunks stay in the CPU caches between the client's copies, the write and the sha256, keep the client's
# memory small (55-80 MiB instead of about 200) and, with 1 MiB reads, cut the client's CPU time per byte
# by about a fifth (bench_model_fetch.py; the runner's tune()).
CHUNK_BYTES = 1024 * 1024
READ_BYTES = 1024 * 1024
# Threads that read files the runner could not hash while they were written (Xet): at most one per CPU.
READ_THREADS = max(1, min(2, os.cpu_count() or 1))


def client_paths(venv: str) -> tuple[str, str]:
    return os.path.join(venv, "bin", "python"), os.path.join(venv, RUNNER)


def client_held(venv: str) -> dict:
    """What the tools venv holds, for the role to compare with its own files: the sha1 of the fetch program and
    of the lock installed last (null where missing); empty without an executable Python."""

    def sha1_of(path: str) -> str | None:
        try:
            with open(path, "rb") as handle:
                return hashlib.sha1(handle.read(), usedforsecurity=False).hexdigest()
        except OSError:
            return None

    python, runner = client_paths(venv)
    if not os.access(python, os.X_OK):
        return {}
    return {"runner_sha1": sha1_of(runner), "lock_sha1": sha1_of(os.path.join(venv, INSTALLED_LOCK))}


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


def streamed_mismatch(item: RemoteFile, digests: dict) -> tuple[str | None, str | None] | None:
    """Compare the digests the runner computed while the file was written; None when they cannot decide."""
    sha256, git_oid = digests.get("sha256"), digests.get("git_oid")
    if not sha256 or (item.git_oid and not git_oid):
        return None
    if item.sha256 and sha256 != item.sha256:
        return f"sha256 {sha256} but the source publishes {item.sha256}", sha256
    if item.git_oid and git_oid != item.git_oid:
        return f"git blob id {git_oid} but the source publishes {item.git_oid}", sha256
    return None, sha256


def check_fetched(dest: str, item: RemoteFile, verify: str, digests: dict | None = None) -> tuple[str, str | None]:
    """Verify one file the client finished; a mismatch leaves nothing that looks complete.

    `digests` are the sha256 / git blob id of the bytes as the runner wrote them; without them (or with
    `verify: read` and the client writing the file itself) the file is read once.
    """
    full = os.path.join(dest, item.path)
    size = os.path.getsize(full)
    streamed = streamed_mismatch(item, digests or {})
    if size != item.size:
        mismatch = f"{size} bytes instead of {item.size}"
    elif verify == "trust":
        return "hf-client", item.sha256
    elif streamed is not None:
        mismatch, sha256 = streamed
        if not mismatch:
            return verification_method(item), sha256
    else:
        digest = Digest(item.size, want_git_oid=bool(item.git_oid))
        digest.update_from_file(full)
        mismatch = digest.mismatch(item)
        if not mismatch:
            return verification_method(item), digest.sha256.hexdigest()
    bad = full + PART_SUFFIX + ".rejected"
    os.replace(full, bad)
    metadata = os.path.join(dest, CLIENT_DIR, "download", item.path + ".metadata")
    if os.path.exists(metadata):
        os.unlink(metadata)
    raise ModelStoreError(
        f"{item.path} downloaded with {mismatch}. It was set aside as {bad} (remove it); re-run to fetch it "
        "again, and check the source if it happens again"
    )


class Timeline:
    """When the phases of one client run happened, in seconds from the start of the time slice."""

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self.marks: dict[str, float] = {}
        self.files: dict[str, dict[str, float]] = {}
        self.read_s = 0.0
        self.read_files = 0
        self.streamed_files = 0
        self.lock = threading.Lock()  # verification threads report here

    def at(self, when: float | None = None) -> float:
        return round((time.time() if when is None else when) - self.started_at, 3)

    def mark(self, name: str, when: float | None = None) -> None:
        self.marks[name] = self.at(when)

    def file_event(self, path: str, name: str, when: float | None) -> None:
        with self.lock:
            self.files.setdefault(path, {})[name] = self.at(when)

    def checked(self, seconds: float, read: bool) -> None:
        with self.lock:
            if read:
                self.read_s += seconds
                self.read_files += 1
            else:
                self.streamed_files += 1

    def summary(self) -> dict:
        def span(name: str, pick) -> float | None:
            values = [times[name] for times in self.files.values() if name in times]
            return pick(values) if values else None

        metadata = [t["body"] - t["start"] for t in self.files.values() if "body" in t and "start" in t]
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        return {
            **self.marks,
            "files": len(self.files),
            "first_start_s": span("start", min),
            "first_body_s": span("body", min),
            "last_done_s": span("done", max),
            "last_verified_s": span("verified", max),
            "metadata_max_s": round(max(metadata), 3) if metadata else None,
            "verified_in_stream": self.streamed_files,
            "verified_by_read": self.read_files,
            "verify_read_s": round(self.read_s, 3),
            "client_max_rss_mib": round(children, 1),
            "module_max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }


class HubClientRun:
    """One run of the client over some files, with progress and verification while it runs."""

    def __init__(self, store, source, items: list[RemoteFile], revision: str, deadline: float | None) -> None:
        self.store = store
        self.source = source
        self.items = {item.path: item for item in items}
        self.revision = revision
        self.deadline = deadline
        self.events: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        self.stderr_reader: threading.Thread | None = None
        self.timeline = Timeline(store.progress.started_at)

    def job(self) -> dict:
        return {
            "repo": self.source.spec["repo"],
            "revision": self.revision,
            "endpoint": self.source.endpoint(),
            "dest": self.store.dest,
            "files": list(self.items),
            "sizes": {path: item.size for path, item in self.items.items()},
            "git_oid": [path for path, item in self.items.items() if item.git_oid],
            "token": self.source.token or None,
            "workers": self.source.client["workers"],
            "xet": self.source.client["xet"],
            "chunk_bytes": CHUNK_BYTES,
            "read_bytes": READ_BYTES,
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
        self.timeline.mark("client_spawn_s")
        process = subprocess.Popen(
            [python, runner],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        threading.Thread(target=self.read_events, args=(process,), daemon=True).start()
        self.stderr_reader = threading.Thread(target=self.stderr.extend, args=(process.stderr,), daemon=True)
        self.stderr_reader.start()  # read while it runs: a full pipe would stop the client
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

    def on_event(self, event: dict, verify: str, pool: ThreadPoolExecutor, checks: dict[str, Future]) -> int:
        """Note one event of the runner; hand a finished file to verification. Returns the bytes it finished."""
        when = event.get("t")
        if "imported" in event:
            self.timeline.mark("client_imported_s", when)
        for name in ("start", "body"):
            if event.get(name) in self.items:
                self.timeline.file_event(event[name], name, when)
        item = self.items.get(event.get("done"))
        if item is None:
            return 0
        self.timeline.file_event(item.path, "done", when)
        checks[item.path] = pool.submit(self.check, item, verify, event)
        return item.size

    def check(self, item: RemoteFile, verify: str, digests: dict) -> tuple[str, str | None]:
        started = time.monotonic()
        read = verify != "trust" and streamed_mismatch(item, digests) is None
        try:
            return check_fetched(self.store.dest, item, verify, digests)
        finally:
            self.timeline.checked(time.monotonic() - started, read)
            self.timeline.file_event(item.path, "verified", None)

    def run(self) -> list[str]:
        process = self.start()
        verify = self.source.client["verify"] if self.store.verify_checksums else "trust"
        checks: dict[str, Future] = {}
        failures: list[dict] = []
        done_bytes = 0
        with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
            finished = False
            while not finished:
                try:
                    event = self.events.get(timeout=1.0)
                except queue.Empty:
                    event = {}
                if event is None:
                    finished = True
                elif "failed" in event:
                    failures.append(event)
                else:
                    done_bytes += self.on_event(event, verify, pool, checks)
                self.store.progress.update(done_bytes + incomplete_bytes(self.store.dest))
            process.wait()
            self.timeline.mark("client_exit_s")
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
        self.timeline.mark("recorded_s")
        self.store.progress.profile = {"hub_client": self.timeline.summary()}
        if failures:
            raise ModelStoreError(failure_message(failures[0], self.source.spec["repo"], self.source.endpoint()))
        if errors:
            raise ModelStoreError(errors[0])
        if process.returncode != 0:
            if self.stderr_reader is not None:
                self.stderr_reader.join(timeout=5)
            tail = "".join(self.stderr).strip()[-2000:]
            raise ModelStoreError(f"the huggingface_hub client exited with {process.returncode}: {tail}")
        return fetched
