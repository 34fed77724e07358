#!/usr/bin/env python3
"""MODEL MIRROR TEST DOUBLE: a tiny stand-in for the Hugging Face Hub and for a plain HTTP model mirror.

It is not the Hub. It serves the model directories under --root (`<root>/<owner>/<name>/...`) with the
endpoints the model store uses, with the Hub's answer shapes:

    GET /api/models/{owner}/{name}/revision/{rev}          -> {"id", "sha", "siblings": [{"rfilename"}]}
    GET /api/models/{owner}/{name}/tree/{rev}?recursive=true -> [{"type": "file", "path", "size", "oid",
                                                                  "lfs": {"oid": sha256, "size"}}]  (paged)
    GET|HEAD /{owner}/{name}/resolve/{rev}/{path}        -> the file (302 to H/cdn/... with --redirect-host H)
    GET|HEAD /cdn/{owner}/{name}/{path}                    -> the file, as the Hub's CDN (no auth asked)
    GET /mirror/{owner}/{name}/{path}                      -> the file, as a plain web server would serve it

`resolve` answers carry the headers the huggingface_hub client reads (huggingface_hub 2.4.0,
src/huggingface_hub/file_download.py get_hf_file_metadata / _get_metadata_or_catch_error and
utils/_http.py _httpx2_follow_hub_redirects_with_backoff / hf_raise_for_status): `X-Repo-Commit` (the commit;
the client fails without it), `ETag` (git blob id for regular files), and for LFS files (*.safetensors, *.bin,
*.pt) `X-Linked-Etag` (the sha256) and `X-Linked-Size`; with --redirect-host the client reads these from the
302 itself and follows `Location` to the other host without the token, as it does for the Hub's CDN. Errors
carry `X-Error-Code` / `X-Error-Message` as the Hub's do (`GatedRepo` with --gated, `EntryNotFound`).

The Hub's own CLI, `hf download <repo> --revision R --local-dir D` with HF_ENDPOINT pointing here, needs nothing
more (huggingface_hub 2.4.0, src/huggingface_hub/_snapshot_download.py snapshot_download: `repo_info` is the
`revision` call above, `list_repo_tree` the `tree` call (with `expand=false`, ignored here), then
`hf_hub_download` of each file through `resolve`); its lookup of `/api/agent-harnesses`
(utils/_detect_agent.py, for its hints) gets a 404, which it ignores. The ids a listing or a `resolve` answer
carries are computed once per file (keyed by its stat), as the Hub records them when a file is pushed.

Files honour `Range: bytes=N-` / `bytes=N-M` (206 + Content-Range). Faults, to test for real:
    --cut-after N --cut-count K   the first K file bodies longer than N stop after N bytes (connection closed)
    --token T                     API and resolve answer 401 without `Authorization: Bearer T`
    --gated                       a gated repository: the API answers anyone, files need the token, and a 401
                                  says `X-Error-Code: GatedRepo` (as the Hub answers for gated repositories)
    --page-size P                 tree pages of P entries, linked with `Link: <...>; rel="next"`
    --no-range                    ignore Range and always answer 200 with the whole file
Every request is logged as one JSON line to --log (method, path, range, status, bytes, auth) so that tests
can assert what was asked for. The first line on stdout is `listening on 127.0.0.1:<port>`.
Stdlib only.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_SUFFIXES = (".safetensors", ".bin", ".pt")


def fake_commit(repo: str, revision: str) -> str:
    if re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    return hashlib.sha1(f"{repo}@{revision}".encode(), usedforsecurity=False).hexdigest()


def repo_files(repo_dir: str) -> list[str]:
    found = []
    for directory, dirnames, filenames in os.walk(repo_dir):
        dirnames[:] = sorted(d for d in dirnames if d != ".model_store")
        for name in sorted(filenames):
            found.append(os.path.relpath(os.path.join(directory, name), repo_dir).replace(os.sep, "/"))
    return found


# The Hub stores a file's ids when it is pushed and answers listings and HEADs from that record; the double
# computes them once per file content (keyed by the file's stat) so that its answers, like the Hub's, do not
# cost a read of the file each (2 GiB of shards took 6.8 s per listing and 1.7 s per HEAD before).
_ENTRIES: dict[tuple, dict] = {}
_ENTRIES_LOCK = threading.Lock()
_HASH_BLOCK = 8 * 1024 * 1024


def tree_entry(repo_dir: str, rel: str) -> dict:
    full = os.path.join(repo_dir, rel)
    st = os.stat(full)
    key = (os.path.realpath(full), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    with _ENTRIES_LOCK:
        known = _ENTRIES.get(key)
    if known is None:
        git = hashlib.sha1(b"blob %d\0" % st.st_size, usedforsecurity=False)
        sha256 = hashlib.sha256()
        size = 0
        with open(full, "rb") as handle:  # in blocks: the double's memory stays small
            while block := handle.read(_HASH_BLOCK):
                git.update(block)
                sha256.update(block)
                size += len(block)
        known = {"size": size, "oid": git.hexdigest(), "sha256": sha256.hexdigest()}
        if size == st.st_size:
            with _ENTRIES_LOCK:
                _ENTRIES[key] = known
    entry = {"type": "file", "path": rel, "size": known["size"], "oid": known["oid"]}
    if rel.endswith(LFS_SUFFIXES):
        entry["lfs"] = {"oid": known["sha256"], "size": known["size"], "pointerSize": 134}
    return entry


def hub_headers(repo_dir: str, rel: str, commit: str) -> dict[str, str]:
    """The metadata headers of a Hub `resolve` answer (see the module docstring for where the client reads them)."""
    entry = tree_entry(repo_dir, rel)
    headers = {"X-Repo-Commit": commit, "ETag": f'"{entry["oid"]}"'}
    if "lfs" in entry:
        headers["X-Linked-Etag"] = f'"{entry["lfs"]["oid"]}"'
        headers["X-Linked-Size"] = str(entry["size"])
    return headers


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cuts_left = args.cut_count
        self.lock = threading.Lock()

    def take_cut(self, body_bytes: int) -> int | None:
        """Bytes after which to cut this body, for the first --cut-count bodies longer than --cut-after."""
        with self.lock:
            cut_after = self.args.cut_after
            if self.cuts_left > 0 and cut_after is not None and body_bytes > cut_after:
                self.cuts_left -= 1
                return self.args.cut_after
        return None

    def log(self, record: dict) -> None:
        if not self.args.log:
            return
        with self.lock, open(self.args.log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


class Handler(BaseHTTPRequestHandler):
    server_version = "model-mirror-double/1"
    protocol_version = "HTTP/1.1"

    @property
    def state(self) -> State:
        return self.server.state  # type: ignore[attr-defined]

    def log_message(self, *args: object) -> None:  # quiet: the JSON log is the record
        return

    def record(self, status: int, sent: int = 0) -> None:
        self.state.log(
            {
                "method": self.command,
                "path": self.path,
                "range": self.headers.get("Range"),
                "status": status,
                "bytes": sent,
                "auth": self.headers.get("Authorization") is not None,
            }
        )

    def reply_json(self, status: int, doc: object, extra: dict[str, str] | None = None) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
        self.record(status, len(body))

    def not_found(self, text: str) -> None:
        self.reply_json(404, {"error": text}, {"X-Error-Message": text})

    def authorised(self) -> bool:
        token = self.state.args.token
        if token and self.headers.get("Authorization") != f"Bearer {token}":
            if self.state.args.gated:
                text = "Access to this model is restricted. You must have access to it and be authenticated."
                headers = {"X-Error-Code": "GatedRepo", "X-Error-Message": text}
            else:
                text = "Invalid credentials"
                headers = {"X-Error-Message": text}
            self.reply_json(401, {"error": text}, headers)
            return False
        return True

    def do_HEAD(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in url.path.split("/")[1:]]
        if len(parts) >= 5 and parts[2] == "resolve":
            if self.authorised():
                self.resolve(parts, head=True)
            return
        if len(parts) >= 4 and parts[0] == "cdn":
            self.serve_file(parts[1], parts[2], "/".join(parts[3:]), head=True)
            return
        self.reply_json(404, {"error": "Not found"})

    def resolve(self, parts: list[str], head: bool = False) -> None:
        rel = "/".join(parts[4:])
        repo_dir = self.repo_dir(parts[0], parts[1])
        full = os.path.join(repo_dir, rel) if repo_dir else ""
        if not repo_dir or not os.path.isfile(full) or ".." in rel.split("/"):
            self.reply_json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
            return
        hub = hub_headers(repo_dir, rel, fake_commit(f"{parts[0]}/{parts[1]}", parts[3]))
        if self.state.args.redirect_host and "X-Linked-Etag" in hub:
            port = self.server.server_address[1]
            location = "/cdn/" + urllib.parse.quote(f"{parts[0]}/{parts[1]}/{rel}")
            self.send_response(302)
            self.send_header("Location", f"http://{self.state.args.redirect_host}:{port}{location}")
            self.send_header("Content-Length", "0")
            for key, value in hub.items():
                self.send_header(key, value)
            self.end_headers()
            self.record(302)
            return
        self.serve_file(parts[0], parts[1], rel, head=head, extra=hub)

    def repo_dir(self, owner: str, name: str) -> str | None:
        path = os.path.join(self.state.args.root, owner, name)
        return path if os.path.isdir(path) else None

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in url.path.split("/")[1:]]
        if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] in ("revision", "tree"):
            if self.state.args.gated or self.authorised():
                self.api(parts[2], parts[3], parts[4], parts[5], urllib.parse.parse_qs(url.query))
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            if self.authorised():
                self.resolve(parts)
            return
        if len(parts) >= 4 and parts[0] in ("cdn", "mirror"):
            self.serve_file(parts[1], parts[2], "/".join(parts[3:]))
            return
        self.reply_json(404, {"error": "Not found"})

    def api(self, owner: str, name: str, kind: str, revision: str, query: dict) -> None:
        repo_dir = self.repo_dir(owner, name)
        if repo_dir is None:
            self.not_found("Repository not found")
            return
        repo = f"{owner}/{name}"
        files = repo_files(repo_dir)
        if kind == "revision":
            siblings = [{"rfilename": rel} for rel in files]
            doc = {"id": repo, "sha": fake_commit(repo, revision), "siblings": siblings}
            self.reply_json(200, doc)
            return
        entries = [tree_entry(repo_dir, rel) for rel in files]
        start = int(query.get("cursor", ["0"])[0])
        size = self.state.args.page_size or len(entries) or 1
        page = entries[start : start + size]
        extra = {}
        if start + size < len(entries):
            next_url = f"/api/models/{repo}/tree/{revision}?recursive=true&cursor={start + size}"
            extra["Link"] = f'<{next_url}>; rel="next"'
        self.reply_json(200, page, extra)

    def serve_file(
        self, owner: str, name: str, rel: str, head: bool = False, extra: dict[str, str] | None = None
    ) -> None:
        repo_dir = self.repo_dir(owner, name)
        full = os.path.realpath(os.path.join(repo_dir or "/nonexistent", rel))
        inside = repo_dir is not None and full.startswith(os.path.realpath(repo_dir) + os.sep)
        if not inside or not os.path.isfile(full):
            self.not_found("Entry not found")
            return
        size = os.path.getsize(full)
        start, end, status = 0, size - 1, 200
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "") or "")
        if match and not self.state.args.no_range:
            start = int(match.group(1))
            end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                self.record(416)
                return
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if head:
            self.record(status)
            return
        cut = self.state.take_cut(end - start + 1)
        sent = 0
        with open(full, "rb") as handle:
            handle.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                chunk = handle.read(min(65536, remaining))
                if cut is not None:
                    chunk = chunk[: max(cut - sent, 0)]
                if not chunk:
                    break
                self.wfile.write(chunk)
                sent += len(chunk)
                remaining -= len(chunk)
        self.record(status, sent)
        if cut is not None and remaining > 0:
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Model mirror / Hub test double (not the Hub)")
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log")
    parser.add_argument("--token")
    parser.add_argument("--cut-after", type=int)
    parser.add_argument("--cut-count", type=int, default=1)
    parser.add_argument("--page-size", type=int, default=0)
    parser.add_argument("--redirect-host", help="answer resolve with a 302 to http://<this host>:<port>/cdn/...")
    parser.add_argument("--no-range", action="store_true")
    parser.add_argument("--gated", action="store_true", help="401 answers say X-Error-Code: GatedRepo")
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.state = State(args)  # type: ignore[attr-defined]
    sys.stdout.write(f"listening on 127.0.0.1:{server.server_address[1]}\n")
    sys.stdout.flush()
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
