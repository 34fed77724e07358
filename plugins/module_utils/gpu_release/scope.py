"""gpu_release, selection: which processes are ours to stop (units' cgroups, engine patterns in scope, their
descendants), which are foreign (named, never signalled), and which are never touched.

Stdlib only; runs on the target.
"""

from __future__ import annotations

import fnmatch
import os
import pwd
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.host.procfs import (
    Proc,
    ancestors,
    descendants,
    first_matching_pattern,
    identity,
    in_system_unit,
    own_cgroup_roots,
    parse_cgroup_entries,
    parse_nspid_depth,
    placement,
    read_link,
    unit_cgroup_pids,
    user_name,
)
from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import SystemdError, show_units


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
    """The unit's ControlGroup, from the unit states read already (O(stop_units)) or from systemd."""
    if unit in known:
        return known[unit].get("ControlGroup", "")
    try:
        return show_units([unit], ("ControlGroup",), run=module.run_command).get(unit, {}).get("ControlGroup", "")
    except SystemdError:
        return ""


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
    return {**proc.brief(), "reason": reason}


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
    """(target pid -> reason, spared [{pid, user, title, reason}], foreign pid -> {pid, user, title, reason}).

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
