"""The boot unit's program (roles/engine_service/files/engine_boot.py): at boot it starts the one release state.json
names, from that release's own unit file in /etc/systemd/system, only a unit of the engine roster, and nothing after a
teardown; a state it cannot read fails the unit."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("engine_boot", REPO / "roles/engine_service/files/engine_boot.py")
engine_boot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(engine_boot)


def host(tmp_path: Path, state: dict | str | None, releases: dict[str, str], etc_unit: str | None = None,
         unit: str = "sglang.service") -> dict:
    """A state dir with `releases` ({id: unit text}), /etc's copy of sglang.service, and a systemctl double that
    records its arguments."""
    state_dir, etc, run = tmp_path / "state", tmp_path / "etc", tmp_path / "run"
    for release_id, text in releases.items():
        (state_dir / "releases" / release_id).mkdir(parents=True)
        (state_dir / "releases" / release_id / unit).write_text(text)
        (state_dir / "releases" / release_id / "release.json").write_text(json.dumps({"unit": unit}))
    state_dir.mkdir(exist_ok=True)
    if state is not None:
        (state_dir / "state.json").write_text(state if isinstance(state, str) else json.dumps(state))
    etc.mkdir()
    if etc_unit is not None:
        (etc / "sglang.service").write_text(etc_unit)
    calls = tmp_path / "calls"
    systemctl = tmp_path / "systemctl-double"
    systemctl.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n")
    systemctl.chmod(0o755)
    args = ["--state-dir", str(state_dir), "--unit-dir", str(etc), "--runtime-dir", str(run),
            "--systemctl", str(systemctl), "--unit", "sglang.service", "--unit", "vllm.service"]
    return {"args": args, "calls": calls, "run": run, "etc": etc}


def calls(h: dict) -> list[str]:
    return h["calls"].read_text().splitlines() if h["calls"].exists() else []


def test_serving_starts_the_current_release_and_nothing_else(tmp_path):
    h = host(tmp_path, {"current": "r2", "previous": "r1", "status": "serving"}, {"r1": "one", "r2": "two"}, "two")
    assert engine_boot.main(h["args"]) == 0
    assert calls(h) == ["start --no-block -- sglang.service"]
    assert not h["run"].exists()


def test_a_cut_after_the_new_unit_reached_etc_boots_the_last_good_release_from_its_own_unit_file(tmp_path):
    h = host(tmp_path, {"current": "r2", "previous": "r1", "status": "switching", "boot": "r1"},
             {"r1": "one", "r2": "two"}, etc_unit="two")
    assert engine_boot.main(h["args"]) == 0
    assert (h["etc"] / "sglang.service").read_text() == "one"
    assert oct((h["etc"] / "sglang.service").stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in h["etc"].iterdir()) == ["sglang.service"], "no temporary file is left"
    assert not h["run"].exists(), "the runtime directory, which overrides /etc, is not where it starts from"
    assert calls(h) == ["daemon-reload", "start --no-block -- sglang.service"]


def test_a_copy_in_the_runtime_directory_is_removed_so_the_unit_starts_from_etc(tmp_path, capsys):
    h = host(tmp_path, {"current": "r1", "status": "serving"}, {"r1": "one"}, etc_unit="one")
    h["run"].mkdir()
    (h["run"] / "sglang.service").write_text("[Service]\nExecStart=/bin/sh -c planted\n")
    assert engine_boot.main(h["args"]) == 0
    assert not (h["run"] / "sglang.service").exists()
    assert calls(h) == ["daemon-reload", "start --no-block -- sglang.service"]
    assert "removed (it would override" in capsys.readouterr().out


@pytest.mark.parametrize("unit", ["ssh.service", "getty@tty1.service", "sglang-other.service"])
def test_a_release_that_names_a_unit_outside_the_roster_starts_nothing(tmp_path, unit, capsys):
    h = host(tmp_path, {"current": "r1", "status": "serving"}, {"r1": "[Service]\nExecStart=/bin/true\n"},
             unit=unit)
    assert engine_boot.main(h["args"]) == 1
    assert calls(h) == [] and not (h["etc"] / unit).exists()
    assert (f"release.json names {unit}, not an engine unit of the roster (sglang.service, vllm.service)"
            in capsys.readouterr().err)


def test_without_the_rosters_units_nothing_starts(tmp_path, capsys):
    h = host(tmp_path, {"current": "r1", "status": "serving"}, {"r1": "one"}, etc_unit="one")
    args = [a for a in h["args"] if a not in ("--unit", "sglang.service", "vllm.service")]
    assert engine_boot.main(args) == 1
    assert calls(h) == [] and "(none given)" in capsys.readouterr().err


@pytest.mark.parametrize("state", [None, {"current": "r1", "previous": None, "status": "stopped"},
                                   {"current": "r1", "previous": None, "status": "switching", "boot": None}])
def test_nothing_deployed_a_teardown_or_a_first_deploy_starts_nothing(tmp_path, state, capsys):
    h = host(tmp_path, state, {"r1": "one"}, "one")
    assert engine_boot.main(h["args"]) == 0
    assert calls(h) == [] and "nothing to start" in capsys.readouterr().out


@pytest.mark.parametrize(("state", "message"), [
    ("{not json", "cannot be read"),
    ({"current": "r1", "status": "weird"}, "unknown status 'weird'"),
    ({"current": "../../etc", "status": "serving"}, "not a release directory name"),
    ({"current": "gone", "status": "serving"}, "release.json is missing"),
])
def test_a_state_it_cannot_read_fails_the_unit_and_starts_nothing(tmp_path, state, message, capsys):
    h = host(tmp_path, state, {"r1": "one"}, "one")
    assert engine_boot.main(h["args"]) == 1
    assert calls(h) == [] and message in capsys.readouterr().err


def test_dry_run_says_the_choice_and_changes_nothing(tmp_path, capsys):
    h = host(tmp_path, {"current": "r2", "previous": "r1", "status": "switching"}, {"r1": "one", "r2": "two"}, "two")
    assert engine_boot.main([*h["args"], "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "release": "r1", "unit": "sglang.service", "overlay": True,
        "why": "state.json: switching, the last release that passed its gate"}
    assert calls(h) == [] and not h["run"].exists() and (h["etc"] / "sglang.service").read_text() == "two"
