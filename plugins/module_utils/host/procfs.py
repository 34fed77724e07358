# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""Reading /proc and cgroup files (standard library only: runs on the target).

Every reader tolerates a process that exits while it is being read: it returns what it could read (or
None) instead of raising, because on a busy host that is the normal case, not an error.
"""

from __future__ import annotations

import fnmatch
import os
import pwd
import re
from dataclasses import dataclass, field
from typing import Any

# A Python interpreter as argv[0]: python, python3, python3.12, python3.12t, pypy3 ...
_PYTHON_RE = re.compile(r"^(python|pypy)(\d+(\.\d+)*t?)?$")
# Interpreter options that take no value and options that take one (python3 --help).
_PY_FLAGS = {"-b", "-bb", "-B", "-d", "-E", "-i", "-I", "-O", "-OO", "-P", "-q", "-s", "-S", "-u", "-v", "-x"}
_PY_FLAGS_WITH_VALUE = {"-W", "-X"}
# The longest process title a result carries.
TITLE_MAX = 100


@dataclass
class Proc:
    """One process as read from /proc at one moment."""

    pid: int
    ppid: int
    starttime: int
    state: str
    uid: int | None
    comm: str
    argv: list[str]
    fds: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    # (hierarchy, path) per line of /proc/<pid>/cgroup; the hierarchy is "" for v2, else its controllers.
    cgroup_entries: list[tuple[str, str]] = field(default_factory=list)
    # The /proc/<pid>/ns/pid link ("pid:[4026531836]"); None where it cannot be read (another user's process, to a
    # root without CAP_SYS_PTRACE in a container).
    pidns: str | None = None
    # How many PID namespaces the process is in, counted from this procfs's (the NSpid: line of its status, which
    # stays readable where the link is not); None where the kernel or the read gives none.
    pidns_depth: int | None = None

    @property
    def title(self) -> str:
        """How the process is named in a result: see ``title_of``; ``[comm]`` for one without argv[0] (a kernel
        thread)."""
        return (title_of(self.argv[0]) if self.argv else "") or f"[{title_of(self.comm)}]"

    def brief(self) -> dict[str, Any]:
        """What a result may say of the process: pid, parent, user and title. Never its arguments: a secret given to
        a stranger's process on its command line (``--api-key KEY``) would reach the controller's output."""
        return {"pid": self.pid, "ppid": self.ppid, "user": user_name(self.uid), "title": self.title}


def title_of(argv0: str) -> str:
    """A process title as a result may show it: argv[0] as written up to its first whitespace (a process title such
    as ``sglang::scheduler_TP0`` is argv[0]), the basename where argv[0] is a Python interpreter.

    A title set with setproctitle is one NUL-padded argv[0] and may hold a whole command line
    (``serve.py --api-key KEY``): cut at its first space, its arguments never show.
    """
    words = argv0.split(None, 1)
    if not words:
        return ""
    base = os.path.basename(words[0])
    return (base if _PYTHON_RE.match(base) else words[0])[:TITLE_MAX]


def user_name(uid: int | None) -> str:
    if uid is None:
        return "an unknown user"
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _read(path: str, binary: bool = False) -> Any:
    try:
        with open(path, "rb" if binary else "r", **({} if binary else {"encoding": "utf-8", "errors": "replace"})) as f:
            return f.read()
    except OSError:
        return None


def list_pids(proc_root: str = "/proc") -> list[int]:
    try:
        return sorted(int(name) for name in os.listdir(proc_root) if name.isdigit())
    except OSError:
        return []


def parse_stat(text: str) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) from /proc/<pid>/stat; comm may hold spaces and ')': split at the last ')'."""
    _, sep, rest = text.rpartition(")")
    if not sep:
        return None
    fields = rest.split()
    if len(fields) < 20:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def parse_cmdline(raw: bytes) -> list[str]:
    """argv from /proc/<pid>/cmdline. A title set with setproctitle may be one string padded with NULs."""
    args = raw.decode("utf-8", "replace").split("\0")
    while args and args[-1] == "":
        args.pop()
    return [a.rstrip() if i == 0 else a for i, a in enumerate(args)]


def parse_uid(status_text: str) -> int | None:
    for line in status_text.splitlines():
        if line.startswith("Uid:"):
            parts = line.split()
            return int(parts[1]) if len(parts) > 1 else None
    return None


def parse_nspid_depth(status_text: str) -> int | None:
    """The number of PIDs on the NSpid: line of /proc/<pid>/status: 1 in this procfs's namespace, more when nested."""
    for line in status_text.splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) - 1 or None
    return None


def parse_cgroup_entries(text: str) -> list[tuple[str, str]]:
    """(hierarchy, path) from /proc/<pid>/cgroup: v1 (``4:memory:/x``, ``1:name=systemd:/x``), v2 (``0::/x``)."""
    entries = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2]:
            entries.append((parts[1], parts[2]))
    return entries


def parse_cgroup_file(text: str) -> list[str]:
    """Cgroup paths from /proc/<pid>/cgroup, every hierarchy."""
    return [path for _, path in parse_cgroup_entries(text)]


def read_link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def read_fds(pid: int, proc_root: str = "/proc") -> list[str]:
    fd_dir = f"{proc_root}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return []
    targets = []
    for name in names:
        try:
            targets.append(os.readlink(f"{fd_dir}/{name}"))
        except OSError:
            continue
    return targets


def read_mapped_paths(pid: int, proc_root: str = "/proc") -> set[str]:
    """File paths mapped into a process (the 6th column of /proc/<pid>/maps, " (deleted)" stripped)."""
    text = _read(f"{proc_root}/{pid}/maps")
    paths: set[str] = set()
    if not text:
        return paths
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            path = parts[5]
            if path.endswith(" (deleted)"):
                path = path[: -len(" (deleted)")]
            paths.add(path)
    return paths


def read_proc(pid: int, proc_root: str = "/proc", with_fds: bool = True) -> Proc | None:
    stat_text = _read(f"{proc_root}/{pid}/stat")
    stat = parse_stat(stat_text) if stat_text else None
    if stat is None:
        return None
    state, ppid, starttime = stat
    raw = _read(f"{proc_root}/{pid}/cmdline", binary=True)
    comm = (_read(f"{proc_root}/{pid}/comm") or "").strip()
    status_text = _read(f"{proc_root}/{pid}/status") or ""
    entries = parse_cgroup_entries(_read(f"{proc_root}/{pid}/cgroup") or "")
    return Proc(
        pid=pid,
        ppid=ppid,
        starttime=starttime,
        state=state,
        uid=parse_uid(status_text),
        comm=comm,
        argv=parse_cmdline(raw) if raw else [],
        fds=read_fds(pid, proc_root) if with_fds else [],
        cgroups=[path for _, path in entries],
        cgroup_entries=entries,
        pidns=read_link(f"{proc_root}/{pid}/ns/pid"),
        pidns_depth=parse_nspid_depth(status_text),
    )


def snapshot(proc_root: str = "/proc") -> dict[int, Proc]:
    procs = {}
    for pid in list_pids(proc_root):
        proc = read_proc(pid, proc_root)
        if proc is not None:
            procs[pid] = proc
    return procs


def is_alive(pid: int, starttime: int, proc_root: str = "/proc") -> bool:
    """The same process (pid and start time) still exists and has not finished exiting.

    A zombie has exited, but a multi-threaded process (every CUDA process) shows its main thread as a
    zombie while its other threads still tear down and still hold its files: it counts as alive until
    no other thread is left in /proc/<pid>/task.
    """
    text = _read(f"{proc_root}/{pid}/stat")
    stat = parse_stat(text) if text else None
    if stat is None or stat[2] != starttime:
        return False
    if stat[0] not in ("Z", "X", "x"):
        return True
    try:
        return any(tid != str(pid) for tid in os.listdir(f"{proc_root}/{pid}/task"))
    except OSError:
        return False


def ancestors(pid: int, procs: dict[int, Proc]) -> set[int]:
    seen: set[int] = set()
    current = procs.get(pid)
    while current is not None and current.ppid > 0 and current.ppid not in seen:
        seen.add(current.ppid)
        current = procs.get(current.ppid)
    return seen


def descendants(roots: set[int], procs: dict[int, Proc]) -> dict[int, int]:
    """Descendant pid -> the root it descends from."""
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: dict[int, int] = {}
    for root in roots:
        stack = list(children.get(root, []))
        while stack:
            pid = stack.pop()
            if pid in found or pid in roots:
                continue
            found[pid] = root
            stack.extend(children.get(pid, []))
    return found


def unit_cgroup_pids(cgroup_root: str, cgroup_path: str) -> set[int]:
    """PIDs in a unit's cgroup and its sub-cgroups, v2 (unified) and v1 (name=systemd) layouts."""
    pids: set[int] = set()
    rel = cgroup_path.strip("/")
    if not rel:
        return pids
    for base in (cgroup_root, os.path.join(cgroup_root, "unified"), os.path.join(cgroup_root, "systemd")):
        top = os.path.join(base, rel)
        for dirpath, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                text = _read(os.path.join(dirpath, "cgroup.procs")) or ""
                pids.update(int(x) for x in text.split() if x.isdigit())
    return pids


@dataclass(frozen=True)
class ProcessIdentity:
    """What engine patterns are matched against; see ``identity()``."""

    title: str
    prog: str
    arg: str


def identity(argv: list[str]) -> ProcessIdentity | None:
    """The (title, program, first argument) of a command line.

    * ``title`` is argv[0] as written (a process title such as ``sglang::scheduler_TP0``).
    * ``prog`` is the basename of argv[0], unless argv[0] is a Python interpreter: then the interpreter's own
      options are skipped and ``prog`` is the module of ``-m MODULE`` or the basename of the script.
    * ``arg`` is the argument right after ``prog`` ('' when none).

    ``python3 -m sglang.launch_server --x`` -> ('python3', 'sglang.launch_server', '--x');
    ``/opt/sglang/bin/sglang serve`` -> ('/opt/sglang/bin/sglang', 'sglang', 'serve');
    ``/v/bin/python3 /v/bin/vllm serve m`` -> ('/v/bin/python3', 'vllm', 'serve').
    """
    if not argv or not argv[0]:
        return None
    title = argv[0]
    base = os.path.basename(title)
    rest = argv[1:]
    if _PYTHON_RE.match(base):
        i = 0
        while i < len(rest):
            opt = rest[i]
            if opt in _PY_FLAGS:
                i += 1
            elif opt in _PY_FLAGS_WITH_VALUE:
                i += 2
            elif opt == "-m" and i + 1 < len(rest):
                return ProcessIdentity(title, rest[i + 1], rest[i + 2] if i + 2 < len(rest) else "")
            elif opt == "-c":
                return ProcessIdentity(title, base, "-c")
            elif not opt.startswith("-"):
                return ProcessIdentity(title, os.path.basename(opt), rest[i + 1] if i + 1 < len(rest) else "")
            else:
                break
        return ProcessIdentity(title, base, rest[0] if rest else "")
    return ProcessIdentity(title, base, rest[0] if rest else "")


def match_pattern(ident: ProcessIdentity, pattern: str) -> bool:
    """Match one engine pattern (shell wildcards, case-sensitive).

    ``PROG ARG`` (one space) matches ``prog`` and ``arg``; a single word matches the process title or
    ``prog``. The rest of the command line is never looked at, so ``journalctl -u sglang`` or
    ``grep sglang::`` match nothing.
    """
    head, sep, tail = pattern.strip().partition(" ")
    if sep:
        return fnmatch.fnmatchcase(ident.prog, head) and fnmatch.fnmatchcase(ident.arg, tail.strip())
    return fnmatch.fnmatchcase(ident.title, head) or fnmatch.fnmatchcase(ident.prog, head)


def first_matching_pattern(argv: list[str], patterns: list[str]) -> str | None:
    ident = identity(argv)
    if ident is None:
        return None
    for pattern in patterns:
        if match_pattern(ident, pattern):
            return pattern
    return None


# ---------------------------------------------------------------- where a process runs (cgroups)

# Cgroup path components that mean "a container or pod": podman (cgroupfs and systemd managers), Docker,
# Kubernetes, CRI-O, containerd, systemd-nspawn/machined, LXC.
CONTAINER_COMPONENTS = (
    "libpod-*",
    "libpod_parent",
    "docker",
    "docker-*",
    "docker.service",
    "kubepods*",
    "machine.slice",
    "machine-*.scope",
    "crio-*",
    "cri-containerd-*",
    "containerd",
    "lxc.payload*",
    "lxc.monitor*",
)
# Components that mean "a user's login session or their own service manager" (systemd's layout).
SESSION_COMPONENTS = ("user.slice", "user-*.slice", "session-*.scope", "user@*.service")


def _matches(component: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(component, p) for p in patterns)


def _components(path: str) -> list[str]:
    return [c for c in path.strip("/").split("/") if c]


def own_cgroup_roots(entries: list[tuple[str, str]]) -> dict[str, str]:
    """hierarchy -> this process's cgroup root: its own path up to its deepest container component, else "/".

    On a host the root is "/"; inside a container that shares the host's cgroup namespace (cgroup v1, or
    podman's cgroupfs manager) it is the container's own cgroup, such as ``/libpod_parent/libpod-<id>``,
    so that the container's units read as they would on a host.
    """
    roots = {}
    for hierarchy, path in entries:
        parts = _components(path)
        cut = 0
        for i, component in enumerate(parts):
            if _matches(component, CONTAINER_COMPONENTS):
                cut = i + 1
        roots[hierarchy] = "/" + "/".join(parts[:cut])
    return roots


def relative_cgroup(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` ("/..." form), or None when it lies outside it."""
    if path.startswith("/..") or "/../" in path:
        return None  # outside this cgroup namespace
    parts, base = _components(path), _components(root)
    if parts[: len(base)] != base:
        return None
    return "/" + "/".join(parts[len(base) :])


@dataclass(frozen=True)
class Placement:
    """Where a process runs, judged below a cgroup root: ``kind`` is system, session, container or outside."""

    kind: str
    path: str


def placement(entries: list[tuple[str, str]], roots: dict[str, str]) -> Placement:
    """The strongest of the process's cgroup paths: outside > container > session > system.

    Every hierarchy counts, since on cgroup v1 a container may show only in some of them.
    """
    rank = {"system": 0, "session": 1, "container": 2, "outside": 3}
    best = Placement("system", entries[0][1] if entries else "/")
    for hierarchy, path in entries:
        root = roots.get(hierarchy, "/")
        rel = relative_cgroup(path, root)
        if rel is None:
            found = Placement("outside", path)
        elif any(_matches(c, CONTAINER_COMPONENTS) for c in _components(rel)):
            found = Placement("container", path)
        elif any(_matches(c, SESSION_COMPONENTS) for c in _components(rel)):
            found = Placement("session", path)
        else:
            found = Placement("system", path)
        if rank[found.kind] > rank[best.kind]:
            best = found
    return best


def in_system_unit(entries: list[tuple[str, str]], roots: dict[str, str], unit: str) -> bool:
    """The unit is a component of a cgroup path below the root, outside containers and user sessions.

    So ``/system.slice/sglang.service/payload`` is in ``sglang.service``, but a user's own
    ``/user.slice/user-1000.slice/user@1000.service/app.slice/sglang.service`` is not.
    """
    if placement(entries, roots).kind != "system":
        return False
    for hierarchy, path in entries:
        rel = relative_cgroup(path, roots.get(hierarchy, "/"))
        if rel is not None and unit in _components(rel):
            return True
    return False
