"""status.yml's fleet view (plugins/filter/engine_status.py): the fleet's line and report from each host's
engine_status result, and a host's releases as lines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
_spec = importlib.util.spec_from_file_location("engine_status_filters", REPO / "plugins/filter/engine_status.py")
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)


def host(state: str, ok: bool = True, problems: list | None = None) -> dict:
    return {"ok": ok, "state": state, "problems": problems or [], "summary": f"{state} line"}


def test_the_fleet_line_counts_states_and_names_the_hosts_that_did_not_answer_or_have_problems() -> None:
    hosts = {"gpu01": host("serving"), "gpu02": host("serving", problems=["/health answered 503"]),
             "gpu03": host("stopped"), "gpu04": host("unknown", ok=False), "gpu05": host("none"),
             "gpu00": host("unknown", ok=False)}
    report = filters.fleet_status(hosts, "2026-12-04T21:00:00Z")
    assert report["summary"] == ("6 host(s): 1 none, 2 serving, 1 stopped; did not answer or state unreadable: gpu00, "
                                 "gpu04; with problems: gpu02")
    assert report["states"] == {"serving": 2, "stopped": 1, "none": 1}
    assert report["broken"] == ["gpu00", "gpu04"] and report["with_problems"] == ["gpu02"]
    assert report["hosts"] is hosts and report["generated_at"] == "2026-12-04T21:00:00Z"


def test_a_fleet_with_nothing_readable_says_so() -> None:
    assert filters.fleet_status({"gpu01": host("unknown", ok=False)})["summary"] == (
        "1 host(s): none readable; did not answer or state unreadable: gpu01; with problems: none")


def test_release_lines_mark_what_serves_and_what_a_rollback_starts() -> None:
    releases = [
        {"id": "sglang-b", "engine": "sglang", "engine_version": "0.5.23", "profile": "kimi",
         "created": "2026-12-04T18:31:07Z", "current": True, "previous": False, "incomplete": ""},
        {"id": "sglang-a", "engine": "sglang", "engine_version": None, "profile": None, "created": "unknown",
         "current": False, "previous": True, "incomplete": ""},
        {"id": "sglang-c", "engine": None, "engine_version": None, "profile": None, "created": "unknown",
         "current": False, "previous": False, "incomplete": "no release.json (incomplete)"},
    ]
    assert filters.status_release_lines(releases) == [
        "sglang-b: sglang 0.5.23, profile kimi, created 2026-12-04T18:31:07Z (current)",
        "sglang-a: sglang, profile ?, created unknown (rollback)",
        "sglang-c: ?, profile ?, created unknown; no release.json (incomplete)",
    ]
    assert filters.status_release_lines([]) == ["no release on disk"]


def test_rollback_reads_the_engine_units_in_the_shape_the_switch_reads_them() -> None:
    units = {"sglang.service": {"active_state": "active", "enabled": False},
             "vllm.service": {"active_state": "failed", "enabled": True},
             "trt.service": {"active_state": "activating", "enabled": None}}
    assert filters.status_units_as_facts(units) == {
        "sglang.service": {"state": "running", "status": "disabled"},
        "vllm.service": {"state": "failed", "status": "enabled"},
        "trt.service": {"state": "stopped", "status": "disabled"}}
    assert filters.status_units_as_facts(None) == {}
