# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""One read of what a host serves, for the engine_status module (status.yml): state.json, the current release,
the releases kept, the engine unit, /health, and who holds the GPUs. Nothing is written.

What the result may hold: the fields of release.json named in RELEASE_FIELDS (no command line, no path of a
secret's file), state.json's release ids, unit states, an HTTP status, GPU numbers, and of a process its pid, user
and title (procfs.Proc.brief). No configuration or environment file of a release is ever opened here, so no key,
token or password can reach the result.

Standard library only: it runs on the target.
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from typing import Any

from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import ENABLED_STATES
from ansible_collections.blackwell.serving.plugins.module_utils.release.files import (
    ReleaseFilesError,
    list_releases,
    read_json,
    utc_text,
)
from ansible_collections.blackwell.serving.plugins.module_utils.release.state import (
    STATE_FILE,
    JsonFileError,
    read_json_file,
    release_state,
    release_to_boot,
)

UNKNOWN = "unknown"
RELEASE_FILE = "release.json"
# What the result says of a release: never exec_start (a command line may carry a flag's value) or a file's path.
RELEASE_FIELDS = ("id", "engine", "engine_version", "profile", "unit", "created")
# What engine_status reads of each engine unit (one `systemctl show` for all).
UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "UnitFileState", "ControlGroup",
                   "ActiveEnterTimestampMonotonic")


class StateError(Exception):
    """state.json or the current release cannot be read: the host's state is broken or half-written."""


def _json_file(path: str) -> Any:
    """The parsed file, None when absent (state.read_json_file); StateError naming the file when it is not JSON or
    cannot be read."""
    try:
        parsed, _ = read_json_file(path)
    except JsonFileError as exc:
        raise StateError(f"{os.path.basename(path)} is not valid JSON: {exc.error} ({path}, {exc.size} bytes; "
                         "half-written?)") from exc
    except OSError as exc:
        raise StateError(f"{os.path.basename(path)} cannot be read ({path}: {exc.strerror})") from exc
    return parsed


def release_brief(metadata: Any, release_id: str) -> dict[str, Any]:
    """The RELEASE_FIELDS of a release.json; `created` is "unknown" for a release written before it was recorded."""
    metadata = metadata if isinstance(metadata, dict) else {}
    brief = {name: metadata.get(name) for name in RELEASE_FIELDS}
    brief["id"] = brief["id"] or release_id
    brief["created"] = brief["created"] or UNKNOWN
    return brief


def read_state(state_dir: str) -> dict[str, Any]:
    """{state (normalised state.json, None when there is none), release (the current release.json, {} without a
    current release)}; StateError when either cannot be read as a deploy writes it."""
    raw = _json_file(os.path.join(state_dir, STATE_FILE))
    if raw is None:
        return {"state": None, "release": {}}
    if not isinstance(raw, dict):
        raise StateError(f"state.json holds {type(raw).__name__}, not an object")
    try:
        state = release_state(raw)
    except ValueError as exc:
        raise StateError(str(exc)) from exc
    if not state["current"]:
        return {"state": state, "release": {}}
    current = str(state["current"])
    if "/" in current or current in (".", ".."):
        raise StateError(f"state.json names {current!r} as current, not a release directory name")
    release = _json_file(os.path.join(state_dir, "releases", current, RELEASE_FILE))
    if not isinstance(release, dict):
        raise StateError(f"state.json names {current} as current, but its release.json is missing "
                         "(the release directory is gone or half-written)")
    return {"state": state, "release": release}


def kept_releases(state_dir: str, state: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The release directories on disk, newest first: id, engine, engine_version, profile, created, and whether
    state.json names it current or previous; one whose release.json is missing or broken says so (incomplete)."""
    named = state or {}
    kept = []
    for directory in list_releases(os.path.join(state_dir, "releases")):
        release_id = os.path.basename(directory["path"].rstrip("/"))
        try:
            metadata = read_json(os.path.join(directory["path"], RELEASE_FILE))
            incomplete = "" if isinstance(metadata, dict) else "no release.json (incomplete)"
        except ReleaseFilesError as exc:
            metadata, incomplete = None, str(exc)
        brief = release_brief(metadata, release_id)
        kept.append({**{k: brief[k] for k in ("id", "engine", "engine_version", "profile", "created")},
                     "current": release_id == named.get("current"), "previous": release_id == named.get("previous"),
                     "incomplete": incomplete, "mtime": directory["mtime"]})
    kept.sort(key=lambda r: (r["mtime"], r["id"]), reverse=True)
    for release in kept:
        del release["mtime"]
    return kept


# ---------------------------------------------------------------- /health

def probe_health(url: str | None, timeout_s: float) -> dict[str, Any]:
    """GET the release's health URL once, without a proxy and without credentials (/health needs no key on either
    engine): {url, status (the HTTP status, None without an answer), latency_ms, error}."""
    result: dict[str, Any] = {"url": url, "status": None, "latency_ms": None, "error": ""}
    if not url:
        result["error"] = "the release records no health_url"
        return result
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    started = time.monotonic()
    try:
        with opener.open(url, timeout=timeout_s) as response:
            result["status"] = response.status
    except urllib.error.HTTPError as exc:
        result["status"] = exc.code
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        result["error"] = f"no answer within {timeout_s:g} s" if "timed out" in str(reason) else f"no answer ({reason})"
    if result["status"] is not None:
        result["latency_ms"] = round((time.monotonic() - started) * 1000)
    return result


# ---------------------------------------------------------------- the engine unit

def monotonic_to_utc(usec: str | None, now: float | None = None, now_monotonic: float | None = None) -> str | None:
    """systemd's CLOCK_MONOTONIC microseconds (ActiveEnterTimestampMonotonic) as a UTC time; None for 0 (never)."""
    try:
        value = int(usec or 0)
    except ValueError:
        return None
    if value <= 0:
        return None
    now = time.time() if now is None else now
    now_monotonic = time.monotonic() if now_monotonic is None else now_monotonic
    return utc_text(now - (now_monotonic - value / 1e6))


def unit_view(name: str | None, properties: dict[str, str] | None, systemd: bool) -> dict[str, Any]:
    """The unit as the status says it: active_state, sub_state, enabled, and since when it is active."""
    props = properties or {}
    view: dict[str, Any] = {"name": name, "load_state": props.get("LoadState"),
                            "active_state": props.get("ActiveState") if systemd else UNKNOWN,
                            "sub_state": props.get("SubState"), "unit_file_state": props.get("UnitFileState"),
                            "enabled": props.get("UnitFileState") in ENABLED_STATES, "active_since": None}
    if not systemd:
        view["enabled"] = None
    elif props.get("ActiveState") == "active":
        view["active_since"] = monotonic_to_utc(props.get("ActiveEnterTimestampMonotonic"))
    return view


def boot_view(name: str, properties: dict[str, str] | None, systemd: bool, state: dict[str, Any] | None,
              state_dir: str) -> dict[str, Any]:
    """What a reboot would start: the boot unit (enabled?) and the release state.json names for boot, with its unit
    (the engine boot program's choice, roles/engine_service/files/engine_boot.py: serving → current, switching → the
    last release that passed its gate, stopped → none)."""
    props = properties or {}
    boots = release_to_boot(state) if state else None
    unit = None
    if boots and "/" not in str(boots):
        try:
            metadata = _json_file(os.path.join(state_dir, "releases", str(boots), RELEASE_FILE))
        except StateError:
            metadata = None
        unit = metadata.get("unit") if isinstance(metadata, dict) else None
    return {"unit": name, "enabled": props.get("UnitFileState") in ENABLED_STATES if systemd else None,
            "unit_file_state": props.get("UnitFileState"), "release": boots, "engine_unit": unit}


VERDICT_FILE = "verdict.json"


def read_verdict(state_dir: str) -> dict[str, Any] | None:
    """The last gate's or verify's verdict the host recorded (verdict.json: release, kind, mode, passed, speedup,
    failures; no secret), with `recorded` (UTC, when it was written: a run with the same outcome leaves it); None
    without one, or when it cannot be read (it is a record, not the state)."""
    path = os.path.join(state_dir, VERDICT_FILE)
    try:
        verdict = _json_file(path)
        recorded = os.stat(path).st_mtime if verdict is not None else None
    except (StateError, OSError):
        return None
    if not isinstance(verdict, dict):
        return None
    keys = ("release", "kind", "mode", "passed", "speedup", "failures")
    return {**{k: verdict.get(k) for k in keys}, "recorded": utc_text(recorded)}


def verdict_text(verdict: dict[str, Any]) -> str:
    said = f"last {verdict['kind']} ({verdict['mode']}) {'passed' if verdict['passed'] else 'FAILED'}"
    if verdict.get("speedup") is not None:
        said += f", speed-up {verdict['speedup']}x"
    return f"{said} {_minutes(verdict['recorded'])}"


# ---------------------------------------------------------------- GPUs

def gpu_view(gpus: list[dict[str, Any]], apps: list[dict[str, Any]], engine_pids: set[int],
             describe) -> dict[str, Any]:
    """Per GPU the memory the engine's processes hold, and the foreign compute holders (pid, user, title and
    what they hold: ``describe(pid)`` gives pid, user and title, never the command line)."""
    by_uuid = {g["uuid"]: g for g in gpus if g.get("uuid")}
    by_bus = {g["bus_id"]: g for g in gpus if g.get("bus_id")}
    engine_mib = {g["index"]: 0 for g in gpus}
    foreign: dict[int, dict[str, Any]] = {}
    for app in apps:
        gpu = by_uuid.get(app.get("gpu_uuid")) or by_bus.get(app.get("bus_id"))
        index = gpu["index"] if gpu else None
        used = app.get("used_mib") or 0
        if app["pid"] in engine_pids:
            if index in engine_mib:
                engine_mib[index] += used
            continue
        if app["pid"] not in foreign:
            foreign[app["pid"]] = {**describe(app["pid"], app.get("name")), "gpus": [], "used_mib": 0}
        entry = foreign[app["pid"]]
        if index is not None and index not in entry["gpus"]:
            entry["gpus"].append(index)
        entry["used_mib"] += used
    return {
        "count": len(gpus),
        "engine_memory_mib": sum(engine_mib.values()),
        "gpus": [{"index": g["index"], "name": g.get("name"), "memory_used_mib": g.get("memory_used_mib"),
                  "memory_total_mib": g.get("memory_total_mib"), "engine_mib": engine_mib[g["index"]]}
                 for g in gpus],
        "foreign": sorted(foreign.values(), key=lambda f: f["pid"]),
    }


# ---------------------------------------------------------------- what is wrong, and the line

def problems_of(status: dict[str, Any], engine_units: dict[str, dict[str, Any]]) -> list[str]:
    """What an operator should look at; empty on a host that serves as state.json says."""
    problems: list[str] = []
    state, unit, health = status["state"], status["unit"], status["health"]
    if state == "none":
        return ["nothing was deployed here (no state.json)"]
    if state == "switching":
        problems.append(f"the deploy of {status['release_id']} did not finish (state.json says switching; the last "
                        f"release that served is {(status.get('boot') or {}).get('release') or 'none'}): "
                        "re-run that deploy")
    if state in ("serving", "switching") and unit["active_state"] not in ("active", UNKNOWN):
        problems.append(f"{unit['name']} is {unit['active_state']}, not active")
    boot = status.get("boot") or {}
    enabled = [name for name, other in engine_units.items() if other.get("enabled")]
    if state in ("serving", "switching") and boot.get("enabled") is False:
        why = f"{boot['unit']} is not enabled ({boot['unit_file_state'] or 'not installed'})"
        problems.append(f"{why}: a reboot starts {', '.join(enabled)} (enabled by a deploy before the boot unit "
                        "existed), whatever state.json names; re-run the deploy" if enabled else
                        f"{why}: a reboot starts no engine")
    elif boot.get("enabled"):
        problems += [f"{name} is enabled: a reboot would start it besides the release state.json names (re-run the "
                     "deploy; it disables it)" for name in enabled]
    if state in ("serving", "switching") and health["status"] != 200:
        answer = f"answered {health['status']}" if health["status"] is not None else health["error"]
        problems.append(f"/health {answer}")
    if state == "stopped" and unit["active_state"] == "active":
        problems.append(f"state.json says stopped but {unit['name']} is active")
    for name, other in engine_units.items():
        if name != unit["name"] and other.get("active_state") == "active":
            problems.append(f"{name} is active too, but the current release runs {unit['name']}")
    if status["rollback"] and not any(r["id"] == status["rollback"] for r in status["releases"]):
        problems.append(f"the rollback target {status['rollback']} is not on disk")
    for holder in status["gpus"].get("foreign", []):
        problems.append(f"pid {holder['pid']} ({holder['user']}, {holder['title']}) holds {holder['used_mib']} MiB "
                        f"on GPU(s) {', '.join(map(str, holder['gpus'])) or '?'}: not the engine's")
    return problems


def _minutes(moment: str) -> str:
    """2026-12-04T18:40:12Z -> 2026-12-04T18:40Z (the line is for reading)."""
    return moment[:16] + "Z" if len(moment) == 20 and moment.endswith("Z") else moment


def summary_line(status: dict[str, Any]) -> str:
    """One line: engine, release, state and since when, /health, GPUs, rollback, problems."""
    if not status["ok"]:
        return f"state unreadable: {status['reason']}"
    if status["state"] == "none":
        return "nothing deployed (no state.json)"
    parts = [f"{status['engine'] or '?'} {status['release_id']} {status['state']}"]
    if status["state"] == "serving" and status["serving_since"] != UNKNOWN:
        parts[0] += f" since {_minutes(status['serving_since'])}"
    health = status["health"]
    if health["status"] is not None:
        parts.append(f"/health {health['status']} in {health['latency_ms']} ms")
    elif status["state"] != "stopped":
        parts.append(f"/health {health['error']}")
    gpus = status["gpus"]
    if gpus["available"]:
        parts.append(f"{gpus['count']} GPUs ({gpus['engine_memory_mib']} MiB held by the engine)")
    else:
        parts.append(f"no GPUs read: {gpus['reason'].split(';')[0]}")
    verdict = status.get("verdict")
    if verdict and verdict["release"] == status["release_id"]:
        parts.append(verdict_text(verdict))
    parts.append(f"rollback → {status['rollback']}" if status["rollback"] else "no rollback target")
    line = ", ".join(parts)
    unsaid = [problem for problem in status["problems"] if not problem.startswith("/health")]  # said above
    if unsaid:
        line += "; PROBLEMS: " + "; ".join(unsaid)
    return line
