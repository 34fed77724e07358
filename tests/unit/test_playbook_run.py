"""tests/playbook_run.py against real ansible-playbook runs on localhost: what it reads from ansible-runner's events
(recap, results by task and role, tasks started, check mode, failures, ad-hoc module results) is what the play did
and what ansible-playbook printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.playbook_run import run_module, run_playbook

pytestmark = pytest.mark.integration

TASKS = [
    {"name": "Say hello", "ansible.builtin.debug": {"msg": "hello"}},
    {"name": "Write a file", "ansible.builtin.copy": {"content": "x\n", "dest": "{{ target }}", "mode": "0644"}},
    {"name": "Never", "ansible.builtin.debug": {"msg": "no"}, "when": False},
    {"name": "Fail and go on", "ansible.builtin.fail": {"msg": "expected"}, "ignore_errors": True},
    {"name": "Loop", "ansible.builtin.debug": {"msg": "{{ item }}"}, "loop": [1, 2]},
]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("project")
    (root / "roles" / "probe" / "tasks").mkdir(parents=True)
    (root / "roles" / "probe" / "tasks" / "main.yml").write_text(yaml.safe_dump(
        [{"name": "Probe | inside the role", "ansible.builtin.debug": {"msg": "role"}}]))
    (root / "ansible.cfg").write_text("[defaults]\nroles_path = roles\nstdout_callback = ansible.builtin.default\n")
    (root / "play.yml").write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [*TASKS, {"name": "Probe", "ansible.builtin.include_role": {"name": "probe"}}]}]))
    (root / "broken.yml").write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "Stop here", "ansible.builtin.fail": {"msg": "stopped on purpose"}},
                  {"name": "Not reached", "ansible.builtin.debug": {"msg": "no"}}]}]))
    return root


def printed_recap(stdout: str, host: str) -> dict[str, int]:
    """ansible-playbook's own PLAY RECAP line, for parity with the events."""
    line = re.search(rf"^{host}\s+:\s+(.*)$", stdout.rsplit("PLAY RECAP", 1)[1], re.MULTILINE)
    assert line, stdout[-2000:]
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line.group(1))}


def test_recap_results_and_task_names_are_what_the_play_did_and_printed(project, tmp_path):
    target = tmp_path / "written"
    run = run_playbook("play.yml", "localhost,", extravars={"target": str(target)}, project_dir=project,
                       workdir=tmp_path, envvars={"ANSIBLE_LOCALHOST_WARNING": "0"})
    assert (run.status, run.rc) == ("successful", 0), run.stdout[-2000:]
    recap = run.recap("localhost")
    printed = printed_recap(run.stdout, "localhost")
    assert {key: recap[key] for key in printed} == printed
    assert (recap["changed"], recap["skipped"], recap["ignored"]) == (1, 1, 1)
    assert run.played("localhost") and not run.played("elsewhere")
    assert run.result("Say hello")["msg"] == "hello"
    assert run.result("Write a file", "localhost")["changed"] is True and target.read_text() == "x\n"
    assert [r["_event"] for r in run.results("Never")] == ["runner_on_skipped"]
    assert [r["_event"] for r in run.results("Fail and go on")] == ["runner_on_failed"]
    assert [item["msg"] for item in run.result("Loop")["results"]] == [1, 2]
    in_role = run.result("probe : Probe | inside the role")
    assert in_role["msg"] == "role" and in_role == run.result("Probe | inside the role")
    assert run.tasks_started[-1] == "probe : Probe | inside the role"
    assert run.task_names[:2] == ["Say hello", "Write a file"]
    with pytest.raises(KeyError, match="no result of 'Absent'; tasks that ran"):
        run.result("Absent")


def test_check_mode_changes_nothing_and_a_failed_play_says_where(project, tmp_path):
    target = tmp_path / "not-written"
    checked = run_playbook("play.yml", "localhost,", extravars={"target": str(target)}, check=True, diff=True,
                           project_dir=project, workdir=tmp_path)
    assert checked.rc == 0 and not target.exists()
    assert checked.result("Write a file")["changed"] is True, "check mode reports the change it would make"
    broken = run_playbook("broken.yml", "localhost,", project_dir=project, workdir=tmp_path)
    assert (broken.status, broken.rc) == ("failed", 2)
    assert broken.recap("localhost")["failed"] == 1 == printed_recap(broken.stdout, "localhost")["failed"]
    assert broken.result("Stop here")["msg"] == "stopped on purpose"
    assert "Not reached" not in broken.tasks_started


def test_without_a_workdir_nothing_is_left_behind_and_an_ad_hoc_module_returns_its_result(project, tmp_path):
    run = run_playbook("broken.yml", "localhost,", project_dir=project)
    assert not run.artifact_dir.exists()
    ok = run_module("ansible.builtin.stat", f"path={project / 'play.yml'}", workdir=tmp_path)
    assert ok["stat"]["exists"] is True and "failed" not in ok
    failed = run_module("ansible.builtin.fail", "msg=nope", workdir=tmp_path)
    assert failed["failed"] is True and failed["msg"] == "nope"
