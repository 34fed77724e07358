"""Read-only systemd helpers shared by the modules (stdlib only; runs on the target)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable

# Runs an argv and returns (rc, stdout, stderr), as AnsibleModule.run_command does.
Runner = Callable[[list[str]], tuple[int, str, str]]

_UNIT_IN_CGROUP = re.compile(r"/([^/]+\.service)(?:/|$)")


def unit_of_pid(pid: int, proc_root: str = "/proc") -> str | None:
    """Return the systemd service unit a process belongs to (cgroup v1 or v2), or None."""
    try:
        with open(f"{proc_root}/{pid}/cgroup", encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers in ("", "name=systemd"):
            match = _UNIT_IN_CGROUP.search(path)
            if match:
                return match.group(1)
    return None


def unit_properties(unit: str, names: tuple[str, ...], timeout: float | None = None) -> dict[str, str]:
    """The given properties of one unit (show_units); an empty dict where systemd does not run here, or does not
    answer (in time)."""
    try:
        return show_units([unit], names, timeout=timeout or 30).get(unit, {})
    except SystemdError:
        return {}


def journal_tail(unit: str, lines: int, timeout: float | None = None) -> list[str]:
    if not shutil.which("journalctl"):
        return [f"(no journalctl on this host: cannot show the journal of {unit})"]
    try:
        result = subprocess.run(
            ["journalctl", "--unit", unit, "--lines", str(lines), "--no-pager", "--output", "short-iso"],
            capture_output=True, text=True, check=False, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return [f"(journalctl did not answer within {timeout:g} s: cannot show the journal of {unit})"]
    return (result.stdout or result.stderr).splitlines()[-lines:]


# What a deploy and a teardown read of a unit, in one `systemctl show` for all units.
UNIT_PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Result", "UnitFileState", "ControlGroup")
ENABLED_STATES = ("enabled", "enabled-runtime", "linked", "linked-runtime", "alias")


class SystemdError(Exception):
    pass


def systemctl_here() -> str | None:
    """systemctl's path when systemd is this host's service manager (sd_booted: /run/systemd/system), else None."""
    systemctl = shutil.which("systemctl")
    return systemctl if systemctl and os.path.isdir("/run/systemd/system") else None


def show_units(units: list[str], properties: tuple[str, ...] = UNIT_PROPERTIES, timeout: float = 30,
               systemctl: str | None = None, run: Runner | None = None) -> dict[str, dict[str, str]]:
    """`systemctl show` of every unit in one call, by unit name (an unknown unit has LoadState=not-found);
    {} where systemd does not run. The project's one reader of unit state: every module reads units through it.
    `run` runs the command (a module passes its run_command); by default a subprocess bounded by `timeout`."""
    systemctl = systemctl or systemctl_here()
    if systemctl is None or not units:
        return {}
    wanted = tuple(dict.fromkeys(("Id", *properties)))
    argv = [systemctl, "show", f"--property={','.join(wanted)}", *units]
    rc, out, err = (run or _subprocess_runner(timeout))(argv)
    if rc != 0:
        raise SystemdError(f"systemctl show {' '.join(units)} failed (rc={rc}): {err.strip()}")
    return dict(zip(units, parse_show(out), strict=False))


def _subprocess_runner(timeout: float) -> Runner:
    def run(argv: list[str]) -> tuple[int, str, str]:
        try:
            result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise SystemdError(f"{' '.join(argv[:2])} did not answer within {timeout:g} s") from exc
        return result.returncode, result.stdout, result.stderr

    return run


def parse_show(text: str) -> list[dict[str, str]]:
    """`systemctl show` output of several units: one KEY=VALUE block per unit, in the order asked for."""
    return [dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            for block in text.strip().split("\n\n")]


def service_summary(properties: dict[str, str]) -> dict[str, str]:
    """A unit as ansible.builtin.service_facts describes it: state running/stopped/failed, status = the unit file
    state (enabled, disabled, static, ..., not-found)."""
    if properties.get("LoadState", "not-found") == "not-found":
        return {"state": "stopped", "status": "not-found"}
    active = properties.get("ActiveState", "")
    state = "running" if properties.get("SubState") == "running" else "failed" if active == "failed" else "stopped"
    return {"state": state, "status": properties.get("UnitFileState") or "static", "active_state": active,
            "sub_state": properties.get("SubState", "")}
