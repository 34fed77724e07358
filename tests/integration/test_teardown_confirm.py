"""teardown.yml's question (plugins/action/confirm.py, roles/engine_service/tasks/teardown_plan.yml), with the real
ansible-playbook on the controller: on a pseudo-terminal it prints the lines and goes on only on "yes"; where nobody
can answer (ansible-runner, CI, cron) it refuses unless -e teardown_confirm=yes answers ahead; with -e
teardown_confirm or in --check it asks nothing. The play here runs on localhost and changes nothing but a file under
tmp_path, which says whether the play went past the question. The whole teardown.yml at a terminal, against a
serving host, is in the host scenarios (tests/integration/real_engine_scenario.py, teardown_stops_the_engine)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.engine_host import REPO
from tests.playbook_run import run_at_a_terminal, run_playbook

sys.path.insert(0, str(REPO / "plugins" / "filter"))
from engine_status import teardown_plan

PLAY = [{
    "name": "a question before a change", "hosts": "localhost", "gather_facts": False, "connection": "local",
    "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
    "tasks": [
        {"name": "ask", "blackwell.serving.confirm": {
            "question": "Stop the engines above?",
            "lines": ["gpu01: stops sglang.service; release r1 (sglang, serving)"],
            "confirm": "{{ teardown_confirm | default(omit) }}", "variable": "teardown_confirm"},
         "register": "answer"},
        {"name": "how", "ansible.builtin.debug": {"msg": "{{ answer.how }}: {{ answer.msg }}"}},
        {"name": "past the question", "ansible.builtin.copy": {"content": "went on\n", "dest": "{{ marker }}",
                                                               "mode": "0644"}},
    ]}]


def write_play(tmp_path: Path) -> Path:
    (tmp_path / "play.yml").write_text(yaml.safe_dump(PLAY, sort_keys=False))
    return tmp_path / "play.yml"


def at_a_terminal(tmp_path: Path, answer: str | None, *extra: str) -> tuple[int, str]:
    """The play on a pseudo-terminal; `answer` typed at the question (None: nothing typed)."""
    return run_at_a_terminal(write_play(tmp_path), "localhost,", answer, wait_for="Type yes to go on", timeout=120,
                             extra_args=["-e", f"marker={tmp_path / 'marker'}", *extra])


def test_at_a_terminal_it_shows_what_would_stop_and_goes_on_on_yes(tmp_path):
    rc, printed = at_a_terminal(tmp_path, "yes")
    assert rc == 0, printed[-3000:]
    assert "gpu01: stops sglang.service; release r1 (sglang, serving)" in printed
    assert "Stop the engines above? Type yes to go on (or give -e teardown_confirm=yes):" in printed
    assert (tmp_path / "marker").read_text() == "went on\n"
    assert "answered: Confirmed at the terminal." in printed


@pytest.mark.parametrize("answer", ["no", "", "yes please"])
def test_at_a_terminal_anything_but_yes_stops_before_the_change(tmp_path, answer):
    rc, printed = at_a_terminal(tmp_path, answer)
    assert rc != 0, printed[-3000:]
    assert f"Not confirmed (the answer was {answer!r}, not yes): stopped before anything changed." in printed
    assert not (tmp_path / "marker").exists()


def test_under_ansible_runner_it_refuses_unless_answered_ahead(tmp_path):
    """ansible-runner (CI, AWX) gives ansible-playbook a pseudo-terminal that nobody types at: a job that stops
    serving must say so in its own command line."""
    run = run_playbook(write_play(tmp_path), "localhost,", extravars={"marker": str(tmp_path / "marker")})
    assert run.status == "failed", run.stdout[-3000:]
    assert run.result("ask")["msg"] == (
        "Nobody to ask: run by ansible-runner, whose terminal nobody types at. Refusing to go on unasked: give -e "
        "teardown_confirm=yes to go on without the question. Stopped before anything changed.")
    assert "Type yes" not in run.stdout and not (tmp_path / "marker").exists()
    told = run_playbook(write_play(tmp_path), "localhost,",
                        extravars={"marker": str(tmp_path / "marker"), "teardown_confirm": "yes"})
    assert told.status == "successful", told.stdout[-3000:]
    assert told.result("how")["msg"] == "given: Confirmed by teardown_confirm=yes."
    assert (tmp_path / "marker").exists()


@pytest.mark.parametrize(("given", "goes_on"), [("yes", True), ("true", True), ("no", False)])
def test_an_answer_given_ahead_is_not_asked_again_at_a_terminal(tmp_path, given, goes_on):
    rc, printed = at_a_terminal(tmp_path, None, "-e", f"teardown_confirm={given}")
    assert "Type yes" not in printed
    assert (rc == 0) is goes_on and (tmp_path / "marker").exists() is goes_on, printed[-3000:]
    if goes_on:
        assert "given: Confirmed by teardown_confirm=yes." in printed
    else:
        assert "teardown_confirm=no: stopped before anything changed." in printed


def test_check_mode_asks_nothing(tmp_path):
    rc, printed = at_a_terminal(tmp_path, None, "--check")
    assert rc == 0 and "Type yes" not in printed, printed[-3000:]
    assert "check mode: Check mode: nothing changes, so nothing is asked." in printed


def test_the_plan_names_each_host_its_running_units_and_release():
    units = {"sglang.service": {"active_state": "active"}, "vllm.service": {"active_state": "inactive"}}
    running = {"ok": True, "state": "serving", "release_id": "sglang-7222bd6d61dd", "engine": "sglang",
               "engine_units": units}
    stopped = {"ok": True, "state": "stopped", "release_id": "vllm-0b1c", "engine": "vllm",
               "engine_units": {**units, "sglang.service": {"active_state": "inactive"},
                                "vllm.service": {"active_state": "failed"}}}
    broken = {"ok": False, "reason": "state.json is not valid JSON: Expecting value"}
    failed_read = {"failed": True, "msg": "MODULE FAILURE"}
    assert teardown_plan({"gpu01": running, "gpu02": stopped, "gpu03": broken, "gpu04": failed_read,
                          "gpu05": None}) == [
        "gpu01: stops sglang.service; release sglang-7222bd6d61dd (sglang, serving)",
        "gpu02: no engine unit running; release vllm-0b1c (vllm, stopped)",
        "gpu03: state not readable (state.json is not valid JSON: Expecting value); every engine unit is stopped",
        "gpu04: state not readable (MODULE FAILURE); every engine unit is stopped",
        "gpu05: state not readable (no answer); every engine unit is stopped",
    ]
