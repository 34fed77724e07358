"""Release engine processes, GPUs and /dev/shm (the logic of the gpu_release module).

Stdlib only; runs on the target. The module (library/gpu_release.py) is argument handling and output; what to stop,
how, and what the GPUs show afterwards is decided here, so that the deploy's preflight and teardown share it.
"""

from __future__ import annotations

import fnmatch
import os
import pwd
import shutil
import signal
import stat
import time
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.bws_gpu_health import gpu_key, wedged_gpus, wedged_text
from ansible.module_utils.bws_nvidia import (
    QUERY_APPS_ARGS,
    QUERY_GPU_ARGS,
    NvidiaError,
    apps_from_csv,
    attach_minors,
    driver_loaded,
    gpus_from_csv,
    read_driver_gpus,
    resolve_nvidia_smi,
    run_queries_together,
    run_query,
    timed_runner,
)
from ansible.module_utils.bws_procfs import (
    Proc,
    ancestors,
    descendants,
    first_matching_pattern,
    identity,
    in_system_unit,
    is_alive,
    own_cgroup_roots,
    parse_cgroup_entries,
    parse_nspid_depth,
    placement,
    read_link,
    read_mapped_paths,
    snapshot,
    unit_cgroup_pids,
)
from ansible.module_utils.bws_release_state import read_serving, record_stopped
from ansible.module_utils.bws_systemd import ENABLED_STATES, UNIT_PROPERTIES, parse_show, systemctl_here

ARGUMENT_SPEC: dict[str, Any] = {
    "units": {"type": "list", "elements": "str", "default": []},
    "patterns": {
        "type": "list",
        "elements": "str",
        "default": [
            "sglang::*",
            "sglang.launch_server",
            "sglang serve",
            "VLLM::*",
            "vllm serve",
            "vllm.entrypoints.openai.api_server",
        ],
    },
    "protected": {
        "type": "list",
        "elements": "str",
        "default": [
            "nvidia-persistenced",
            "nv-hostengine",
            "nvidia-dcgm",
            "dcgm-exporter",
            "dcgmi",
            "nv-fabricmanager",
            "nvidia-fabricmanager",
            "Xorg",
            "X",
            "Xwayland",
            "gnome-shell",
            "gdm*",
            "sddm",
            "nvidia-smi",
            "systemd",
            "init",
            "sshd",
        ],
    },
    "extra_protected": {"type": "list", "elements": "str", "default": []},
    "grace_s": {"type": "float", "default": 10.0},
    "timeout_s": {"type": "float", "default": 30.0},
    "settle_s": {"type": "float", "default": 3.0},
    "poll_interval_ms": {"type": "int", "default": 25},
    "gpus": {"type": "list", "elements": "str", "default": []},
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
    "driver_proc_dir": {"type": "path", "default": "/proc/driver/nvidia"},
    "dev_dir": {"type": "path", "default": "/dev"},
    "cgroup_root": {"type": "path", "default": "/sys/fs/cgroup"},
    "shm_dir": {"type": "path", "default": "/dev/shm"},
    "shm_patterns": {
        "type": "list",
        "elements": "str",
        "default": ["nccl-*", "psm_*", "sem.mp-*", "torch_*", "multi_tokenizer_*"],
    },
    "shm_owner": {"type": "list", "elements": "str", "default": []},
    "clean_shm": {"type": "bool", "default": True},
    "fail_on_foreign_holders": {"type": "bool", "default": False},
    "scope": {"type": "str", "default": "default", "choices": ["default", "host"]},
    "service_users": {"type": "list", "elements": "str", "default": ["sglang", "vllm"]},
    "stop_units": {"type": "bool", "default": False},
    "disable_units": {"type": "bool", "default": True},
    "report_only": {"type": "bool", "default": False},
    "nvidia_smi_timeout_s": {"type": "float", "default": 10.0},
    "idle_memory_mib": {"type": "int", "default": 256},
    "wedged_window_s": {"type": "float", "default": 1.5},
    "state_dir": {"type": "path"},
}
SMI_TIMEOUT_SETTING = "nvidia_smi_timeout_s"


class ReleaseError(Exception):
    pass


# ---------------------------------------------------------------- GPU side


class Gpu:
    """nvidia-smi access; ``available`` is False (with ``reason``) where there is no driver or no tool."""

    def __init__(self, module: AnsibleModule, nvidia_smi: str, driver_proc_dir: str) -> None:
        self.module = module
        self.timeout_s = module.params["nvidia_smi_timeout_s"]
        self._run = timed_runner(self.timeout_s, SMI_TIMEOUT_SETTING)
        self.error = ""
        self.driver_loaded = driver_loaded(driver_proc_dir)
        self.tool = resolve_nvidia_smi(nvidia_smi)
        self.driver_gpus = read_driver_gpus(driver_proc_dir)
        self.reason = ""
        if self.tool is None:
            state = "loaded" if self.driver_loaded else f"not loaded ({driver_proc_dir} absent)"
            self.reason = f"nvidia-smi not found ({nvidia_smi}); NVIDIA kernel driver {state}"

    @property
    def available(self) -> bool:
        return self.tool is not None and not self.reason

    def query_gpus(self) -> list[dict[str, Any]]:
        gpus = gpus_from_csv(run_query(self.tool or "", QUERY_GPU_ARGS, self._run))
        attach_minors(gpus, self.driver_gpus)
        return gpus

    def query_apps(self) -> list[dict[str, Any]]:
        return apps_from_csv(run_query(self.tool or "", QUERY_APPS_ARGS, self._run))

    def query_both(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        gpu_csv, apps_csv = run_queries_together(
            self.tool or "", [QUERY_GPU_ARGS, QUERY_APPS_ARGS], self.timeout_s, SMI_TIMEOUT_SETTING
        )
        gpus = gpus_from_csv(gpu_csv)
        attach_minors(gpus, self.driver_gpus)
        return gpus, apps_from_csv(apps_csv)

    def first_look(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if not self.available:
            return [], []
        try:
            return self.query_both()
        except NvidiaError as exc:
            if exc.kind in ("no_driver", "missing_tool", "timeout"):
                self.reason = str(exc)
                self.error = str(exc) if exc.kind == "timeout" else ""
                return [], []
            raise


def gpu_selected(gpu: dict[str, Any], wanted: list[str]) -> bool:
    if not wanted:
        return True
    keys = {str(gpu["index"]), gpu["uuid"] or "", gpu["bus_id"] or "", gpu.get("pci_bus_id") or ""}
    return any(w in keys or w.lower() in keys for w in wanted)


def device_files(proc: Proc, dev_dir: str) -> tuple[set[int], bool, bool]:
    """(GPU minors held, holds nvidia-uvm, holds any nvidia device file) from a process's open files."""
    prefix = dev_dir.rstrip("/") + "/nvidia"
    minors: set[int] = set()
    uvm = False
    anything = False
    for target in proc.fds:
        if not target.startswith(prefix):
            continue
        anything = True
        rest = target[len(prefix) :]
        if rest.isdigit():
            minors.add(int(rest))
        elif rest == "-uvm":
            uvm = True
    return minors, uvm, anything


# ---------------------------------------------------------------- selection


def names_of(proc: Proc) -> set[str]:
    names = {proc.comm}
    ident = identity(proc.argv)
    if ident is not None:
        names |= {ident.title, os.path.basename(ident.title), ident.prog}
    return {n for n in names if n}


def protected_name(proc: Proc, protected: list[str]) -> str | None:
    for name in names_of(proc):
        for pattern in protected:
            if fnmatch.fnmatchcase(name, pattern):
                return pattern
    return None


class Scope:
    """Which processes are ours, judged from this module's own PID namespace and cgroup root."""

    def __init__(self, params: dict[str, Any], procs: dict[int, Proc]) -> None:
        self.name: str = params["scope"]
        self.pidns = read_link("/proc/self/ns/pid")
        me = procs.get(os.getpid())
        self.pidns_depth = me.pidns_depth if me is not None else parse_nspid_depth(_read_text("/proc/self/status"))
        entries = me.cgroup_entries if me is not None else parse_cgroup_entries(_read_text("/proc/self/cgroup"))
        self.roots = own_cgroup_roots(entries)
        self.users = resolve_users(params["service_users"])

    @property
    def user_names(self) -> str:
        return ", ".join(self.users.present) or "none present on this host"

    def describe(self, units: list[str]) -> str:
        unit_part = f"members of the cgroups of {', '.join(units)}" if units else "no units"
        if self.name == "host":
            who = "engine processes of any user in this PID namespace, outside containers (scope host)"
        else:
            who = (
                f"engine processes of the engine service users ({self.user_names}) in this PID namespace, "
                "outside user sessions and containers (scope default)"
            )
        return f"scope {self.name}: targets are {unit_part}, and {who}"

    def out_of_scope(self, proc: Proc) -> str | None:
        """Why an engine-looking process is not ours (None when it is). What cannot be read about it makes it not
        ours: a scope decision fails closed."""
        namespace = self.other_pid_namespace(proc)
        if namespace:
            return namespace
        if not proc.cgroup_entries:
            return "its cgroup cannot be read: not known to be ours"
        if proc.uid is None:
            return "its owner cannot be read: not known to be ours"
        place = placement(proc.cgroup_entries, self.roots)
        if place.kind == "outside":
            return f"outside this module's cgroup root ({place.path})"
        if place.kind == "container":
            return f"in a container or pod cgroup ({place.path})"
        if self.name == "host":
            return None
        if place.kind == "session":
            return f"in a user session ({place.path}); scope host would take it"
        if proc.uid not in self.users.uids:
            return f"runs as {user_name(proc.uid)}, not an engine service user ({self.user_names})"
        return None

    def other_pid_namespace(self, proc: Proc) -> str | None:
        """Why the process is in another PID namespace than this module, or cannot be shown not to be; None when
        it is in ours. The ns/pid link where both can be read; else the NSpid: depth, which is readable where the
        link is not (another user's process, to a root without CAP_SYS_PTRACE)."""
        if self.pidns and proc.pidns:
            same = proc.pidns == self.pidns
            return None if same else f"in another PID namespace ({proc.pidns}): a container's process"
        if self.pidns_depth is not None and proc.pidns_depth is not None:
            if proc.pidns_depth == self.pidns_depth:
                return None
            return (f"in another PID namespace (nested {proc.pidns_depth - self.pidns_depth} level(s) below this "
                    "one, from NSpid): a container's process")
        return "its PID namespace cannot be read: not known to be ours"


@dataclass
class Users:
    present: list[str]
    uids: set[int]
    absent: list[str]


def user_name(uid: int | None) -> str:
    if uid is None:
        return "an unknown user"
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def resolve_users(names: list[str]) -> Users:
    """Users given by name or uid; names that are not users on this host own nothing here."""
    users = Users([], set(), [])
    for name in map(str, names):
        if name.isdigit():
            users.uids.add(int(name))
            users.present.append(name)
            continue
        try:
            users.uids.add(pwd.getpwnam(name).pw_uid)
            users.present.append(name)
        except KeyError:
            users.absent.append(name)
    return users


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def control_group(module: AnsibleModule, unit: str, known: dict[str, Any]) -> str:
    """The unit's ControlGroup, from the unit states read already (O(stop_units)) or from systemctl."""
    if unit in known:
        return known[unit].get("ControlGroup", "")
    systemctl = shutil.which("systemctl")
    if not systemctl:
        return ""
    rc, out, _ = module.run_command([systemctl, "show", "--property=ControlGroup", "--value", unit])
    return out.strip() if rc == 0 else ""


def unit_members(
    module: AnsibleModule, params: dict[str, Any], procs: dict[int, Proc], roots: dict[str, str], known: dict
) -> dict[int, str]:
    """Members of the units' cgroups: systemd's own ControlGroup, and every process whose cgroup path
    below the root names the unit outside user sessions and containers."""
    members: dict[int, str] = {}
    for unit in params["units"]:
        path = control_group(module, unit, known)
        if path:
            for pid in unit_cgroup_pids(params["cgroup_root"], path):
                members.setdefault(pid, f"member of {unit} cgroup")
        for proc in procs.values():
            if in_system_unit(proc.cgroup_entries, roots, unit):
                members.setdefault(proc.pid, f"member of {unit} cgroup")
    return members


def foreign_entry(proc: Proc, reason: str) -> dict[str, Any]:
    return {**proc.brief(), "user": user_name(proc.uid), "reason": reason}


def never_reason(proc: Proc, never: set[int], protected: list[str]) -> str | None:
    if proc.pid == os.getpid():
        return "this module itself"
    if proc.pid in never:
        return "ancestor of this module (the caller)" if proc.pid != 1 else "PID 1 (init)"
    if not proc.argv:
        return "kernel thread"
    name = protected_name(proc, protected)
    return f"protected daemon ({name})" if name else None


def select(
    params: dict[str, Any], module: AnsibleModule, procs: dict[int, Proc], scope: Scope, known_units: dict | None = None
) -> tuple[dict[int, str], list[dict], dict[int, dict]]:
    """(target pid -> reason, spared [{pid, cmd, reason}], foreign pid -> {pid, cmd, user, reason}).

    Targets: members of the units' cgroups, engine-pattern processes in scope, and their descendants in
    scope. An engine-pattern process (or a target's descendant) out of scope is foreign: named, never signalled.
    """
    me = os.getpid()
    never = {me, 1} | ancestors(me, procs)
    protected = list(params["protected"]) + list(params["extra_protected"])
    candidates: dict[int, str] = {}
    foreign: dict[int, dict] = {}
    for pid, reason in unit_members(module, params, procs, scope.roots, known_units or {}).items():
        if pid in procs:
            candidates[pid] = reason
    for proc in procs.values():
        pattern = first_matching_pattern(proc.argv, params["patterns"])
        if pattern is None or proc.pid in candidates:
            continue
        why_not = scope.out_of_scope(proc)
        if why_not is None:
            candidates[proc.pid] = f"matches engine pattern {pattern!r}"
        elif proc.pid not in never:
            foreign[proc.pid] = foreign_entry(proc, f"matches {pattern!r}, {why_not}")
    for pid, root in descendants(set(candidates), procs).items():
        if pid in candidates:
            continue
        why_not = None if pid in never else scope.out_of_scope(procs[pid])  # never: spared below, named as such
        if why_not is None:
            candidates[pid] = f"descendant of {root}"
        else:
            foreign.setdefault(pid, foreign_entry(procs[pid], f"child of {root}, {why_not}"))
    targets: dict[int, str] = {}
    spared: list[dict] = []
    for pid, reason in sorted(candidates.items()):
        why = never_reason(procs[pid], never, protected)
        if why:
            spared.append({**procs[pid].brief(), "reason": f"{why}; was selected as {reason}"})
        else:
            targets[pid] = reason
    return targets, spared, foreign


# ---------------------------------------------------------------- systemd units



# systemctl's path when systemd is the service manager of this host (sd_booted), else None.
systemd_runs_here = systemctl_here


def show_units(module: AnsibleModule, systemctl: str, units: list[str]) -> dict[str, dict[str, str]]:
    """``systemctl show`` of all units in one call: one KEY=VALUE block per unit."""
    rc, out, err = module.run_command([systemctl, "show", f"--property={','.join(UNIT_PROPERTIES)}", *units])
    if rc != 0:
        raise ReleaseError(f"systemctl show {' '.join(units)} failed (rc={rc}): {err.strip()}")
    return {state["Id"]: state for state in parse_show(out) if state.get("Id")}


def systemctl_do(module: AnsibleModule, systemctl: str, verb: str, units: list[str]) -> None:
    if not units:
        return
    rc, _, err = module.run_command([systemctl, verb, *units])
    if rc != 0:
        raise ReleaseError(f"systemctl {verb} {' '.join(units)} failed (rc={rc}): {err.strip()}")


def stop_units(module: AnsibleModule, units: list[str], check_mode: bool, disable: bool = True) -> dict[str, Any]:
    """Stop (and with ``disable``, disable) the loaded units, clear a failed state; what was done per unit.

    A deploy's switch stops without disabling: the unit enabled now is what the host boots into until the new
    release has passed its gate (roles/engine_service, commit.yml).

    ``systemctl stop`` returns 0 even when the stop ran into TimeoutStopSec and ended in SIGKILL: the unit's
    Result (``timeout``) says so, and the cgroup is checked after the release.
    """
    systemctl = systemd_runs_here()
    if systemctl is None or not units:
        return {"service_manager": "systemd" if systemctl else "none", "units": {}, "stopped": [], "disabled": []}
    before = show_units(module, systemctl, units)
    loaded = [u for u in units if before.get(u, {}).get("LoadState") == "loaded"]
    running = [u for u in loaded if before[u].get("ActiveState") not in ("inactive", "failed")]
    enabled = [u for u in loaded if before[u].get("UnitFileState") in ENABLED_STATES] if disable else []
    after, reset = before, []
    if not check_mode:
        systemctl_do(module, systemctl, "stop", running)
        systemctl_do(module, systemctl, "disable", enabled)
        after = show_units(module, systemctl, units) if running or enabled else before
        reset = [u for u in loaded if after[u].get("ActiveState") == "failed"]
        systemctl_do(module, systemctl, "reset-failed", reset)
    return {
        "service_manager": "systemd",
        "disable": disable,
        "units": {u: {**after.get(u, {"LoadState": "not-found"}), "failed_state_cleared": u in reset} for u in units},
        "stopped": running,
        "disabled": enabled,
        "reset_failed": reset,
    }


def unit_lines(units: dict[str, Any], check_mode: bool) -> list[str]:
    if units["service_manager"] != "systemd":
        return ["no systemd on this host: unit handling skipped"]
    lines = []
    for unit, s in units["units"].items():
        if s.get("LoadState") != "loaded":
            lines.append(f"unit {unit}: not installed")
            continue
        line = f"unit {unit}: {s['ActiveState']}, {s['UnitFileState']}, last result {s['Result']}"
        if s["Result"] == "timeout":
            line += " (the stop ran into TimeoutStopSec and ended in SIGKILL)"
        if s.get("failed_state_cleared"):
            line += "; failed state cleared"
        lines.append(line)
    if check_mode and (units["stopped"] or units["disabled"]):
        lines.append("check mode: would stop/disable " + ", ".join(dict.fromkeys(units["stopped"] + units["disabled"])))
    return lines


def units_left(units: dict[str, Any], procs: dict[int, Proc], roots: dict[str, str]) -> list[str]:
    """What is wrong with the units after the release: still running, still enabled, processes in their cgroups."""
    problems = []
    for unit, s in units["units"].items():
        if s.get("LoadState") != "loaded":
            continue
        if s.get("ActiveState") not in ("inactive", "failed"):
            problems.append(f"{unit} still {s.get('ActiveState')}")
        if units.get("disable", True) and s.get("UnitFileState") in ("enabled", "enabled-runtime"):
            problems.append(f"{unit} still enabled")
        left = [str(p.pid) for p in procs.values() if in_system_unit(p.cgroup_entries, roots, unit)]
        if left:
            problems.append(f"processes left in the cgroup of {unit}: {', '.join(left)}")
    return problems


# ---------------------------------------------------------------- signalling


def send(proc: Proc, sig: int) -> bool:
    """Signal the exact process we selected: a pidfd is opened first, then the start time is re-checked."""
    pidfd = None
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):
        pidfd = None  # no pidfd support (old kernel, some sandboxes): fall back to kill(2) after the check
    try:
        if not is_alive(proc.pid, proc.starttime):
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(proc.pid, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def since(self, t: float | None = None) -> float:
        return round(time.monotonic() - (self.t0 if t is None else t), 3)


def terminate(
    targets: dict[int, Proc], params: dict[str, Any], signalled: dict[str, list[int]]
) -> tuple[dict[int, float], float]:
    """SIGTERM all, poll, SIGKILL the rest after the grace, poll until gone or timeout.

    Returns (pid -> seconds from SIGTERM to exit, monotonic time of the SIGTERM).
    """
    interval = max(params["poll_interval_ms"], 1) / 1000.0
    t_term = time.monotonic()
    exited: dict[int, float] = {}
    for proc in targets.values():
        if send(proc, signal.SIGTERM):
            signalled["TERM"].append(proc.pid)
        else:
            exited[proc.pid] = 0.0
    killed = False
    while True:
        now = time.monotonic()
        for proc in targets.values():
            if proc.pid not in exited and not is_alive(proc.pid, proc.starttime):
                exited[proc.pid] = round(now - t_term, 3)
        alive = [p for p in targets.values() if p.pid not in exited]
        if not alive:
            break
        if not killed and now - t_term >= params["grace_s"]:
            killed = True
            for proc in alive:
                if send(proc, signal.SIGKILL):
                    signalled["KILL"].append(proc.pid)
            continue
        if now - t_term >= params["timeout_s"]:
            break
        time.sleep(interval)
    return exited, t_term


def wait_for_gpu_release(
    gpu: Gpu,
    *,
    watch_target: set[int],
    watch_unmapped: set[int],
    explained: int,
    params: dict[str, Any],
    t_term: float,
) -> set[int]:
    """Poll compute apps until no target PID is listed; returns the targets still listed at the timeout.

    Apps whose PID is not visible here (``watch_unmapped``: nvidia-smi answered with PIDs of another PID
    namespace) are waited for until no more of them are left than live non-target holders explain
    (``explained``), for at most ``settle_s``.
    """
    interval = max(params["poll_interval_ms"], 1) / 1000.0
    t_gone = time.monotonic()
    while True:
        listed = {a["pid"] for a in gpu.query_apps()}
        left_targets = listed & watch_target
        left_unmapped = listed & watch_unmapped
        now = time.monotonic()
        unmapped_done = len(left_unmapped) <= explained or now - t_gone >= params["settle_s"]
        if (not left_targets and unmapped_done) or now - t_term >= params["timeout_s"]:
            return left_targets
        time.sleep(interval)


def wait_for_memory_to_settle(gpu: Gpu, params: dict[str, Any], readings: int = 3) -> None:
    """Where nvidia-smi does not list the targets by PID, wait for memory.used to read the same 3 times."""
    interval = max(params["poll_interval_ms"], 1) / 1000.0
    deadline = time.monotonic() + params["settle_s"]
    history: list[list[int | None]] = []
    while time.monotonic() < deadline:
        history.append([g["memory_used_mib"] for g in gpu.query_gpus()])
        if len(history) >= readings and all(h == history[-1] for h in history[-readings:]):
            return
        time.sleep(interval)


# ---------------------------------------------------------------- /dev/shm


def shm_users(shm_dir: str, procs: dict[int, Proc]) -> dict[str, set[int]]:
    """shm path -> PIDs that have it open or mapped."""
    prefix = shm_dir.rstrip("/") + "/"
    users: dict[str, set[int]] = {}
    for proc in procs.values():
        paths = {p[: -len(" (deleted)")] if p.endswith(" (deleted)") else p for p in proc.fds}
        paths |= read_mapped_paths(proc.pid)
        for path in paths:
            if path.startswith(prefix):
                users.setdefault(path, set()).add(proc.pid)
    return users


def shm_owners(params: dict[str, Any], scope: Scope) -> Users:
    """Whose /dev/shm entries may go: O(shm_owner), or the engine service users when it is empty."""
    return resolve_users(params["shm_owner"]) if params["shm_owner"] else scope.users


def clean_shm(
    params: dict[str, Any], procs: dict[int, Proc], check_mode: bool, targets: set[int], owners: Users
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "dir": params["shm_dir"],
        "owners": owners.present,
        "removed": [],
        "would_remove": [],
        "kept": [],
    }
    if not params["clean_shm"]:
        result["skipped"] = "clean_shm is false"
        return result
    if params["report_only"]:
        result["skipped"] = "report only"
        return result
    shm_dir = os.path.realpath(params["shm_dir"])
    try:
        names = sorted(os.listdir(shm_dir))
    except OSError as exc:
        result["skipped"] = f"cannot list {shm_dir}: {exc.strerror}"
        return result
    users = shm_users(shm_dir, procs)
    for name in names:
        if not any(fnmatch.fnmatchcase(name, p) for p in params["shm_patterns"]):
            continue
        path = os.path.join(shm_dir, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        holders = users.get(path, set())
        if check_mode:
            holders = holders - targets  # targets would be gone by then
        reason = None
        if not stat.S_ISREG(st.st_mode):
            reason = "not a regular file"
        elif st.st_uid not in owners.uids:
            reason = f"owned by {user_name(st.st_uid)}, not by {', '.join(owners.present) or 'an engine service user'}"
        elif holders:
            reason = "open or mapped by PIDs " + ", ".join(str(p) for p in sorted(holders))
        if reason:
            result["kept"].append({"path": path, "reason": reason})
        elif check_mode:
            result["would_remove"].append(path)
        else:
            try:
                os.unlink(path)
                result["removed"].append(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                result["kept"].append({"path": path, "reason": f"unlink failed: {exc.strerror}"})
    return result


# ---------------------------------------------------------------- report


def gpu_table(
    gpus: list[dict[str, Any]], procs: dict[int, Proc], dev_dir: str, wanted: list[str]
) -> dict[int, dict[str, Any]]:
    """minor -> GPU entry for the selected GPUs. Without nvidia-smi, the minors seen in device files."""
    table: dict[int, dict[str, Any]] = {}
    for gpu in gpus:
        if not gpu_selected(gpu, wanted):
            continue
        minor = gpu["minor"] if gpu["minor"] is not None else gpu["index"]
        table[minor] = {
            "index": gpu["index"],
            "uuid": gpu["uuid"],
            "name": gpu["name"],
            "bus_id": gpu["bus_id"],
            "minor": minor,
            "minor_source": gpu["minor_source"] if gpu["minor"] is not None else "assumed equal to index",
            "memory_total_mib": gpu["memory_total_mib"],
            "memory_used_before_mib": gpu["memory_used_mib"],
            "memory_used_after_mib": None,
            "freed_mib": None,
            "holders": [],
        }
    if not gpus:
        for proc in procs.values():
            for minor in device_files(proc, dev_dir)[0]:
                table.setdefault(minor, {"index": None, "uuid": None, "bus_id": None, "minor": minor, "holders": []})
    return table


def gpu_line(g: dict[str, Any]) -> str:
    roles: dict[str, int] = {}
    for h in g["holders"]:
        roles[h["role"]] = roles.get(h["role"], 0) + 1
    found = ", ".join(f"{n} {r}" for r, n in sorted(roles.items())) or "no holders"
    mem = ""
    if g.get("memory_used_before_mib") is not None:
        before, after = g["memory_used_before_mib"], g["memory_used_after_mib"]
        mem = f"; {before} -> {after} MiB (freed {g['freed_mib']})"
    if g.get("wedged"):
        state = f"WEDGED: {g['wedged']}; needs `nvidia-smi -r` or a reboot"
    elif g.get("clean") is None:
        state = "not verified"
    elif g["clean"]:
        state = "clean"
    else:
        users = ", ".join(str(a["pid"]) for a in g.get("apps_after", [])) or "targets still alive"
        state = f"NOT clean (compute apps left: {users})"
    return f"GPU {g['index'] if g['index'] is not None else '?'} (minor {g['minor']}): {found}{mem}; {state}"


def summarize(result: dict[str, Any]) -> list[str]:
    lines = unit_lines(result["units"], result["check_mode"]) if result["stop_units"] else []
    lines.append(result["scope_description"])
    if result["nvidia_smi_error"]:
        lines.append(f"nvidia-smi gave no answer: GPU verification skipped ({result['nvidia_smi_error']})")
    elif result["gpu_verification"] == "skipped":
        lines.append(f"no NVIDIA driver on this host: GPU verification skipped ({result['gpu_verification_reason']})")
    lines.extend(gpu_line(g) for g in result["gpus"])
    sig = result["signalled"]
    if result["report_only"]:
        lines.append(f"targets {len(result['targets'])} (report only: nothing sent)")
    else:
        lines.append(
            f"targets {len(result['targets'])}: TERM {len(sig['TERM'])}, KILL {len(sig['KILL'])}"
            + (" (check mode: nothing sent)" if result["check_mode"] else "")
        )
    for s in result["spared"]:
        lines.append(f"spared {s['pid']} {s['cmd'][:60]}: {s['reason']}")
    for f in result["foreign"]:
        on = f" on GPUs {f['gpus']}" if f.get("gpus") else ""
        lines.append(f"foreign, not signalled: {f['pid']} {f['cmd'][:60]} ({f['user']}){on}: {f['reason']}")
    for a in result["unattributed_apps"]:
        lines.append(f"unattributed compute app pid {a['pid']} ({a['name']}) {a['used_mib']} MiB: PID not visible here")
    shm = result["shm"]
    removed = shm["would_remove"] if result["check_mode"] else shm["removed"]
    verb = "would remove" if result["check_mode"] else "removed"
    lines.append(
        f"/dev/shm: {verb} {len(removed)}, kept {len(shm['kept'])}"
        + (f" ({shm['skipped']})" if shm.get("skipped") else f" (entries of {', '.join(shm['owners']) or 'nobody'})")
    )
    lines.append(
        f"elapsed {result['elapsed_s']} s"
        + (f", release {result['release_s']} s" if result["release_s"] is not None else "")
    )
    return lines


def attribute_apps(
    apps: list[dict[str, Any]], table: dict[int, dict[str, Any]], procs: dict[int, Proc]
) -> tuple[dict[int, dict[int, int]], list[dict[str, Any]]]:
    """(pid -> {minor: MiB}, apps whose PID is not visible here) on selected GPUs, by uuid, else bus id."""
    by_uuid = {g["uuid"]: g for g in table.values() if g["uuid"]}
    by_bus = {g["bus_id"]: g for g in table.values() if g["bus_id"]}
    app_mem: dict[int, dict[int, int]] = {}
    unmapped: list[dict[str, Any]] = []
    for app in apps:
        entry = by_uuid.get(app["gpu_uuid"]) or by_bus.get(app["bus_id"])
        if entry is None:
            continue
        if app["pid"] not in procs:
            unmapped.append({**app, "gpu_index": entry["index"]})
        else:
            app_mem.setdefault(app["pid"], {})[entry["minor"]] = app["used_mib"] or 0
    return app_mem, unmapped


def classify_holders(
    *,
    procs: dict[int, Proc],
    table: dict[int, dict[str, Any]],
    app_mem: dict[int, dict[int, int]],
    targets: dict[int, dict[str, Any]],
    spared: list[dict[str, Any]],
    dev_dir: str,
    protected: list[str],
    apps_authoritative: bool,
    foreign_by_pid: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    """Add every GPU holder to its GPUs' ``holders`` with a role; returns the foreign compute holders.

    A compute user is a process nvidia-smi lists as a compute app. Only where that list cannot be used
    (no nvidia-smi, or it names PIDs of another PID namespace) an open ``nvidia-uvm`` stands in for it:
    on driver 580 an NVML-only client opens ``nvidia-uvm`` too, so that fallback over-reports.

    Where that list is used, a compute app holds the GPUs it has memory on. The device files of other GPUs that
    it has open are its peer-to-peer mappings (CUDA opens a peer GPU's device file for P2P access, as a
    tensor-parallel job on GPUs 4-7 of a PCIe box does): it is listed on those GPUs as a ``peer``, not as a
    holder of them. Our own engines (targets) stay holders of every GPU whose file they hold.
    """
    me_chain = {os.getpid()} | ancestors(os.getpid(), procs)
    spared_pids = {s["pid"] for s in spared}
    foreign: list[dict[str, Any]] = []
    for proc in procs.values():
        minors, uvm, any_dev = device_files(proc, dev_dir)
        if not any_dev and proc.pid not in app_mem:
            continue
        # Our engines keep every GPU whose file they hold: a GPU is not released until they let go of it.
        held, peers = held_and_peer_gpus(proc.pid, minors, app_mem, table,
                                         apps_authoritative and proc.pid not in targets)
        compute = proc.pid in app_mem if apps_authoritative else (uvm or proc.pid in app_mem)
        if proc.pid in targets:
            role = "target"
            targets[proc.pid]["gpus"] = sorted(table[m]["index"] for m in held)
        elif proc.pid in me_chain:
            role = "self"
        elif proc.pid in spared_pids:
            role = "spared"
        elif protected_name(proc, protected):
            role = "protected"
            spared.append({**proc.brief(), "reason": f"protected daemon ({protected_name(proc, protected)})"})
        elif not compute:
            role = "monitor"
            how = "not a compute app in nvidia-smi" if apps_authoritative else "no nvidia-uvm open"
            reason = f"NVML-only GPU holder ({how}): a monitor, not a compute user"
            spared.append({**proc.brief(), "reason": reason})
        else:
            role = "foreign"
            gpus = sorted(table[m]["index"] for m in held)
            known = foreign_by_pid.setdefault(
                proc.pid, foreign_entry(proc, "uses a GPU for compute; not an engine process of ours")
            )
            known["gpus"] = gpus
            foreign.append({**proc.brief(), "gpus": gpus, "holds_uvm": uvm, "reason": known["reason"]})
        for m in held:
            used = app_mem.get(proc.pid, {}).get(m)
            table[m]["holders"].append({**proc.brief(), "role": role, "compute": compute, "used_mib": used})
        for m in peers:
            table[m]["holders"].append({**proc.brief(), "role": "peer", "compute": False, "used_mib": None})
    return foreign


def held_and_peer_gpus(pid: int, minors: set[int], app_mem: dict[int, dict[int, int]],
                       table: dict[int, dict[str, Any]], apps_authoritative: bool) -> tuple[list[int], list[int]]:
    """(selected GPUs the process holds, selected GPUs whose device file it has open only as a peer). Without an
    authoritative compute-app list every open device file counts as held."""
    used = set(app_mem.get(pid, {}))
    if apps_authoritative and pid in app_mem:
        return sorted(m for m in used if m in table), sorted(m for m in minors - used if m in table)
    return sorted(m for m in minors | used if m in table), []


def verify_gpus(
    *,
    gpu: Gpu,
    table: dict[int, dict[str, Any]],
    targets: dict[int, dict[str, Any]],
    gpus_after: list[dict[str, Any]],
    apps_after: list[dict[str, Any]],
    check_mode: bool,
) -> None:
    """Memory after, freed, compute apps left and ``clean`` per selected GPU, in place."""
    after_by_minor = {(g["minor"] if g["minor"] is not None else g["index"]): g for g in gpus_after}
    for minor, entry in table.items():
        after = after_by_minor.get(minor)
        if after is not None and not check_mode:
            entry["memory_used_after_mib"] = after["memory_used_mib"]
            if entry.get("memory_used_before_mib") is not None and after["memory_used_mib"] is not None:
                entry["freed_mib"] = entry["memory_used_before_mib"] - after["memory_used_mib"]
        here = [a for a in apps_after if a["gpu_uuid"] == entry["uuid"] or a["bus_id"] == entry["bus_id"]]
        entry["apps_after"] = here if gpu.available else []
        alive = [h for h in entry["holders"] if h["role"] == "target" and not targets[h["pid"]].get("exited", False)]
        entry["clean"] = None if not gpu.available or check_mode else not here and not alive and not entry.get("wedged")


def failure(result: dict[str, Any], targets: dict[int, dict[str, Any]], left_on_gpu: set[int], params) -> str:
    stuck = [targets[p] for p in sorted(targets) if not targets[p]["exited"] or p in left_on_gpu]
    if stuck and not result["check_mode"] and not result["report_only"]:
        names = "; ".join(f"PID {t['pid']} ({t['cmd'][:80]}) on GPUs {t['gpus']}" for t in stuck)
        return f"still running or holding GPU memory after {params['timeout_s']} s: {names}"
    if result["nvidia_smi_error"]:
        return result["nvidia_smi_error"]
    if result["wedged"]:
        names = "; ".join(f"GPU {w['index']} ({w['uuid'] or w['bus_id']}): {w['text']}" for w in result["wedged"])
        return f"wedged GPU, needs `nvidia-smi -r` (with nothing using it) or a reboot: {names}"
    if params["fail_on_foreign_holders"] and result["foreign_holders"]:
        names = "; ".join(f"PID {f['pid']} ({f['cmd'][:80]}) on GPUs {f['gpus']}" for f in result["foreign_holders"])
        return f"foreign processes use the GPUs (not signalled): {names}"
    if params["fail_on_foreign_holders"] and result["unattributed_apps"]:
        apps = result["unattributed_apps"]
        names = "; ".join(f"PID {a['pid']} ({a['name']}) {a['used_mib']} MiB on GPU {a['gpu_index']}" for a in apps)
        return f"processes this host's PID namespace cannot see use the GPUs: {names}"
    if result["units_left"]:
        return "engine units not stopped cleanly: " + "; ".join(result["units_left"])
    return ""


def target_entries(reasons: dict[int, str], procs: dict[int, Proc]) -> dict[int, dict[str, Any]]:
    return {
        pid: {
            **procs[pid].brief(),
            "user": user_name(procs[pid].uid),
            "reason": reason,
            "gpus": [],
            "signals": [],
            "exited": False,
            "exit_s": None,
        }
        for pid, reason in reasons.items()
    }


def with_recorded_unit(units: list[str], recorded: str | None) -> list[str]:
    """O(units) plus the unit of the release state.json names as current (it may be neither engine's default)."""
    return [*units, recorded] if recorded and recorded not in units else list(units)


def find_wedged(
    gpu: Gpu, table: dict[int, dict[str, Any]], gpus: list[dict], apps: list[dict], params: dict[str, Any]
) -> tuple[dict[str, dict[str, Any]], list[dict], list[dict]]:
    """Wedged selected GPUs (marked in ``table``) and the last (gpus, apps) read; see bws_gpu_health."""
    if not gpu.available:
        return {}, gpus, apps
    wedged, gpus, apps = wedged_gpus(
        gpus,
        apps,
        sample=gpu.query_both,
        keys={gpu_key(e) for e in table.values() if e["uuid"] or e["bus_id"]},
        idle_memory_mib=params["idle_memory_mib"],
        window_s=params["wedged_window_s"],
    )
    for entry in table.values():
        found = wedged.get(gpu_key(entry))
        if found:
            entry["wedged"] = wedged_text(found["readings"], found["seconds"], params["idle_memory_mib"])
    return wedged, gpus, apps


def release(module: AnsibleModule) -> dict[str, Any]:
    params = module.params
    clock = Clock()
    check_mode = module.check_mode
    report_only = params["report_only"]
    serving = read_serving(params["state_dir"]) if params["state_dir"] else None
    params["units"] = with_recorded_unit(params["units"], (serving or {}).get("release", {}).get("unit"))
    units = stop_units(module, params["units"] if params["stop_units"] else [], check_mode or report_only,
                       params["disable_units"])
    gpu = Gpu(module, params["nvidia_smi"], params["driver_proc_dir"])
    procs = snapshot()
    scope = Scope(params, procs)
    gpus_before, apps_before = gpu.first_look()
    targets_reason, spared, foreign_by_pid = select(params, module, procs, scope, units["units"])
    table = gpu_table(gpus_before, procs, params["dev_dir"], params["gpus"])
    app_mem, unmapped = attribute_apps(apps_before, table, procs)
    targets = target_entries(targets_reason, procs)
    foreign = classify_holders(
        procs=procs,
        table=table,
        app_mem=app_mem,
        targets=targets,
        spared=spared,
        dev_dir=params["dev_dir"],
        protected=params["protected"] + params["extra_protected"],
        apps_authoritative=gpu.available and not unmapped,
        foreign_by_pid=foreign_by_pid,
    )

    signalled: dict[str, list[int]] = {"TERM": [], "KILL": []}
    release_s = None
    left_on_gpu: set[int] = set()
    if check_mode and not report_only:
        signalled["TERM"] = sorted(targets)
    elif targets and not report_only:
        exited, t_term = terminate({pid: procs[pid] for pid in targets}, params, signalled)
        if gpu.available:
            left_on_gpu = wait_for_gpu_release(
                gpu,
                watch_target=set(targets),
                watch_unmapped={a["pid"] for a in unmapped},
                explained=sum(1 for f in foreign if f["pid"] not in app_mem and f["holds_uvm"]),
                params=params,
                t_term=t_term,
            )
            if any(t["gpus"] for t in targets.values()) and not set(app_mem) & set(targets):
                wait_for_memory_to_settle(gpu, params)
        release_s = round(time.monotonic() - t_term, 3)
        for pid, t in targets.items():
            t["signals"] = [s for s in ("TERM", "KILL") if pid in signalled[s]]
            t["exited"] = pid in exited
            t["exit_s"] = exited.get(pid)

    quiet = check_mode or report_only or not targets
    procs_after = procs if quiet else snapshot()
    shm = clean_shm(params, procs_after, check_mode, set(targets), shm_owners(params, scope))
    gpus_after, apps_after = gpu.query_both() if gpu.available and not quiet else (gpus_before, apps_before)
    wedged, gpus_after, apps_after = find_wedged(gpu, table, gpus_after, apps_after, params)
    verify_gpus(
        gpu=gpu,
        table=table,
        targets=targets,
        gpus_after=gpus_after,
        apps_after=apps_after,
        check_mode=check_mode or report_only,
    )
    listed_after = {a["pid"] for a in apps_after}

    changed = (
        signalled["TERM"]
        or signalled["KILL"]
        or shm["removed"]
        or (check_mode and shm["would_remove"])
        or units["stopped"]
        or units["disabled"]
    )
    result: dict[str, Any] = {
        "changed": bool(changed) and not report_only,
        "check_mode": check_mode,
        "report_only": report_only,
        "scope": scope.name,
        "scope_description": scope.describe(params["units"]),
        "service_users": {"present": scope.users.present, "absent": scope.users.absent},
        "stop_units": params["stop_units"],
        "units": units,
        "units_left": [] if check_mode or report_only else units_left(units, procs_after, scope.roots),
        "driver_loaded": gpu.driver_loaded,
        "driver_version": next((g["driver_version"] for g in gpus_before if g.get("driver_version")), None),
        "gpu_count": len(gpus_before),
        "gpu_verification": "done" if gpu.available else "skipped",
        "gpu_verification_reason": "" if gpu.available else gpu.reason,
        "gpus": sorted(table.values(), key=lambda e: (e["index"] is None, e["index"] or 0, e["minor"])),
        "targets": [targets[p] for p in sorted(targets)],
        "signalled": signalled,
        "spared": spared,
        "foreign": [foreign_by_pid[p] for p in sorted(foreign_by_pid)],
        "foreign_holders": foreign,
        "unattributed_apps": [a for a in unmapped if a["pid"] in listed_after],
        "wedged": wedged_list(table, wedged),
        "nvidia_smi_error": gpu.error,
        "shm": shm,
        "release_s": release_s,
        "elapsed_s": clock.since(),
    }
    result["summary"] = summarize(result)
    msg = failure(result, targets, left_on_gpu, params)
    if msg and report_only:
        msg += ". Report only: nothing was stopped, signalled or removed."
    if serving is not None:
        record_release(result, serving, write=not (msg or check_mode or report_only), failed=bool(msg))
    if msg:
        result["msg"] = msg
        result["summary"].append("FAILED: " + msg)
    return result


def wedged_list(table: dict[int, dict[str, Any]], wedged: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for entry in sorted(table.values(), key=lambda e: (e["index"] is None, e["index"] or 0)):
        if entry.get("wedged"):
            readings = wedged[gpu_key(entry)]
            found.append({**{k: entry[k] for k in ("index", "uuid", "bus_id")}, **readings, "text": entry["wedged"]})
    return found


def record_release(result: dict[str, Any], serving: dict[str, Any], write: bool, failed: bool) -> None:
    """With O(state_dir): state.json records the current release as stopped; a summary line names it."""
    record = record_stopped(serving, write=write)
    release = serving["release"]
    result["release"] = {
        **{k: release.get(k) for k in ("id", "engine", "profile", "unit")},
        "state_before": serving["state"] if serving["text"] is not None else None,
        "state_changed": record["changed"],
    }
    if record["changed"] and not failed and not result["report_only"]:  # written, or would be in check mode
        result["changed"] = True
        result["diff"] = {
            "before": record["before"],
            "after": record["after"],
            "before_header": record["path"],
            "after_header": record["path"],
        }
    if release.get("id") is not None:
        verb = "would be" if result["check_mode"] else "is"
        named = f"release {release['id']} ({release.get('engine')}, profile {release.get('profile')})"
        if failed:
            result["summary"].append(f"{named}: state.json left as it was ({serving['state']['status']})")
        else:
            result["summary"].append(f"{named} {verb} recorded as stopped; a deploy starts it again")
    else:
        result["summary"].append("no release recorded on this host")


