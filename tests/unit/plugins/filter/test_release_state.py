"""state.json transitions (plugins/filter/release_state.py): what a switch, a rollback, an
interrupted deploy and a teardown leave behind, and which release directories are pruned."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
spec = importlib.util.spec_from_file_location(
    "release_state", REPO / "plugins/filter/release_state.py")
rs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rs)

SERVING = {"current": "sglang-a", "previous": "vllm-p", "status": "serving"}


def test_a_state_written_before_status_existed_reads_as_serving():
    assert rs.release_state({"current": "sglang-a", "previous": None}) == {
        "current": "sglang-a", "previous": None, "status": "serving"}
    assert rs.release_state(None) == {"current": None, "previous": None, "status": "stopped"}


def test_an_unknown_status_is_refused():
    with pytest.raises(ValueError, match="unknown status 'weird'"):
        rs.release_state({"current": "a", "status": "weird"})


def test_a_successful_switch_keeps_what_served_as_previous():
    switching = rs.release_state_switching(SERVING, "sglang-b")
    assert switching == {"current": "sglang-b", "previous": "sglang-a", "status": "switching", "boot": "sglang-a"}
    assert rs.release_state_serving(SERVING, "sglang-b") == {
        "current": "sglang-b", "previous": "sglang-a", "status": "serving"}


def test_an_interrupted_deploy_claims_nothing_serves_and_its_rerun_finishes_it():
    interrupted = rs.release_state_switching(SERVING, "sglang-b")
    assert interrupted["status"] != "serving"
    # The re-run of the same deploy: the rollback target is still the last release that served.
    assert rs.release_rollback_target(interrupted, "sglang-b") == "sglang-a"
    assert rs.release_state_serving(interrupted, "sglang-b") == {
        "current": "sglang-b", "previous": "sglang-a", "status": "serving"}
    # A different deploy after the interruption never names the unconfirmed release as a rollback target.
    assert rs.release_rollback_target(interrupted, "sglang-c") == "sglang-a"
    assert rs.release_state_serving(interrupted, "sglang-c")["previous"] == "sglang-a"


def test_a_rollback_keeps_the_previous_release_of_the_one_it_went_back_to():
    after = rs.release_state_rolled_back(SERVING, "sglang-a", "sglang-b")
    assert after == {"current": "sglang-a", "previous": "vllm-p", "status": "serving", "failed": "sglang-b"}


def test_a_failed_redeploy_of_the_current_release_goes_back_to_previous_and_never_to_itself():
    assert rs.release_rollback_target(SERVING, "sglang-a") == "vllm-p"
    after = rs.release_state_rolled_back(SERVING, "vllm-p", "sglang-a")
    assert after["current"] == "vllm-p" and after["previous"] is None


def test_nothing_to_roll_back_to_on_a_fresh_host():
    assert rs.release_rollback_target(rs.release_state(None), "sglang-a") is None
    first = rs.release_state_switching(None, "sglang-a")
    assert rs.release_rollback_target(first, "sglang-a") is None


def test_teardown_records_stopped_and_keeps_the_release_to_come_back_to():
    stopped = rs.release_state_stopped({**SERVING, "failed": "x"})
    assert stopped == {"current": "sglang-a", "previous": "vllm-p", "status": "stopped"}
    assert rs.release_state_stopped(stopped) == stopped, "a second teardown changes nothing"
    assert rs.release_rollback_target(stopped, "sglang-b") == "sglang-a"
    # Teardown after an interrupted deploy: the unconfirmed release is not kept as current.
    interrupted = rs.release_state_switching(SERVING, "sglang-b")
    assert rs.release_state_stopped(interrupted) == {"current": "sglang-a", "previous": None, "status": "stopped"}


def test_redeploying_the_release_that_serves_boots_it_meanwhile_and_keeps_its_previous():
    # Its unit had stopped, say: while it is started again, a reboot starts it, and a failed gate goes to vllm-p.
    switching = rs.release_state_switching(SERVING, "sglang-a")
    assert switching == {"current": "sglang-a", "previous": "vllm-p", "status": "switching", "boot": "sglang-a"}
    assert rs.release_to_boot(switching) == "sglang-a"
    assert rs.release_state_serving(switching, "sglang-a") == {
        "current": "sglang-a", "previous": "vllm-p", "status": "serving"}


def test_the_rerun_after_an_interrupted_deploy_of_another_release_boots_the_one_that_served():
    # A deploy of h was cut before its gate; the re-run deploys c, the last release that served, again.
    cut = {"current": "sglang-h", "previous": "sglang-c", "status": "switching"}  # written before `boot` existed
    assert rs.release_to_boot(cut) == "sglang-c"
    rerun = rs.release_state_switching(cut, "sglang-c")
    assert rerun == {"current": "sglang-c", "previous": None, "status": "switching", "boot": "sglang-c"}
    assert rs.release_to_boot(rerun) == "sglang-c"


def test_nothing_boots_during_a_first_deploy_or_a_deploy_on_a_host_teardown_stopped():
    assert rs.release_to_boot(rs.release_state_switching(None, "sglang-a")) is None
    stopped = rs.release_state_stopped(SERVING)
    switching = rs.release_state_switching(stopped, "sglang-b")
    assert rs.release_to_boot(stopped) is None and rs.release_to_boot(switching) is None
    # A failed gate still goes back to the release teardown stopped (it served), as before.
    assert rs.release_rollback_target(stopped, "sglang-b") == "sglang-a" == switching["previous"]


def _rollback(state: dict | None, named: str | None = None) -> list[dict]:
    """What rollback.yml writes to state.json, in order: the switch, then serving (restore.yml)."""
    target = named or rs.release_to_restore(state)
    switching = rs.release_state_switching(state, target, "rollback")
    return [switching, rs.release_state_serving(switching, target)]


@pytest.mark.parametrize("before", [
    SERVING,  # rollback.yml with no release: back to the previous one
    # after an interrupted deploy of sglang-b: back to the one that served (its rollback target is then none)
    rs.release_state_switching(SERVING, "sglang-b"),
    rs.release_state_stopped(SERVING),  # after teardown
])
def test_a_rollback_cut_at_any_point_converges_when_re_run_with_no_release(before: dict) -> None:
    """Each state.json a power cut can leave (before the switch, switching, serving): rollback.yml re-run with no
    release ends where the uncut one ended."""
    switching, finished = _rollback(before)
    assert switching["by"] == "rollback" and "by" not in finished
    assert rs.release_to_restore(switching) == switching["current"]  # finish it, never undo it
    rerun_switching, rerun_finished = _rollback(switching)
    assert rerun_finished == finished and rerun_switching == switching
    assert _rollback(before)[1] == finished  # cut before the switch: the same run again


def test_a_rollback_to_a_named_release_cut_mid_switch_is_finished_by_a_bare_re_run() -> None:
    switching, finished = _rollback(SERVING, named="sglang-old")
    assert _rollback(switching)[1] == finished == {"current": "sglang-old", "previous": "sglang-a",
                                                   "status": "serving"}


def test_an_interrupted_deploy_is_undone_by_a_bare_rollback_and_only_a_switch_by_rollback_is_finished() -> None:
    interrupted = rs.release_state_switching(SERVING, "sglang-b")
    assert "by" not in interrupted
    assert rs.release_to_restore(interrupted) == "sglang-a"  # the release that served before the deploy
    assert rs.release_to_restore(SERVING) == "vllm-p" and rs.release_to_restore(None) is None
    with pytest.raises(ValueError, match="a deploy or a rollback, not 'teardown'"):
        rs.release_state_switching(SERVING, "sglang-b", "teardown")


@pytest.mark.parametrize("state", [
    None, SERVING, {"current": "a", "previous": None}, rs.release_state_stopped(SERVING),
    rs.release_state_switching(SERVING, "sglang-b", "rollback"),
    rs.release_state_switching(SERVING, "sglang-b"), rs.release_state_switching(SERVING, "sglang-a"),
    rs.release_state_switching(None, "sglang-a"),
    {"current": "sglang-h", "previous": "sglang-c", "status": "switching"},
    rs.release_state_switching(rs.release_state_stopped(SERVING), "sglang-b"),
])
def test_the_boot_units_program_boots_what_the_deploy_means_by_state_json(state):
    """Parity: roles/engine_service/files/engine_boot.py (on the host, at boot) and release_to_boot (deploy, status)."""
    boot_spec = importlib.util.spec_from_file_location(
        "engine_boot", REPO / "roles/engine_service/files/engine_boot.py")
    engine_boot = importlib.util.module_from_spec(boot_spec)
    boot_spec.loader.exec_module(engine_boot)
    assert engine_boot.release_to_boot(state)[0] == rs.release_to_boot(state)


def dirs(*names_mtimes):
    return [{"path": f"/var/lib/llm-serving/releases/{n}", "mtime": m} for n, m in names_mtimes]


def test_pruning_keeps_the_newest_besides_current_and_previous():
    found = dirs(("r1", 1), ("r2", 2), ("r3", 3), ("r4", 4), ("r5", 5))
    assert rs.releases_to_prune(found, 1, ["r5", "r4"]) == [
        "/var/lib/llm-serving/releases/r2", "/var/lib/llm-serving/releases/r1"]


def test_pruning_never_removes_current_or_previous_however_old():
    found = dirs(("current", 1), ("previous", 2), ("r3", 3), ("r4", 4))
    assert rs.releases_to_prune(found, 0, ["current", "previous", None]) == [
        "/var/lib/llm-serving/releases/r4", "/var/lib/llm-serving/releases/r3"]
    assert rs.releases_to_prune(found, 5, ["current", "previous"]) == []


def test_pruning_refuses_a_negative_count():
    with pytest.raises(ValueError, match="0 or more"):
        rs.releases_to_prune([], -1, [])
