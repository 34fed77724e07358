"""Model store: sources (hf, http, local, nfs, rsync), resumable transfers, plan / fetch / finalize.

Standard library only (runs on the target). A transfer writes `<file>.part` next to the final name and
renames it only after its size and published checksum match; an interrupted transfer resumes from the
bytes already in the `.part` file (HTTP Range, seek for local copies, `rsync --append-verify`). Nothing
that is complete is ever removed or overwritten: a file that disagrees with the source stops the run.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from ansible.module_utils.bws_model import (
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    PART_SUFFIX,
    PROGRESS_FILE,
    Digest,
    ModelStoreError,
    RemoteFile,
    filter_files,
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


class TransferInterruptedError(Exception):
    """A transfer stopped early for a reason worth retrying (network)."""


# ---------------------------------------------------------------- progress


class Progress:
    """Writes `.model_store/progress.json` at most once a second: what is moving, how fast, how long."""

    def __init__(self, path: str | None, total_bytes: int) -> None:
        self.path = path
        self.total = total_bytes
        self.done_before = 0
        self.started = time.monotonic()
        self.last_write = 0.0

    def update(self, name: str, file_done: int, file_size: int, moved: int, final: bool = False) -> None:
        now = time.monotonic()
        if not self.path or (not final and now - self.last_write < 1.0):
            return
        self.last_write = now
        elapsed = max(now - self.started, 1e-6)
        rate = moved / elapsed
        done = self.done_before + moved
        write_json_atomic(
            self.path,
            {
                "file": name,
                "file_bytes_done": file_done,
                "file_bytes_total": file_size,
                "bytes_done": done,
                "bytes_total": self.total,
                "rate_bytes_per_s": int(rate),
                "eta_s": int((self.total - done) / rate) if rate > 0 else None,
                "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
        )


# ---------------------------------------------------------------- HTTP


class _RedirectKeepingAuthOnSameHost(urllib.request.HTTPRedirectHandler):
    """Follow redirects (the Hub sends LFS files to a CDN) but never send the token to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: PLR0917 (urllib's signature)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        old_host = urllib.parse.urlsplit(req.full_url).netloc
        if new is not None and urllib.parse.urlsplit(newurl).netloc != old_host:
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_RedirectKeepingAuthOnSameHost())


def http_error_text(exc: urllib.error.HTTPError, url: str) -> str:
    detail = exc.headers.get("X-Error-Message", "") if exc.headers else ""
    text = f"HTTP {exc.code} from {url}" + (f" ({detail})" if detail else "")
    if exc.code in (401, 403):
        text += (
            ": not authorised; for a gated or private Hub repository accept its terms and set "
            "model_store_hf_token (model_store_http_token for a mirror)"
        )
    elif exc.code == 404:
        text += ": not found; check the repository, revision, URL or manifest name in the profile's source"
    return text


def retryable_http(exc: urllib.error.HTTPError) -> bool:
    return exc.code == 429 or exc.code >= 500


class HttpClient:
    def __init__(self, token: str | None, timeout: float) -> None:
        self.token = token
        self.timeout = timeout

    def request(self, url: str, extra: dict[str, str] | None = None) -> http.client.HTTPResponse:
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(extra or {})})
        if self.token:
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

    def download(self, url: str, part: str, expected: RemoteFile, report: Callable[[int, int], None]) -> None:
        """Append the missing bytes of expected to part, resuming at its current size."""
        offset = os.path.getsize(part) if os.path.exists(part) else 0
        if offset >= expected.size:
            return
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            response = self.request(url, headers)
        except urllib.error.HTTPError as exc:
            if retryable_http(exc):
                raise TransferInterruptedError(http_error_text(exc, url)) from exc
            raise ModelStoreError(http_error_text(exc, url)) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise TransferInterruptedError(f"cannot reach {url}: {exc}") from exc
        with response:
            mode = "ab"
            if offset and response.status == 200:
                offset, mode = 0, "wb"  # the server ignored Range: start again rather than corrupt the file
            elif response.status == 206:
                check_content_range(response.headers.get("Content-Range"), offset, expected, url)
            copy_stream(response, part, mode, (offset, expected.size), report)


def check_content_range(header: str | None, offset: int, expected: RemoteFile, url: str) -> None:
    match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", (header or "").strip())
    if not match or int(match.group(1)) != offset:
        raise ModelStoreError(f"{url} answered Range bytes={offset}- with Content-Range {header!r}")
    if match.group(3) != "*" and int(match.group(3)) != expected.size:
        raise ModelStoreError(
            f"{url} is {match.group(3)} bytes but the listing says {expected.size}: the source changed "
            "while fetching; re-run to list it again"
        )


def copy_stream(stream, part: str, mode: str, span: tuple[int, int], report: Callable[[int, int], None]) -> None:
    """Copy stream into part from byte span[0] up to span[1] (the file size), reporting progress."""
    offset, size = span
    done = offset
    try:
        with open(part, mode) as out:
            while done < size:
                chunk = stream.read(min(CHUNK, size - done))
                if not chunk:
                    break
                out.write(chunk)
                done += len(chunk)
                report(done, done - offset)
    except (OSError, http.client.HTTPException) as exc:
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename == part:
            raise ModelStoreError(f"cannot write {part}: {exc}") from exc
        name = os.path.basename(part)
        raise TransferInterruptedError(f"transfer of {name} stopped at {done} bytes: {exc}") from exc
    if done < size:
        raise TransferInterruptedError(f"transfer of {os.path.basename(part)} stopped at {done} of {size} bytes")


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

    def transfer(self, item: RemoteFile, revision: str | None, part: str, report: Callable[[int, int], None]):
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

    def transfer(self, item: RemoteFile, revision: str | None, part: str, report: Callable[[int, int], None]):
        repo = urllib.parse.quote(self.spec["repo"], safe="/")
        path = urllib.parse.quote(item.path, safe="/")
        url = f"{self.endpoint()}/{repo}/resolve/{revision}/{path}"
        HttpClient(self.token, self.timeout).download(url, part, item, report)


class MirrorSource(Source):
    def base(self) -> str:
        return str(self.spec["url"]).rstrip("/") + "/"

    def list_files(self) -> tuple[str | None, list[RemoteFile]]:
        manifest = str(self.spec.get("manifest") or MANIFEST_FILE)
        doc, _ = HttpClient(self.token, self.timeout).get_json(self.base() + manifest)
        revision = doc.get("revision") if isinstance(doc, dict) else None
        return (revision if isinstance(revision, str) else None), parse_manifest(doc)

    def transfer(self, item: RemoteFile, revision: str | None, part: str, report: Callable[[int, int], None]):
        url = self.base() + urllib.parse.quote(item.path, safe="/")
        HttpClient(self.token, self.timeout).download(url, part, item, report)


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

    def transfer(self, item: RemoteFile, revision: str | None, part: str, report: Callable[[int, int], None]):
        offset = os.path.getsize(part) if os.path.exists(part) else 0
        source_path = os.path.join(self.local_root(), item.path)
        try:
            with open(source_path, "rb") as stream:
                stream.seek(offset)
                copy_stream(stream, part, "ab", (offset, item.size), report)
        except FileNotFoundError as exc:
            raise ModelStoreError(f"{source_path} disappeared from the source") from exc


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

    def transfer(self, item: RemoteFile, revision: str | None, part: str, report: Callable[[int, int], None]):
        # --append-verify resumes at the part's size and checks the whole file when done
        self.run(["--append-verify", "--", self.src() + item.path, part])
        size = os.path.getsize(part)
        report(size, size)


SOURCE_CLASSES: dict[str, type[Source]] = {
    "hf": HubSource,
    "http": MirrorSource,
    "local": LocalSource,
    "nfs": LocalSource,
    "rsync": RsyncSource,
}


def make_source(spec: dict, token: str | None, timeout: float) -> Source:
    kind = validate_source(spec)["type"]
    return SOURCE_CLASSES[kind](spec, token, timeout)


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
    ) -> None:
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
            part = full + PART_SUFFIX
            part_bytes = os.path.getsize(part) if os.path.isfile(part) else 0
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

    def fetch(self, plan: dict, only: list[str] | None = None) -> list[str]:
        if plan["conflicts"]:
            raise ModelStoreError(self.conflict_message(self.dest, plan["conflicts"]))
        self.check_disk(plan)
        entries = [entry for entry in plan["to_fetch"] if only is None or entry["path"] in only]
        progress = Progress(
            os.path.join(self.dest, PROGRESS_FILE),
            sum(entry["size"] - entry["part_bytes"] for entry in entries),
        )
        fetched = []
        for entry in entries:
            item = RemoteFile.from_dict({key: entry[key] for key in entry if key != "part_bytes"})
            self.fetch_one(item, plan["revision"], progress)
            fetched.append(item.path)
        return fetched

    def fetch_one(self, item: RemoteFile, revision: str | None, progress: Progress) -> None:
        full = os.path.join(self.dest, item.path)
        part = full + PART_SUFFIX
        os.makedirs(os.path.dirname(full), exist_ok=True)
        attempt = 0

        def report(done: int, moved: int) -> None:
            progress.update(item.path, done, item.size, moved)

        while True:
            try:
                self.source.transfer(item, revision, part, report)
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
        progress.done_before += item.size
        sha256 = self.verify_part(item, part)
        os.replace(part, full)
        record_verified(self.dest, item.path, verification_method(item) if self.verify_checksums else "size", sha256)

    def verify_part(self, item: RemoteFile, part: str) -> str | None:
        """Check size and published checksums; return the sha256 (computed when checksums are on).

        The sha256 is recorded even when the source publishes none, so that the manifest of this
        directory lets it serve as a verified `type: http` mirror or `local` source later.
        """
        size = os.path.getsize(part)
        if size != item.size:
            raise ModelStoreError(f"{part} is {size} bytes, expected {item.size}: re-run to resume")
        if not self.verify_checksums:
            return item.sha256
        digest = Digest(item.size, want_git_oid=bool(item.git_oid))
        digest.update_from_file(part)
        mismatch = digest.mismatch(item)
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
