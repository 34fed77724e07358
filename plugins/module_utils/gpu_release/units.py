"""gpu_release, systemd units: stop (and disable) the engine units, clear a failed state, and say what is left.

Stdlib only; runs on the target.
"""

from __future__ import annotations

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.host.procfs import Proc, in_system_unit
from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import (
    ENABLED_STATES,
    UNIT_PROPERTIES,
    SystemdError,
    systemctl_here,
)
from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import show_units as read_units


class ReleaseError(Exception):
    pass


# systemctl's path when systemd is the service manager of this host (sd_booted), else None.
systemd_runs_here = systemctl_here


def show_units(module: AnsibleModule, systemctl: str, units: list[str]) -> dict[str, dict[str, str]]:
    """The units' state (host.systemd.show_units: one ``systemctl show`` for all), through the module's runner."""
    try:
        return read_units(units, UNIT_PROPERTIES, systemctl=systemctl, run=module.run_command)
    except SystemdError as exc:
        raise ReleaseError(str(exc)) from exc


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


def with_recorded_unit(units: list[str], recorded: str | None) -> list[str]:
    """O(units) plus the unit of the release state.json names as current (it may be neither engine's default)."""
    return [*units, recorded] if recorded and recorded not in units else list(units)
