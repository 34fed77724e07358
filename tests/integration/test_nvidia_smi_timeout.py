"""The nvidia_driver role's nvidia-smi check ends at its timeout and says so (roles/nvidia_driver/tasks/activate.yml).

The two tasks are taken from the role's own file, unchanged, and run by ansible-playbook (tests/playbook_run.py) on
localhost with a stand-in nvidia-smi first on PATH: one that hangs, one that fails as nvidia-smi does without a driver.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from tests.playbook_run import PlaybookRun, run_playbook

REPO = Path(__file__).resolve().parents[2]
ACTIVATE = REPO / "roles" / "nvidia_driver" / "tasks" / "activate.yml"
TASKS = ("Query every GPU", "Say when nvidia-smi did not answer in time or failed")


def role_tasks() -> list[dict]:
    block = next(t for t in yaml.safe_load(ACTIVATE.read_text()) if t.get("name") == "Check the GPUs with nvidia-smi")
    tasks = [t for t in block["block"] if t.get("name") in TASKS]
    assert [t["name"] for t in tasks] == list(TASKS)
    return tasks


def run_check(tmp_path: Path, nvidia_smi_body: str) -> PlaybookRun:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{nvidia_smi_body}\n")
    smi.chmod(0o755)
    playbook = tmp_path / "check.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"nvidia_driver_smi_timeout_s": 1, "ansible_python_interpreter": sys.executable},
        "environment": {"PATH": f"{bin_dir}:{os.environ['PATH']}"},
        "tasks": role_tasks(),
    }]))
    return run_playbook(playbook, "localhost,", workdir=tmp_path, timeout=120,
                        envvars={"ANSIBLE_LOCALHOST_WARNING": "0"})


def failure_message(run: PlaybookRun) -> str:
    return next(r["msg"] for r in run.task_events_results() if r["_event"] == "runner_on_failed" and "msg" in r)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_hung_nvidia_smi_ends_at_the_timeout_with_a_message(tmp_path):
    # The stand-in hangs for 10 minutes: only the 1 s timeout's kill ends it before run_playbook's 120 s limit
    # (which fails the test), and the process is gone afterwards: the bound is shown by outcome, not by a clock.
    pid_file = tmp_path / "nvidia-smi.pid"
    proc = run_check(tmp_path, f'echo $$ > "{pid_file}"; exec sleep 600')
    assert proc.rc != 0
    assert not alive(int(pid_file.read_text())), "the hung nvidia-smi was not killed at the timeout"
    message = " ".join(failure_message(proc).split())
    assert message.startswith("nvidia-smi did not answer within 1 s (nvidia_driver_smi_timeout_s) and was killed")
    assert "nvidia-smi -r" in message


def test_failing_nvidia_smi_shows_its_own_message(tmp_path):
    proc = run_check(tmp_path, 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA '
                                  'driver."; exit 9')
    assert proc.rc != 0
    message = " ".join(failure_message(proc).split())
    assert message.startswith("nvidia-smi failed (rc 9): NVIDIA-SMI has failed because it couldn't communicate")
