"""Read-only systemd helpers shared by the modules (stdlib only; runs on the target)."""

from __future__ import annotations

import re
import shutil
import subprocess

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


def systemd_available() -> bool:
    return shutil.which("systemctl") is not None and _pid1_is_systemd()


def _pid1_is_systemd() -> bool:
    try:
        with open("/proc/1/comm", encoding="utf-8") as handle:
            return handle.read().strip() == "systemd"
    except OSError:
        return False


def unit_properties(unit: str, names: tuple[str, ...], timeout: float | None = None) -> dict[str, str]:
    """`systemctl show` the given properties of a unit; an empty dict when systemd is not there (or, with
    `timeout`, does not answer in time)."""
    if not systemd_available():
        return {}
    try:
        result = subprocess.run(
            ["systemctl", "show", unit, "--property", ",".join(names)],
            capture_output=True, text=True, check=False, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {}
    properties = {}
    for line in result.stdout.splitlines():
        key, _, value = line.partition("=")
        properties[key] = value
    return properties


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
