# Test hosts only: never named by a deploy's inventory (scripts/sandbox.sh and inventory/sandbox use podman exec).
"""Run tasks in a local podman container by entering its namespaces instead of through ``podman exec``."""

from __future__ import annotations

DOCUMENTATION = r"""
name: podman_nsenter
short_description: Run tasks in a local podman container by entering its namespaces (the test hosts' connection)
description:
  - The systemd test hosts' connection. A task's commands run in the container's cgroups and in its mount, UTS, IPC,
    network, PID and cgroup namespaces (C(nsenter) on the container's init), with the container's own environment
    and capability bounding set, as root; the container's systemd, files and processes are what the commands see,
    and they see the commands where C(podman exec) puts its own (the container's cgroup, not its init's scope).
  - Every C(podman exec) of C(containers.podman.podman) starts podman, conmon and runc, about 0.1 s of CPU and up to
    half a second of waiting on a busy machine, and a playbook run makes hundreds of them; C(nsenter) costs a few
    milliseconds. The tests' own C(podman exec) calls and C(scripts/sandbox.sh) are unchanged.
  - The container's PID is asked of podman once and kept (with its start time, so a restarted container is asked
    again) in a file per container under the system's temporary directory.
  - Files move through the namespaces on standard input and output (C(cat)), so that paths resolve as the
    container sees them.
options:
  remote_addr:
    description: The container's name.
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: ansible_host
notes:
  - Needs root on the controller (nsenter) and C(setpriv) in the container (util-linux).
"""

import json
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

display = Display()

# linux/capability.h, in bit order: setpriv names the capabilities it keeps.
CAPABILITIES = (
    "chown", "dac_override", "dac_read_search", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap",
    "linux_immutable", "net_bind_service", "net_broadcast", "net_admin", "net_raw", "ipc_lock", "ipc_owner",
    "sys_module", "sys_rawio", "sys_chroot", "sys_ptrace", "sys_pacct", "sys_admin", "sys_boot", "sys_nice",
    "sys_resource", "sys_time", "sys_tty_config", "mknod", "lease", "audit_write", "audit_control", "setfcap",
    "mac_override", "mac_admin", "syslog", "wake_alarm", "block_suspend", "audit_read", "perfmon", "bpf",
    "checkpoint_restore",
)
NAMESPACES = ("--mount", "--uts", "--ipc", "--net", "--pid", "--cgroup")
INIT_SCOPE = "/init.scope"  # where the container's systemd moves itself; podman exec's processes stay above it


def _cgroup_mounts() -> dict[str, str]:
    """Each cgroup hierarchy's mount point, keyed as /proc/PID/cgroup names the hierarchy ("" for cgroup v2)."""
    subsystems = {line.split()[0] for line in Path("/proc/cgroups").read_text().splitlines()[1:] if line.strip()}
    mounts: dict[str, str] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, fs = line.partition(" - ")
        fstype, _, options = fs.split()[:3]
        if fstype == "cgroup2":
            mounts.setdefault("", fields.split()[4])
        elif fstype == "cgroup":
            names = sorted(o for o in options.split(",") if o in subsystems or o.startswith("name="))
            mounts.setdefault(",".join(names), fields.split()[4])
    return mounts


def _container_cgroup_procs(pid: int) -> list[tuple[str, str]]:
    """Per hierarchy, the cgroup.procs of the container's own cgroup and, as a fallback, of its init's."""
    mounts, targets = _cgroup_mounts(), []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        mount = mounts.get(",".join(sorted(controllers.split(","))) if controllers else "")
        if mount is None:
            continue
        own = path[: -len(INIT_SCOPE)] if path.endswith(INIT_SCOPE) else path
        targets.append((f"{mount}{own}/cgroup.procs", f"{mount}{path}/cgroup.procs"))
    return targets


def _join_cgroups(targets: list[tuple[str, str]]) -> None:
    """In the child, before nsenter: into the container's cgroups, as runc exec puts podman exec's processes. On
    cgroup v2 a cgroup with children may take no process: the init's own then."""
    me = str(os.getpid())
    for own, init in targets:
        try:
            Path(own).write_text(me)
        except OSError:
            Path(init).write_text(me)


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (after the parenthesised command name): tells a reused PID apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


class Connection(ConnectionBase):
    """Enter a running container's namespaces for each command."""

    transport = "podman_nsenter"
    has_pipelining = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pid: int | None = None
        self._env: dict[str, str] = {}
        self._bounding_set = ""
        self._cgroups: list[tuple[str, str]] = []

    def _cache_file(self, name: str) -> Path:
        return Path(tempfile.gettempdir()) / f"bws-podman-nsenter-{os.getuid()}" / name

    def _cached_pid(self, name: str) -> int | None:
        try:
            cached = json.loads(self._cache_file(name).read_text())
        except (OSError, ValueError):
            return None
        return cached["pid"] if _start_time(cached["pid"]) == cached["start"] else None

    def _inspect_pid(self, name: str) -> int:
        proc = subprocess.run(["podman", "inspect", "--type", "container", "--format", "{{.State.Pid}}", name],
                              capture_output=True, text=True, check=False)
        pid = int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0
        if pid <= 0:
            raise AnsibleConnectionFailure(f"container {name} is not running: {proc.stderr.strip()}")
        cache = self._cache_file(name)
        cache.parent.mkdir(mode=0o700, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}")
        partial.write_text(json.dumps({"pid": pid, "start": _start_time(pid)}))
        partial.replace(cache)
        return pid

    def _connect(self) -> Connection:
        if self._connected:
            return self
        name = self.get_option("remote_addr")
        pid = self._cached_pid(name) or self._inspect_pid(name)
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            status = Path(f"/proc/{pid}/status").read_text()
            self._cgroups = _container_cgroup_procs(pid)
        except OSError as gone:
            raise AnsibleConnectionFailure(f"container {name} (PID {pid}) went away: {gone}") from gone
        self._env = dict(item.split("=", 1) for item in to_text(environ).split("\0") if "=" in item)
        mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapBnd:")), 16)
        self._bounding_set = ",".join(["-all"] + [f"+{cap}" for bit, cap in enumerate(CAPABILITIES) if mask >> bit & 1])
        self._pid = pid
        display.vvv(f"ESTABLISH PODMAN NSENTER CONNECTION TO {name} (PID {pid})", host=name)
        self._connected = True
        return self

    def _argv(self, argv: list[str]) -> list[str]:
        return ["nsenter", f"--target={self._pid}", *NAMESPACES, "--",
                "setpriv", f"--bounding-set={self._bounding_set}", "--", *argv]

    def _run(self, argv: list[str], in_data: bytes | None = None) -> tuple[int, bytes, bytes]:
        display.vvv(f"EXEC {shlex.join(argv)}", host=self.get_option("remote_addr"))
        cgroups = self._cgroups
        proc = subprocess.run(self._argv(argv), input=in_data, capture_output=True, env=self._env, cwd="/",
                              check=False, preexec_fn=lambda: _join_cgroups(cgroups))
        return proc.returncode, proc.stdout, proc.stderr

    def exec_command(self, cmd: str, in_data: bytes | None = None, sudoable: bool = True) -> tuple[int, bytes, bytes]:
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        return self._run(shlex.split(to_text(cmd, errors="surrogate_or_strict")), in_data)

    def put_file(self, in_path: str, out_path: str) -> None:
        super().put_file(in_path, out_path)
        with open(to_bytes(in_path, errors="surrogate_or_strict"), "rb") as source:
            rc, _, err = self._run(["/bin/sh", "-c", 'cat > "$1"', "put_file", out_path], source.read())
        if rc != 0:
            raise AnsibleError(f"failed to put {in_path} at {out_path}: {to_text(err).strip()}")

    def fetch_file(self, in_path: str, out_path: str) -> None:
        super().fetch_file(in_path, out_path)
        rc, out, err = self._run(["cat", in_path])
        if rc != 0:
            raise AnsibleError(f"failed to fetch {in_path}: {to_text(err).strip()}")
        with open(to_bytes(out_path, errors="surrogate_or_strict"), "wb") as target:
            target.write(out)

    def close(self) -> None:
        self._connected = False
