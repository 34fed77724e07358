"""The fleet status filters (status.yml, roles/engine_service/tasks/status.yml): the fleet's line and report from each
host's engine_status result, and a host's releases as lines. Controller side; the host's own line is the module's."""

from __future__ import annotations

from typing import Any

from ansible_collections.blackwell.serving.plugins.module_utils.release.baselines import baseline_lines


def status_release_lines(releases: list[dict[str, Any]]) -> list[str]:
    """One line per release kept on the host, newest first: id, engine and version, created, and which one serves
    and which one a rollback starts."""
    lines = []
    for release in releases or []:
        marks = [mark for mark, on in (("current", release.get("current")), ("rollback", release.get("previous")))
                 if on]
        line = (f"{release['id']}: {release.get('engine') or '?'} {release.get('engine_version') or ''}".rstrip()
                + f", profile {release.get('profile') or '?'}, created {release.get('created') or 'unknown'}")
        if marks:
            line += f" ({', '.join(marks)})"
        if release.get("incomplete"):
            line += f"; {release['incomplete']}"
        lines.append(line)
    return lines or ["no release on disk"]


def status_baseline_lines(baselines: list[dict[str, Any]]) -> list[str]:
    """One line per throughput baseline recorded on the host (engine_status's baselines), newest first."""
    return baseline_lines(baselines)


def fleet_status(hosts: dict[str, dict[str, Any]], generated_at: str = "") -> dict[str, Any]:
    """The report status.yml writes: every host's status, and the fleet's counts by state, the hosts that did not
    answer or whose state cannot be read (`broken`), those with problems, and one line saying it all."""
    states: dict[str, int] = {}
    for status in hosts.values():
        if status.get("ok"):
            states[status["state"]] = states.get(status["state"], 0) + 1
    broken = sorted(host for host, status in hosts.items() if not status.get("ok"))
    troubled = sorted(host for host, status in hosts.items() if status.get("ok") and status.get("problems"))
    counted = ", ".join(f"{count} {state}" for state, count in sorted(states.items())) or "none readable"
    line = (f"{len(hosts)} host(s): {counted}; did not answer or state unreadable: {', '.join(broken) or 'none'}; "
            f"with problems: {', '.join(troubled) or 'none'}")
    return {"generated_at": generated_at, "summary": line, "states": states, "broken": broken,
            "with_problems": troubled, "hosts": hosts}


def teardown_plan(hosts: dict[str, Any]) -> list[str]:
    """What teardown.yml would stop, one line per host, from each host's engine_status result (None or a result
    without a summary where the host could not be read): the engine units running, the release that serves."""
    lines = []
    for host, status in hosts.items():
        if not isinstance(status, dict) or not status.get("ok"):
            why = status.get("reason") or status.get("msg") if isinstance(status, dict) else None
            lines.append(f"{host}: state not readable ({why or 'no answer'}); every engine unit is stopped")
            continue
        running = sorted(name for name, unit in (status.get("engine_units") or {}).items()
                         if unit.get("active_state") in ("active", "activating", "reloading", "deactivating"))
        release = status.get("release_id") or "no release"
        what = f"stops {', '.join(running)}" if running else "no engine unit running"
        lines.append(f"{host}: {what}; release {release} ({status.get('engine') or '?'}, {status.get('state')})")
    return lines


def status_units_as_facts(engine_units: dict[str, Any]) -> dict[str, dict[str, str]]:
    """engine_status's engine_units ({unit: {active_state, enabled}}) in the shape a deploy's switch reads them (the
    engine_release module's units: state running/failed/stopped, status enabled/disabled), for rollback.yml."""
    facts = {}
    for name, unit in (engine_units or {}).items():
        active = unit.get("active_state")
        state = "running" if active == "active" else "failed" if active == "failed" \
            else "stopped"
        facts[name] = {"state": state, "status": "enabled" if unit.get("enabled") else "disabled"}
    return facts


class FilterModule:
    def filters(self) -> dict:
        return {"fleet_status": fleet_status, "status_release_lines": status_release_lines,
                "status_baseline_lines": status_baseline_lines,
                "status_units_as_facts": status_units_as_facts, "teardown_plan": teardown_plan}
