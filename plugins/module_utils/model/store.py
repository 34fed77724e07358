"""Model store: listings, local state and completeness checks for model directories.

Shared by plugins/modules/model_fetch.py and plugins/modules/model_check.py. Standard library only (runs on the target,
Python >= 3.10). Also a small command line: `python3 store.py write-manifest DIR` writes the manifest
that lets a plain web server act as a `type: http` mirror of DIR.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import struct
import sys
import threading
import time
import urllib.error
from dataclasses import asdict, dataclass, field

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
STATE_DIR = ".model_store"
MANIFEST_FILE = STATE_DIR + "/manifest.json"
VERIFIED_FILE = STATE_DIR + "/verified.json"
PROGRESS_FILE = STATE_DIR + "/progress.json"
PART_SUFFIX = ".part"
# where the huggingface_hub client keeps its metadata and partial downloads inside a model directory
HF_CLIENT_DIR = ".cache/huggingface"
MANIFEST_FORMAT = 1
SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024
HASH_CHUNK = 8 * 1024 * 1024
# transfers run in threads: one writer at a time for the state files of a directory
_STATE_LOCK = threading.RLock()

FETCH_HINT = (
    "run `ansible-playbook playbooks/fetch_models.yml -e engine_profile=<profile>` to fetch or resume it "
    "(partial files are kept and resumed)"
)


class ModelStoreError(Exception):
    """An error whose message says what is wrong and what to do."""


@dataclass
class RemoteFile:
    """One file of a model repository as the source lists it."""

    path: str
    size: int
    sha256: str | None = None
    git_oid: str | None = None

    @classmethod
    def from_dict(cls, data: dict) -> RemoteFile:
        if not isinstance(data, dict) or "path" not in data or "size" not in data:
            raise ModelStoreError(f"listing entry {data!r} needs 'path' and 'size'")
        sha256 = data.get("sha256")
        if sha256 is not None and not is_hex_digest(sha256, 64):
            raise ModelStoreError(f"listing entry {data['path']!r}: sha256 {sha256!r} is not 64 hex digits")
        return cls(
            path=safe_relpath(data["path"]),
            size=non_negative_int(data["size"], data["path"]),
            sha256=sha256.lower() if sha256 else None,
            git_oid=data.get("git_oid") or None,
        )

    def to_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass
class Problem:
    """Why one file keeps a model directory from being complete."""

    file: str
    reason: str
    expected_bytes: int | None = None
    actual_bytes: int | None = None
    detail: str = field(default="", compare=False)

    def to_dict(self) -> dict:
        return {
            "file": self.file,
            "reason": self.reason,
            "expected_bytes": self.expected_bytes,
            "actual_bytes": self.actual_bytes,
        }


def is_hex_digest(value: object, length: int) -> bool:
    hex_digits = "0123456789abcdefABCDEF"
    return isinstance(value, str) and len(value) == length and all(c in hex_digits for c in value)


def non_negative_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelStoreError(f"listing entry {what!r}: size {value!r} is not a non-negative integer")
    return value


def safe_relpath(path: object) -> str:
    """Return a listing path if it stays inside the model directory; refuse anything else."""
    if not isinstance(path, str) or not path or "\x00" in path or "\\" in path:
        raise ModelStoreError(f"refusing listing path {path!r}: not a plain relative path")
    parts = path.split("/")
    if path.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise ModelStoreError(f"refusing listing path {path!r}: it would leave the model directory")
    if parts[0] == STATE_DIR or path.endswith(PART_SUFFIX) or path.startswith(HF_CLIENT_DIR + "/"):
        raise ModelStoreError(f"refusing listing path {path!r}: the name is reserved for the model store")
    return path


def human_bytes(count: int | float) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


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


# ---------------------------------------------------------------- listings from sources


def parse_hf_tree(entries: object) -> list[RemoteFile]:
    """Parse the Hugging Face `/api/models/{repo}/tree/{rev}?recursive=true` answer.

    LFS files carry `lfs: {oid: <sha256>, size}`; other files carry their git blob id as `oid`.
    """
    if not isinstance(entries, list):
        raise ModelStoreError("the Hub tree API did not answer with a list of entries")
    files = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("type") != "file":
            continue
        lfs = entry.get("lfs") or {}
        sha256 = lfs.get("oid") if isinstance(lfs, dict) else None
        size = lfs.get("size", entry.get("size")) if isinstance(lfs, dict) and lfs else entry.get("size")
        oid = None if sha256 else entry.get("oid")
        files.append(
            RemoteFile(
                path=safe_relpath(entry.get("path")),
                size=non_negative_int(size, str(entry.get("path"))),
                sha256=sha256.lower() if is_hex_digest(sha256, 64) else None,
                git_oid=oid if is_hex_digest(oid, 40) else None,
            )
        )
    return files


def parse_link_next(header: str | None) -> str | None:
    """Return the `rel="next"` URL of an RFC 8288 Link header (the Hub paginates trees this way)."""
    if not header:
        return None
    for part in header.split(","):
        segments = [segment.strip() for segment in part.split(";")]
        url = segments[0]
        if (
            url.startswith("<")
            and url.endswith(">")
            and any(segment.replace(" ", "") in ('rel="next"', "rel=next") for segment in segments[1:])
        ):
            return url[1:-1]
    return None


def parse_manifest(doc: object) -> list[RemoteFile]:
    """Parse a model store manifest: `{"format": 1, "files": [{"path", "size", "sha256"?}]}`."""
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), list):
        raise ModelStoreError('the manifest is not a JSON object with a "files" list')
    return [RemoteFile.from_dict(entry) for entry in doc["files"]]


def parse_rsync_list(text: str) -> list[RemoteFile]:
    """Parse `rsync --list-only -r --no-h` output into regular files (directories and links skipped)."""
    files = []
    for line in text.splitlines():
        fields = line.split(None, 4)
        if len(fields) < 5 or not fields[0] or fields[0][0] != "-":
            continue
        size = int(fields[1].replace(",", "").replace(".", ""))
        path = fields[4]
        if path.split("/")[0] == STATE_DIR or path.endswith(PART_SUFFIX) or path.startswith(HF_CLIENT_DIR + "/"):
            continue
        files.append(RemoteFile(path=safe_relpath(path), size=size))
    return files


def walk_local(root: str) -> list[RemoteFile]:
    """List the regular files under root (model store state and partial files excluded). A symbolic link anywhere
    in the tree is refused, naming each: the store copies what it lists into a directory the engines read, and a link
    (`x -> /etc/shadow`) would carry a file of the host's choosing there."""
    files, links = [], []
    for directory, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(directory, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d != STATE_DIR]
        elif rel_dir == ".cache":
            dirnames[:] = [d for d in dirnames if d != "huggingface"]  # the Hub client's own state
        links += [os.path.join(directory, d) for d in dirnames if os.path.islink(os.path.join(directory, d))]
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(directory, d)))
        for name in sorted(filenames):
            full = os.path.join(directory, name)
            if os.path.islink(full):
                links.append(full)
                continue
            if name.endswith(PART_SUFFIX) or not os.path.isfile(full):
                continue
            rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
            files.append(RemoteFile(path=safe_relpath(rel), size=os.path.getsize(full)))
    if links:
        shown = ", ".join(f"{link} -> {os.readlink(link)}" for link in sorted(links)[:10])
        more = f" and {len(links) - 10} more" if len(links) > 10 else ""
        raise ModelStoreError(f"{root} holds {len(links)} symbolic link(s), which the model store never follows or "
                              f"copies: {shown}{more}. Replace each with the file itself (or remove it).")
    return files


def filter_files(files: list[RemoteFile], include: list[str], exclude: list[str]) -> list[RemoteFile]:
    """Keep files matching any include pattern (all when none) and no exclude pattern."""
    kept = []
    for item in files:
        if include and not any(fnmatch.fnmatch(item.path, pattern) for pattern in include):
            continue
        if any(fnmatch.fnmatch(item.path, pattern) for pattern in exclude):
            continue
        kept.append(item)
    return kept


# ---------------------------------------------------------------- hashing


class Digest:
    """sha256 and, when the source gives one, the git blob id of a file, computed while it streams."""

    def __init__(self, size: int, want_git_oid: bool) -> None:
        self.sha256 = hashlib.sha256()
        self.git = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False) if want_git_oid else None

    def update(self, data: bytes) -> None:
        self.sha256.update(data)
        if self.git is not None:
            self.git.update(data)

    def update_from_file(self, path: str, limit: int | None = None) -> int:
        done = 0
        with open(path, "rb") as handle:
            while limit is None or done < limit:
                chunk = handle.read(HASH_CHUNK if limit is None else min(HASH_CHUNK, limit - done))
                if not chunk:
                    break
                self.update(chunk)
                done += len(chunk)
        return done

    def mismatch(self, expected: RemoteFile) -> str | None:
        """Describe how the data differs from what the source published, or None when it matches."""
        if expected.sha256 and self.sha256.hexdigest() != expected.sha256:
            return f"sha256 {self.sha256.hexdigest()} but the source publishes {expected.sha256}"
        if expected.git_oid and self.git is not None and self.git.hexdigest() != expected.git_oid:
            return f"git blob id {self.git.hexdigest()} but the source publishes {expected.git_oid}"
        return None


def verification_method(expected: RemoteFile) -> str:
    if expected.sha256:
        return "sha256"
    return "git-oid" if expected.git_oid else "size"


# ---------------------------------------------------------------- local state


def read_json(path: str) -> object | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ModelStoreError(f"cannot read {path}: {exc}") from exc


def write_json_atomic(path: str, doc: object) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(doc, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


def file_stamp(path: str) -> dict | None:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def load_verified(root: str) -> dict:
    doc = read_json(os.path.join(root, VERIFIED_FILE))
    return doc if isinstance(doc, dict) else {}


def record_verified(root: str, rel: str, method: str, sha256: str | None) -> None:
    """Remember that rel was verified, keyed by size and mtime so that a changed file is checked again."""
    with _STATE_LOCK:
        verified = load_verified(root)
        stamp = file_stamp(os.path.join(root, rel))
        if stamp is None:
            return
        verified[rel] = {**stamp, "method": method, "sha256": sha256}
        write_json_atomic(os.path.join(root, VERIFIED_FILE), verified)


def still_verified(record: object, path: str, expected: RemoteFile) -> bool:
    if not isinstance(record, dict) or record.get("size") != expected.size:
        return False
    if file_stamp(path) != {"size": record.get("size"), "mtime_ns": record.get("mtime_ns")}:
        return False
    return not expected.sha256 or record.get("sha256") == expected.sha256


def statvfs_free(path: str) -> tuple[int, str]:
    """Free bytes for an unprivileged writer... and the existing directory they were measured on."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    stat = os.statvfs(probe)
    return stat.f_bavail * stat.f_frsize, probe


def filesystem_id(path: str) -> str:
    return str(os.stat(path).st_dev)


# ---------------------------------------------------------------- completeness check


def safetensors_expected_size(path: str) -> int:
    """The size a safetensors file must have: 8 + header length + end of the last tensor's data."""
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ModelStoreError("shorter than the 8-byte safetensors header length")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > SAFETENSORS_MAX_HEADER:
            raise ModelStoreError(f"header length {header_len} is not plausible")
        raw = handle.read(header_len)
    if len(raw) < header_len:
        raise ModelStoreError("ends inside its JSON header")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise ModelStoreError(f"has an unreadable JSON header ({exc})") from exc
    data_end = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if not isinstance(offsets, list) or len(offsets) != 2:
            raise ModelStoreError(f"tensor {name!r} has no data_offsets")
        data_end = max(data_end, int(offsets[1]))
    return 8 + header_len + data_end


def index_shards(root: str) -> list[str]:
    """The shard files that model.safetensors.index.json names, in order."""
    doc = read_json(os.path.join(root, INDEX_FILE))
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise ModelStoreError(f"{INDEX_FILE} has no weight_map object")
    shards: list[str] = []
    for shard in doc["weight_map"].values():
        if shard not in shards:
            shards.append(safe_relpath(shard))
    return shards


def manifest_files(root: str) -> tuple[dict | None, list[RemoteFile]]:
    doc = read_json(os.path.join(root, MANIFEST_FILE))
    if doc is None:
        return None, []
    return doc if isinstance(doc, dict) else None, parse_manifest(doc)


def check_file(root: str, rel: str, expected_size: int | None) -> Problem | None:
    full = os.path.join(root, rel)
    part = full + PART_SUFFIX
    if not os.path.isfile(full):
        if os.path.isfile(part):
            kept = os.path.getsize(part)
            return Problem(rel, "partial", expected_size, kept, "only a partial download exists")
        return Problem(rel, "missing", expected_size, None)
    actual = os.path.getsize(full)
    if expected_size is None and rel.endswith(".safetensors"):
        try:
            expected_size = safetensors_expected_size(full)
        except ModelStoreError as exc:
            return Problem(rel, "unreadable", None, actual, str(exc))
    if expected_size is not None and actual < expected_size:
        return Problem(rel, "short", expected_size, actual)
    if expected_size is not None and actual > expected_size:
        return Problem(rel, "too_long", expected_size, actual)
    return None


def check_model_dir(root: str, require_index: bool = False) -> dict:
    """Check a model directory without the network.

    Expected sizes come from the model store manifest when there is one, else from each shard's own
    safetensors header. Returns complete, problems (first one first), total_bytes, files_checked, msg.
    """
    problems: list[Problem] = []
    if not os.path.isdir(root):
        problem = Problem(".", "missing", None, None, "the model directory does not exist")
        return summarize(root, [problem], 0, 0)
    try:
        manifest, listed = manifest_files(root)
    except ModelStoreError as exc:
        manifest, listed = None, []
        problems.append(Problem(MANIFEST_FILE, "unreadable", None, None, str(exc)))
    sizes = {item.path: item.size for item in listed}
    wanted: list[str] = [item.path for item in listed]
    if manifest is not None and not manifest.get("complete", False):
        problems.append(Problem(MANIFEST_FILE, "incomplete", None, None, "the last fetch did not finish"))
    if CONFIG_FILE not in wanted:
        wanted.insert(0, CONFIG_FILE)
    if os.path.isfile(os.path.join(root, INDEX_FILE)):
        if INDEX_FILE not in wanted:
            wanted.append(INDEX_FILE)
        try:
            wanted += [shard for shard in index_shards(root) if shard not in wanted]
        except ModelStoreError as exc:
            problems.append(Problem(INDEX_FILE, "unreadable", None, None, str(exc)))
    elif require_index:
        problems.append(Problem(INDEX_FILE, "missing", sizes.get(INDEX_FILE), None))
    elif not listed and not any(name.endswith(".safetensors") for name in os.listdir(root)):
        problems.append(Problem("*.safetensors", "missing", None, None, "no weights in the directory"))
    total = 0
    for rel in wanted:
        problem = check_file(root, rel, sizes.get(rel))
        if problem is None:
            total += os.path.getsize(os.path.join(root, rel))
        elif problem not in problems:
            problems.append(problem)
    return summarize(root, problems, total, len(wanted))


REASON_TEXT = {
    "missing": "is missing",
    "partial": "is only partly downloaded",
    "short": "is truncated",
    "too_long": "is longer than expected",
    "unreadable": "cannot be read",
    "incomplete": "says the last fetch did not finish",
}


def describe(root: str, problem: Problem) -> str:
    text = f"{problem.file} {REASON_TEXT.get(problem.reason, problem.reason)} in {root}"
    if problem.expected_bytes is not None or problem.actual_bytes is not None:
        expected = "?" if problem.expected_bytes is None else f"{problem.expected_bytes}"
        actual = "none" if problem.actual_bytes is None else f"{problem.actual_bytes}"
        text += f" (expected {expected} bytes, found {actual})"
    if problem.detail:
        text += f": {problem.detail}"
    return text


def summarize(root: str, problems: list[Problem], total: int, checked: int) -> dict:
    if not problems:
        msg = f"{root} is complete: {checked} files, {human_bytes(total)}"
    else:
        first = problems[0]
        if first.reason in ("too_long", "unreadable") and first.file.endswith(".safetensors"):
            todo = "move the file aside (it is not overwritten) and " + FETCH_HINT
        else:
            todo = FETCH_HINT
        more = f" ({len(problems) - 1} more problems)" if len(problems) > 1 else ""
        msg = f"{describe(root, first)}{more}; {todo}"
    return {
        "complete": not problems,
        "problems": [problem.to_dict() for problem in problems],
        "total_bytes": total,
        "files_checked": checked,
        "msg": msg,
    }


# ---------------------------------------------------------------- manifest writer (command line)


def build_manifest(root: str, source: dict | None = None, revision: str | None = None) -> dict:
    files = []
    for item in walk_local(root):
        digest = Digest(item.size, want_git_oid=False)
        digest.update_from_file(os.path.join(root, item.path))
        files.append({"path": item.path, "size": item.size, "sha256": digest.sha256.hexdigest()})
    return {
        "format": MANIFEST_FORMAT,
        "complete": True,
        "source": source or {"type": "local", "path": os.path.abspath(root)},
        "revision": revision,
        "files": files,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] != "write-manifest":
        sys.stderr.write(f"usage: {argv[0]} write-manifest MODEL_DIR\n")
        return 2
    root = argv[2]
    write_json_atomic(os.path.join(root, MANIFEST_FILE), build_manifest(root))
    sys.stdout.write(f"wrote {os.path.join(root, MANIFEST_FILE)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
