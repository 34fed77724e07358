"""Write a release's directories and files in one pass, and read back what the switch decides on (stdlib only; runs
on the target). Used by the engine_release module.

One call instead of a copy/file/stat task per path: over SSH or a container connection every task is a round
trip, and a deploy that changes nothing should cost a handful of them.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import shlex
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ansible_collections.blackwell.serving.plugins.module_utils.release.state import state_json_text


class ReleaseFilesError(Exception):
    """A path could not be written or read, or a validator refused a file; the message says which."""


@dataclass(frozen=True)
class Wanted:
    """A directory (content None) or file as it must be on the host."""

    path: str
    owner: str
    group: str
    mode: int
    content: bytes | None = None
    secret: bool = False
    validate: str = ""
    validate_requires: str = ""


def parse_mode(mode: str | int) -> int:
    if isinstance(mode, int):
        return mode
    try:
        return int(mode, 8)
    except ValueError as exc:
        raise ReleaseFilesError(f"mode {mode!r} is not an octal mode such as '0640'") from exc


def ids(owner: str, group: str) -> tuple[int | None, int | None]:
    """uid and gid of the names, None for a name that does not exist (yet: check mode before the user task ran)."""
    try:
        uid: int | None = pwd.getpwnam(owner).pw_uid
    except KeyError:
        uid = None
    try:
        gid: int | None = grp.getgrnam(group).gr_gid
    except KeyError:
        gid = None
    return uid, gid


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def attributes_differ(st: os.stat_result, want: Wanted) -> list[str]:
    uid, gid = ids(want.owner, want.group)
    problems = []
    if uid is None or st.st_uid != uid:
        problems.append("owner")
    if gid is None or st.st_gid != gid:
        problems.append("group")
    if stat.S_IMODE(st.st_mode) != want.mode:
        problems.append("mode")
    return problems


def _chown_chmod(path: str, want: Wanted) -> None:
    uid, gid = ids(want.owner, want.group)
    if uid is None or gid is None:
        missing = want.owner if uid is None else want.group
        raise ReleaseFilesError(f"{path}: owner or group {missing!r} does not exist on this host")
    os.chown(path, uid, gid)
    os.chmod(path, want.mode)


def ensure_directory(want: Wanted, check_mode: bool) -> bool:
    """Create the directory or fix its owner and mode; whether anything (would have) changed."""
    st = _lstat(want.path)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise ReleaseFilesError(f"{want.path} exists and is not a directory")
    if st is not None and not attributes_differ(st, want):
        return False
    if not check_mode:
        if st is None:
            os.makedirs(want.path, exist_ok=True)
        _chown_chmod(want.path, want)
        if st is None:
            fsync_directory(os.path.dirname(want.path.rstrip("/")) or "/")
    return True


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ReleaseFilesError(f"cannot read {path}: {exc.strerror}") from exc


def validate(want: Wanted, temporary: str) -> None:
    """Run the file's validator on the written temporary file (`%s` is its path), as the copy module does."""
    if not want.validate or (want.validate_requires and not os.path.exists(want.validate_requires)):
        return
    if "%s" not in want.validate:
        raise ReleaseFilesError(f"validate for {want.path} must contain %s (the file to check): {want.validate!r}")
    argv = shlex.split(want.validate.replace("%s", shlex.quote(temporary)))
    try:
        result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReleaseFilesError(f"validator of {want.path} could not run ({' '.join(argv)}): {exc}") from exc
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        raise ReleaseFilesError(f"{want.path} was refused by `{want.validate}` (rc={result.returncode}): {output}")


def write_atomically(want: Wanted) -> None:
    """Write to a temporary file beside the target, validate it, then rename it over the target."""
    directory = os.path.dirname(want.path) or "."
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(want.path)}.", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(want.content or b"")
            out.flush()
            os.fsync(out.fileno())
        _chown_chmod(temporary, want)
        validate(want, temporary)
        os.replace(temporary, want.path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    fsync_directory(directory)


def fsync_directory(path: str) -> None:
    """A rename is on disk only once its directory is synced: after a power cut the release is whole or absent."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_file(want: Wanted, check_mode: bool) -> tuple[bool, dict[str, str] | None]:
    """Make the file hold `content` with its owner and mode; (changed, diff entry or None for a secret)."""
    st = _lstat(want.path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ReleaseFilesError(f"{want.path} exists and is not a regular file")
    before = read_bytes(want.path) if st is not None else None
    if before == want.content and st is not None:
        if not attributes_differ(st, want):
            return False, None
        if not check_mode:
            _chown_chmod(want.path, want)
        return True, None
    if not check_mode:
        write_atomically(want)
    if want.secret:
        return True, None
    return True, {
        "before_header": want.path if before is not None else f"{want.path} (absent)",
        "after_header": want.path,
        "before": (before or b"").decode("utf-8", "replace"),
        "after": (want.content or b"").decode("utf-8", "replace"),
    }


def sha256_of(path: str) -> str:
    content = read_bytes(path)
    return hashlib.sha256(content).hexdigest() if content is not None else ""


def read_json(path: str) -> Any:
    """The parsed file, None when it does not exist; a file that is not JSON is an error naming it."""
    content = read_bytes(path)
    if content is None:
        return None
    try:
        return json.loads(content)
    except ValueError as exc:
        raise ReleaseFilesError(f"{path} is not valid JSON ({exc}); fix or remove it") from exc


CREATED_KEY = "created"


def utc_text(epoch: float) -> str:
    """A moment as the releases record it: ISO 8601, UTC, seconds (2026-12-04T18:40:12Z)."""
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_now_text() -> str:
    """Now, as a release records when it was created (utc_text)."""
    return utc_text(time.time())


def with_created(content: str, existing: bytes | None, now: str) -> str:
    """release.json's content with the time its release was first written (``created``): kept from the file on the
    host, so that writing the same release again changes nothing; ``now`` for a new release. A release written
    before ``created`` was recorded stays without it (its time is unknown), and content that is not a JSON object
    or sets ``created`` itself is left as it is. Written as Ansible's to_nice_json writes, with its newline."""
    try:
        metadata = json.loads(content)
    except ValueError:
        return content
    if not isinstance(metadata, dict) or CREATED_KEY in metadata:
        return content
    created: Any = now
    if existing is not None:
        try:
            before = json.loads(existing)
        except ValueError:
            return content
        created = before.get(CREATED_KEY) if isinstance(before, dict) else None
        if not created:
            return content
    return state_json_text({**metadata, CREATED_KEY: created})


def describe_directory(path: str) -> str:
    st = _lstat(path)
    if st is None:
        return ""
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"directory {owner}:{group} {stat.S_IMODE(st.st_mode):04o}\n"


def list_releases(releases_dir: str) -> list[dict[str, Any]]:
    """The release directories, as ansible.builtin.find lists them (path, mtime), for pruning."""
    try:
        entries = list(os.scandir(releases_dir))
    except FileNotFoundError:
        return []
    return [{"path": e.path, "mtime": e.stat(follow_symlinks=False).st_mtime}
            for e in entries if e.is_dir(follow_symlinks=False)]


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if result.returncode != 0:
        raise ReleaseFilesError(f"{' '.join(argv)} failed (rc={result.returncode}): {result.stderr.strip()}")


def ensure_service_account(name: str, group: str, home: str, shell: str, check_mode: bool) -> list[str]:
    """A system group and a system user in it, with no login and no home directory of its own (the unit's
    StateDirectory= creates it). An existing user gets its group, home and shell corrected, as
    ansible.builtin.user would. Returns what was (would be) done."""
    done = []
    try:
        grp.getgrnam(group)
    except KeyError:
        done.append(f"group {group} created")
        if not check_mode:
            _run(["groupadd", "--system", group])
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        done.append(f"user {name} created")
        if not check_mode:
            _run(["useradd", "--system", "--gid", group, "--home-dir", home, "--no-create-home",
                  "--shell", shell, name])
        return done
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        gid = None
    changes = []
    if account.pw_gid != gid:
        changes += ["--gid", group]
    if account.pw_dir != home:
        changes += ["--home", home]
    if account.pw_shell != shell:
        changes += ["--shell", shell]
    if changes:
        done.append(f"user {name} modified ({' '.join(changes[::2])})")
        if not check_mode:
            _run(["usermod", *changes, name])
    return done


@dataclass
class Outcome:
    changed_paths: list[str]
    diff: list[dict[str, str]]


def apply(directories: list[Wanted], files: list[Wanted], check_mode: bool) -> Outcome:
    """Directories first (parents before children, in the order given), then files in order."""
    outcome = Outcome(changed_paths=[], diff=[])
    for want in directories:
        before = describe_directory(want.path)
        if ensure_directory(want, check_mode):
            outcome.changed_paths.append(want.path)
            outcome.diff.append({"before_header": want.path, "after_header": want.path, "before": before,
                                 "after": f"directory {want.owner}:{want.group} {want.mode:04o}\n"})
    for want in files:
        changed, diff = ensure_file(want, check_mode)
        if changed:
            outcome.changed_paths.append(want.path)
            if diff:
                outcome.diff.append(diff)
    return outcome
