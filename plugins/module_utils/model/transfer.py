"""Model store: sources (hf, http, local, nfs, rsync), resumable transfers, plan / fetch / finalize.

Standard library only (runs on the target). A transfer writes `<file>.part` next to the final name and
renames it only after its size and published checksum match; an interrupted transfer resumes from the
bytes already in the `.part` file (HTTP Range, seek for local copies, `rsync --append-verify`). Nothing
that is complete is ever removed or overwritten: a file that disagrees with the source stops the run.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from ansible_collections.blackwell.serving.plugins.module_utils.model.hub import HubClientRun
from ansible_collections.blackwell.serving.plugins.module_utils.model.parallel import ParallelFetch, kept_bytes
from ansible_collections.blackwell.serving.plugins.module_utils.model.store import (
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    PART_SUFFIX,
    PROGRESS_FILE,
    Digest,
    ModelStoreError,
    RemoteFile,
    filter_files,
    http_error_text,
    human_bytes,
    load_verified,
    parse_hf_tree,
    parse_link_next,
    parse_manifest,
    parse_rsync_list,
    read_json,
    record_verified,
    statvfs_free,
    still_verified,
    verification_method,
    walk_local,
    write_json_atomic,
)

CHUNK = 1024 * 1024
USER_AGENT = "blackwell-serving-model-store/1"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
SOURCE_KEYS = {
    "hf": ({"repo"}, {"revision", "endpoint", "include", "exclude"}),
    "http": ({"url"}, {"manifest", "include", "exclude"}),
    "local": ({"path"}, {"include", "exclude"}),
    "nfs": ({"export", "mount_point"}, {"subdir", "options", "include", "exclude"}),
    "rsync": ({"src"}, {"options", "include", "exclude"}),
}


class TransferInterruptedError(Exception):  # rsync's retryable exits
    """A transfer stopped early for a reason worth retrying (network)."""


# ---------------------------------------------------------------- progress


class Progress:
    """Bytes done of a directory, rate and ETA: written to `.model_store/progress.json` at most once a second
    and returned at the end of each time slice (the role prints one line per slice)."""

    def __init__(self, path: str | None, total_bytes: int, done_before: int) -> None:
        self.path = path
        self.total = total_bytes
        self.done_before = done_before
        self.moved = 0
        self.file: str | None = None
        self.started = time.monotonic()
        self.started_at = time.time()
        self.last_write = 0.0
        self.profile: dict | None = None  # how the slice spent its time, where the transfer keeps one

    def snapshot(self) -> dict:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.moved / elapsed
        done = min(self.done_before + self.moved, self.total)
        return {
            "file": self.file,
            "bytes_done": done,
            "bytes_total": self.total,
            "slice_bytes": self.moved,
            "slice_s": round(elapsed, 3),
            "slice_started_at": round(self.started_at, 3),
            "rate_bytes_per_s": int(rate),
            "eta_s": int((self.total - done) / rate) if rate > 0 else None,
            "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **({"profile": self.profile} if self.profile else {}),
        }

    def update(self, moved: int, file: str | None = None, final: bool = False) -> None:
        self.moved = moved
        self.file = file or self.file
        now = time.monotonic()
        if not self.path or (not final and now - self.last_write < 1.0):
            return
        self.last_write = now
        write_json_atomic(self.path, self.snapshot())


def progress_line(snapshot: dict) -> str:
    total = snapshot["bytes_total"]
    percent = 100.0 * snapshot["bytes_done"] / total if total else 100.0
    eta = snapshot.get("eta_s")
    eta_text = "done" if snapshot["bytes_done"] >= total else ("ETA ?" if eta is None else f"ETA {format_eta(eta)}")
    return (
        f"{human_bytes(snapshot['bytes_done'])} of {human_bytes(total)} ({percent:.0f}%), "
        f"{human_bytes(snapshot['rate_bytes_per_s'])}/s, {eta_text}"
    )


def format_eta(seconds: int) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


# ---------------------------------------------------------------- HTTP


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name (127.0.0.1.nip.io resolves wherever its owner says)


def token_may_go_to(url: str) -> bool:
    """The token travels only encrypted (https), or to a mirror on this host (http to a loopback address, where no
    network lies between)."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "https" or (parts.scheme == "http" and _is_loopback((parts.hostname or "").lower()))


def redact_url(url: str) -> str:
    """The URL without credentials in it, its query or its fragment (to name it in a message)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _origin(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.netloc.lower()


class _RedirectKeepingAuthOnSameOrigin(urllib.request.HTTPRedirectHandler):
    """Follow redirects (the Hub sends LFS files to a CDN) but never send the token to another origin: another host,
    another port, or the same host over http (a downgrade would send it in clear)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: PLR0917 (urllib's signature)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and (_origin(newurl) != _origin(req.full_url) or not token_may_go_to(newurl)):
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_RedirectKeepingAuthOnSameOrigin())


class HttpClient:
    def __init__(self, token: str | None, timeout: float) -> None:
        self.token = token
        self.timeout = timeout

    def request(self, url: str, extra: dict[str, str] | None = None) -> http.client.HTTPResponse:
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(extra or {})})
        if self.token:
            if not token_may_go_to(url):
                raise ModelStoreError(f"refusing to send the Hub token to {redact_url(url)}: it goes only over "
                                      "https (or to a mirror on this host); set an https endpoint")
            request.add_header("Authorization", f"Bearer {self.token}")
        return _OPENER.open(request, timeout=self.timeout)

    def get_json(self, url: str) -> tuple[object, str | None]:
        try:
            with self.request(url, {"Accept": "application/json"}) as response:
                body = response.read()
                link = response.headers.get("Link")
        except urllib.error.HTTPError as exc:
            raise ModelStoreError(http_error_text(exc, url)) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise ModelStoreError(f"cannot reach {url}: {exc}") from exc
        try:
            return json.loads(body), link
        except ValueError as exc:
            raise ModelStoreError(f"{url} did not answer with JSON: {exc}") from exc

    def open_range(self, url: str, start: int, end: int, size: int) -> http.client.HTTPResponse:
        """Ask for bytes [start, end) of a file of `size` bytes (no Range header for the whole file)."""
        whole = start == 0 and end == size
        return self.request(url, None if whole else {"Range": f"bytes={start}-{end - 1}"})


def copy_stream(stream, part: str, span: tuple[int, int], digest: Digest, report: Callable[[int], None]) -> None:
    """Append stream to part from byte span[0] up to span[1] (the file size), hashing what passes."""
    offset, size = span
    done = offset
    try:
        with open(part, "ab") as out:
            while done < size:
                chunk = stream.read(min(CHUNK, size - done))
                if not chunk:
                    break
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                report(done - offset)
    except OSError as exc:
        raise ModelStoreError(f"cannot copy into {part}: {exc}") from exc
    if done < size:
        raise ModelStoreError(f"{os.path.basename(part)}: the source ended at {done} of {size} bytes")


# ---------------------------------------------------------------- sources


def validate_source(source: object) -> dict:
    if not isinstance(source, dict) or source.get("type") not in SOURCE_KEYS:
        raise ModelStoreError(f"source {source!r} needs a type, one of: {', '.join(sorted(SOURCE_KEYS))}")
    required, optional = SOURCE_KEYS[source["type"]]
    missing = sorted(required - source.keys())
    unknown = sorted(source.keys() - required - optional - {"type"})
    if missing or unknown:
        raise ModelStoreError(
            f"source type {source['type']}: missing keys {missing}, unknown keys {unknown} "
            f"(allowed: {sorted(required | optional)})"
        )
    for key in ("include", "exclude", "options"):
        if key in source and not (isinstance(source[key], list) and all(isinstance(item, str) for item in source[key])):
            raise ModelStoreError(f"source key {key} must be a list of strings")
    return source


class Source:
    """Lists files and moves one of them into a `.part` file."""

    def __init__(self, spec: dict, token: str | None, timeout: float) -> None:
        self.spec = validate_source(spec)
        self.token = token
        self.timeout = timeout

    def listing(self) -> tuple[str | None, list[RemoteFile]]:
        revision, files = self.list_files()
        return revision, filter_files(files, self.spec.get("include", []), self.spec.get("exclude", []))

    def list_files(self) -> tuple[str | None, list[RemoteFile]]:
        raise NotImplementedError

    def transfer(self, item: RemoteFile, part: str, digest: Digest, report: Callable[[int], None]) -> bool:
        """Move item into part (resuming); return True when the bytes went through digest on the way."""
        raise NotImplementedError

    def local_root(self) -> str | None:
        return None


class HubSource(Source):
    def endpoint(self) -> str:
        return str(self.spec.get("endpoint") or DEFAULT_HF_ENDPOINT).rstrip("/")

    def list_files(self) -> tuple[str | None, list[RemoteFile]]:
        client = HttpClient(self.token, self.timeout)
        repo = urllib.parse.quote(self.spec["repo"], safe="/")
        wanted = urllib.parse.quote(str(self.spec.get("revision") or "main"), safe="")
        info, _ = client.get_json(f"{self.endpoint()}/api/models/{repo}/revision/{wanted}")
        commit = info.get("sha") if isinstance(info, dict) else None
        if not isinstance(commit, str) or not commit:
            raise ModelStoreError(f"the Hub did not give a commit for {self.spec['repo']}@{wanted}")
        files: list[RemoteFile] = []
        url: str | None = f"{self.endpoint()}/api/models/{repo}/tree/{commit}?recursive=true"
        while url:
            page, link = client.get_json(url)
            files += parse_hf_tree(page)
            url = parse_link_next(link)
            if url and url.startswith("/"):
                url = self.endpoint() + url
        return commit, files

    client: dict = {"venv": "", "workers": 8, "xet": True, "verify": "read"}  # noqa: RUF012 (set per run)

    def fetch_with_client(
        self, store: ModelStore, items: list[RemoteFile], revision: str | None, deadline: float | None
    ) -> list[str]:
        if not revision:
            raise ModelStoreError(f"no commit is known for {self.spec['repo']}: list the source again")
        return HubClientRun(store, self, items, revision, deadline).run()


class MirrorSource(Source):
    def base(self) -> str:
        return str(self.spec["url"]).rstrip("/") + "/"

    def list_files(self) -> tuple[str | None, list[RemoteFile]]:
        manifest = str(self.spec.get("manifest") or MANIFEST_FILE)
        doc, _ = HttpClient(self.token, self.timeout).get_json(self.base() + manifest)
        revision = doc.get("revision") if isinstance(doc, dict) else None
        return (revision if isinstance(revision, str) else None), parse_manifest(doc)

    def url_of(self, item: RemoteFile) -> str:
        return self.base() + urllib.parse.quote(item.path, safe="/")


class LocalSource(Source):
    """A directory on the host: a local disk, or an NFS export the role mounted."""

    def local_root(self) -> str:
        if self.spec["type"] == "nfs":
            mount_point = self.spec["mount_point"]
            if not os.path.ismount(mount_point):
                raise ModelStoreError(f"{mount_point} is not mounted (NFS export {self.spec['export']})")
            return os.path.join(mount_point, self.spec.get("subdir") or "")
        return self.spec["path"]

    def list_files(self) -> tuple[str | None, list[RemoteFile]]:
        root = self.local_root()
        if not os.path.isdir(root):
            raise ModelStoreError(f"source directory {root} does not exist")
        files = walk_local(root)
        published = read_json(os.path.join(root, MANIFEST_FILE))
        if isinstance(published, dict) and published.get("complete"):
            # a directory fetched by the model store earlier: reuse the checksums it recorded
            by_path = {item.path: item for item in parse_manifest(published)}
            for item in files:
                known = by_path.get(item.path)
                if known is not None and known.size == item.size:
                    item.sha256, item.git_oid = known.sha256, known.git_oid
        revision = published.get("revision") if isinstance(published, dict) else None
        return revision, files

    def transfer(self, item: RemoteFile, part: str, digest: Digest, report: Callable[[int], None]) -> bool:
        offset = os.path.getsize(part) if os.path.exists(part) else 0
        if offset:
            digest.update_from_file(part, offset)  # the kept bytes, read once
        source_path = os.path.join(self.local_root(), item.path)
        try:
            with open(source_path, "rb") as stream:
                stream.seek(offset)
                copy_stream(stream, part, (offset, item.size), digest, report)
        except FileNotFoundError as exc:
            raise ModelStoreError(f"{source_path} disappeared from the source") from exc
        return True


class RsyncSource(Source):
    def src(self) -> str:
        return str(self.spec["src"]).rstrip("/") + "/"

    def run(self, args: list[str]) -> str:
        rsync = shutil.which("rsync")
        if rsync is None:
            raise ModelStoreError("rsync is not installed on the host: install it (apt-get install rsync)")
        command = [rsync, "--no-h", f"--timeout={int(self.timeout)}", *self.spec.get("options", []), *args]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode in (10, 12, 23, 30, 35):
            raise TransferInterruptedError(f"rsync exit {result.returncode}: {result.stderr.strip()}")
        if result.returncode != 0:
            raise ModelStoreError(f"rsync {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def list_files(self) -> tuple[str | None, list[RemoteFile]]:
        return None, parse_rsync_list(self.run(["--list-only", "-r", "--", self.src()]))

    def transfer(self, item: RemoteFile, part: str, digest: Digest, report: Callable[[int], None]) -> bool:
        # --append-verify resumes at the part's size and checks the whole file when done; rsync writes
        # the bytes, so they are read once afterwards for the sha256
        before = os.path.getsize(part) if os.path.exists(part) else 0
        self.run(["--append-verify", "--", self.src() + item.path, part])
        report(os.path.getsize(part) - before)
        return False


SOURCE_CLASSES: dict[str, type[Source]] = {
    "hf": HubSource,
    "http": MirrorSource,
    "local": LocalSource,
    "nfs": LocalSource,
    "rsync": RsyncSource,
}


def make_source(spec: dict, token: str | None, timeout: float, hf_client: dict | None = None) -> Source:
    kind = validate_source(spec)["type"]
    source = SOURCE_CLASSES[kind](spec, token, timeout)
    if isinstance(source, HubSource) and token and not token_may_go_to(source.endpoint()):
        # The Hub client (huggingface_hub) sends the token to the endpoint too: refused before either starts.
        raise ModelStoreError(f"the Hub endpoint {redact_url(source.endpoint())} is not https: the token "
                              "(model_store_hf_token) goes only over https, or to a mirror on this host")
    if isinstance(source, HubSource) and hf_client:
        source.client = {**HubSource.client, **hf_client}
    return source


def redacted(spec: dict) -> dict:
    return {key: value for key, value in spec.items() if key not in ("token",)}


# ---------------------------------------------------------------- plan / fetch / finalize


def batch_label(entries: list[dict]) -> str:
    size = human_bytes(sum(entry["size"] for entry in entries))
    if len(entries) == 1:
        kept = entries[0]["part_bytes"]
        return entries[0]["path"] + f" ({size}" + (f", resuming at {human_bytes(kept)})" if kept else ")")
    names = ", ".join(entry["path"] for entry in entries[:3]) + (", ..." if len(entries) > 3 else "")
    return f"{len(entries)} files: {names} ({size})"


def batches(to_fetch: list[dict], batch_bytes: int) -> list[dict]:
    """Group small files so that one task item moves about batch_bytes; a large file is its own item."""
    groups: list[list[dict]] = []
    for entry in sorted(to_fetch, key=lambda entry: entry["size"]):
        if groups and sum(item["size"] for item in groups[-1]) + entry["size"] <= batch_bytes:
            groups[-1].append(entry)
        else:
            groups.append([entry])
    return [{"paths": [entry["path"] for entry in group], "label": batch_label(group)} for group in groups]


def differs(recorded: dict, item: RemoteFile) -> bool:
    """Whether a recorded file and a listed one differ (sha256 compared only where both have one)."""
    if recorded.get("size") != item.size:
        return True
    return bool(recorded.get("sha256") and item.sha256 and recorded["sha256"] != item.sha256)


class ModelStore:
    """One model directory on the host and the source it comes from."""

    def __init__(
        self,
        dest: str,
        source: Source,
        *,
        reserve_bytes: int = 0,
        retries: int = 3,
        retry_delay: float = 2.0,
        verify_checksums: bool = True,
        streams: int = 0,
        piece_bytes: int = 64 * 1024 * 1024,
        buffer_bytes: int = 128 * 1024 * 1024,
    ) -> None:
        self.streams = streams
        self.piece_bytes = piece_bytes
        self.buffer_bytes = buffer_bytes
        self.progress = Progress(None, 0, 0)
        self.dest = os.path.abspath(dest)
        self.source = source
        self.reserve_bytes = reserve_bytes
        self.retries = retries
        self.retry_delay = retry_delay
        self.verify_checksums = verify_checksums

    # -- plan

    def same_directory_as_source(self) -> bool:
        root = self.source.local_root()
        return root is not None and os.path.realpath(root) == os.path.realpath(self.dest)

    def recorded(self) -> dict | None:
        doc = read_json(os.path.join(self.dest, MANIFEST_FILE))
        return doc if isinstance(doc, dict) else None

    def plan(self, listing: dict | None = None, refresh: bool = False, batch_bytes: int = 256 * 1024**2) -> dict:
        recorded = self.recorded()
        complete_before = bool(recorded and recorded.get("complete"))
        if listing:
            revision, files = listing.get("revision"), parse_manifest(listing)
        elif complete_before and not refresh and recorded.get("source") == redacted(self.source.spec):
            revision, files = recorded.get("revision"), parse_manifest(recorded)  # no network needed
        else:
            revision, files = self.source.listing()
        if not files:
            raise ModelStoreError(
                f"the source lists no files for {self.dest}: check the source and its include/exclude"
            )
        if complete_before:
            self.refuse_replacing_complete(recorded, revision, files)
        verified = load_verified(self.dest)
        to_fetch, conflicts, unverified = [], [], []
        for item in files:
            full = os.path.join(self.dest, item.path)
            if os.path.isfile(full):
                size = os.path.getsize(full)
                if size != item.size:
                    conflicts.append({"file": item.path, "expected_bytes": item.size, "actual_bytes": size})
                elif not still_verified(verified.get(item.path), full, item):
                    unverified.append(item.path)
                continue
            part_bytes = kept_bytes(self.dest, item.path, item.size)
            to_fetch.append({**item.to_dict(), "part_bytes": part_bytes})
        needed = sum(entry["size"] - min(entry["part_bytes"], entry["size"]) for entry in to_fetch)
        free, measured_on = statvfs_free(self.dest)
        return {
            "dest": self.dest,
            "revision": revision,
            "listing": {"revision": revision, "files": [item.to_dict() for item in files]},
            "files_total": len(files),
            "bytes_total": sum(item.size for item in files),
            "to_fetch": to_fetch,
            "batches": batches(to_fetch, batch_bytes),
            "conflicts": conflicts,
            "unverified": unverified,
            "needed_bytes": needed,
            "free_bytes": free,
            "reserve_bytes": self.reserve_bytes,
            "fs_path": measured_on,
            "fs_id": str(os.stat(measured_on).st_dev),
            "complete": complete_before and not to_fetch and not conflicts and not unverified,
        }

    def refuse_replacing_complete(self, recorded: dict, revision: str | None, files: list[RemoteFile]) -> None:
        """A complete copy stays as it is: a source that now differs needs another directory."""
        old = {entry["path"]: entry for entry in recorded.get("files", [])}
        changed = [item.path for item in files if item.path in old and differs(old[item.path], item)]
        if changed:
            raise ModelStoreError(
                f"{self.dest} holds a complete copy of revision {recorded.get('revision')}; the source "
                f"(revision {revision}) differs in {len(changed)} files, first {changed[0]}. It is not "
                "overwritten: fetch the new revision into another path (model.path) or move this one aside"
            )

    @staticmethod
    def conflict_message(dest: str, conflicts: list[dict]) -> str:
        first = conflicts[0]
        return (
            f"{first['file']} in {dest} is {first['actual_bytes']} bytes but the source has "
            f"{first['expected_bytes']} ({len(conflicts)} such files). It is not overwritten: if it is a "
            f"broken copy move it aside (or rename it to {first['file']}{PART_SUFFIX} when it is the start "
            "of the same file, to resume it) and re-run"
        )

    def check_disk(self, plan: dict) -> None:
        if plan["needed_bytes"] + self.reserve_bytes > plan["free_bytes"]:
            raise ModelStoreError(
                f"not enough disk for {self.dest}: need {human_bytes(plan['needed_bytes'])} "
                f"({plan['needed_bytes']} bytes for {len(plan['to_fetch'])} files) + reserve "
                f"{human_bytes(self.reserve_bytes)}, free {human_bytes(plan['free_bytes'])} "
                f"({plan['free_bytes']} bytes) on {plan['fs_path']}. Nothing was written: free space or "
                "choose another model.path"
            )

    # -- fetch

    def fetch(self, plan: dict, only: list[str] | None = None, deadline: float | None = None) -> list[str]:
        """Fetch the missing files (all, or `only`); after `deadline` (monotonic) start no new file.

        Returns the files finished. `self.progress` holds bytes done, rate and ETA of this call.
        """
        if plan["conflicts"]:
            raise ModelStoreError(self.conflict_message(self.dest, plan["conflicts"]))
        self.check_disk(plan)
        entries = [entry for entry in plan["to_fetch"] if only is None or entry["path"] in only]
        items = [RemoteFile.from_dict({k: v for k, v in entry.items() if k != "part_bytes"}) for entry in entries]
        self.progress = Progress(
            os.path.join(self.dest, PROGRESS_FILE), plan["bytes_total"], plan["bytes_total"] - plan["needed_bytes"]
        )
        os.makedirs(self.dest, exist_ok=True)
        if isinstance(self.source, MirrorSource):
            fetched = self.fetch_parallel(items, deadline)
        elif isinstance(self.source, HubSource):
            fetched = self.source.fetch_with_client(self, items, plan["revision"], deadline)
        else:
            fetched = self.fetch_one_by_one(items, deadline)
        self.progress.update(self.progress.moved, final=True)
        return fetched

    def record_fetched(self, item: RemoteFile, sha256: str | None) -> None:
        self.record_method(item, verification_method(item) if self.verify_checksums else "size", sha256)

    def record_method(self, item: RemoteFile, method: str, sha256: str | None) -> None:
        record_verified(self.dest, item.path, method, sha256)

    def fetch_parallel(self, items: list[RemoteFile], deadline: float | None) -> list[str]:
        client = HttpClient(self.source.token, self.source.timeout)
        fetch = ParallelFetch(
            self.dest,
            items,
            self.source.url_of,
            client.open_range,
            streams=self.streams,
            piece_bytes=self.piece_bytes,
            buffer_bytes=self.buffer_bytes,
            retries=self.retries,
            retry_delay=self.retry_delay,
            verify_checksums=self.verify_checksums,
            deadline=deadline,
            on_file_done=self.record_fetched,
        )

        def report() -> None:
            self.progress.update(fetch.received)

        return fetch.run(report)

    def fetch_one_by_one(self, items: list[RemoteFile], deadline: float | None) -> list[str]:
        fetched: list[str] = []
        moved_before = 0
        for item in items:
            if fetched and deadline is not None and time.monotonic() >= deadline:
                break
            full = os.path.join(self.dest, item.path)
            part = full + PART_SUFFIX
            os.makedirs(os.path.dirname(full), exist_ok=True)
            moved_before += self.fetch_one(item, part, moved_before)
            fetched.append(item.path)
        return fetched

    def fetch_one(self, item: RemoteFile, part: str, moved_before: int) -> int:
        """Move one file with the source's own transfer; return the bytes moved."""
        attempt = 0
        kept = os.path.getsize(part) if os.path.exists(part) else 0

        def report(moved: int) -> None:
            self.progress.update(moved_before + moved, item.path)

        while True:
            digest = Digest(item.size, want_git_oid=bool(item.git_oid))
            try:
                hashed = self.source.transfer(item, part, digest, report)
                break
            except TransferInterruptedError as exc:
                attempt += 1
                if attempt > self.retries:
                    have = os.path.getsize(part) if os.path.exists(part) else 0
                    raise ModelStoreError(
                        f"{item.path}: {exc}; gave up after {self.retries} retries with {have} of "
                        f"{item.size} bytes kept in {part}: re-run to resume"
                    ) from exc
                time.sleep(min(self.retry_delay * 2 ** (attempt - 1), 60))
        sha256 = self.verify_part(item, part, digest if hashed else None)
        os.replace(part, os.path.join(self.dest, item.path))
        self.record_fetched(item, sha256)
        return item.size - kept

    def verify_part(self, item: RemoteFile, part: str, digest: Digest | None) -> str | None:
        """Check size and published checksums; return the sha256.

        `digest` holds the bytes hashed during the transfer; without it (rsync wrote the file) the part is
        read once. The sha256 is recorded even when the source publishes none, so that the manifest of this
        directory lets it serve as a verified `type: http` mirror or `local` source later.
        """
        size = os.path.getsize(part)
        if size != item.size:
            raise ModelStoreError(f"{part} is {size} bytes, expected {item.size}: re-run to resume")
        if digest is None:
            digest = Digest(item.size, want_git_oid=bool(item.git_oid))
            digest.update_from_file(part)
        mismatch = digest.mismatch(item) if self.verify_checksums else None
        if mismatch:
            bad = part + ".rejected"
            os.replace(part, bad)
            raise ModelStoreError(
                f"{item.path} downloaded with {mismatch}. The download was set aside as {bad} (remove it); "
                "re-run to fetch it again, and check the source if it happens again"
            )
        return digest.sha256.hexdigest()

    # -- finalize

    def finalize(self, plan: dict) -> bool:
        """Verify files not verified yet (never touching them) and record the complete copy."""
        if plan["to_fetch"] or plan["conflicts"]:
            raise ModelStoreError(f"{self.dest} is not complete yet: {len(plan['to_fetch'])} files to fetch")
        files = [RemoteFile.from_dict(entry) for entry in plan["listing"]["files"]]
        changed = False
        for item in files:
            if item.path not in plan["unverified"]:
                continue
            method = verification_method(item) if self.verify_checksums else "size"
            if method != "size":
                digest = Digest(item.size, want_git_oid=bool(item.git_oid))
                digest.update_from_file(os.path.join(self.dest, item.path))
                mismatch = digest.mismatch(item)
                if mismatch:
                    raise ModelStoreError(
                        f"{item.path} in {self.dest} has {mismatch}. It is not overwritten: move it aside "
                        "and re-run to fetch it again"
                    )
            record_verified(self.dest, item.path, method, item.sha256)
            changed = True
        manifest = {
            "format": MANIFEST_FORMAT,
            "complete": True,
            "source": redacted(self.source.spec),
            "revision": plan["revision"],
            "files": [self.recorded_entry(item) for item in files],
        }
        recorded = self.recorded() or {}
        if {key: recorded.get(key) for key in manifest} != manifest:
            write_json_atomic(os.path.join(self.dest, MANIFEST_FILE), manifest)
            changed = True
        return changed

    def recorded_entry(self, item: RemoteFile) -> dict:
        entry = item.to_dict()
        if not item.sha256:
            record = load_verified(self.dest).get(item.path) or {}
            if record.get("sha256"):
                entry["sha256"] = record["sha256"]
        return entry
