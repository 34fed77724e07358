"""scripts/ci_playbook.py's summary.json takes the verify report directory from the fact the verify role
publishes (verify_result.report_dir, roles/verify/tasks/report.yml). The whole path, through ansible-runner
and a real verify run, is tested in tests/integration/test_engine_lifecycle.py (site.yml)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "ci_playbook.py"
spec = importlib.util.spec_from_file_location("ci_playbook", SCRIPT)
ci_playbook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ci_playbook)


def event(kind: str, task: str, res: dict) -> dict:
    return {"event": kind, "event_data": {"host": "gpu1", "task": task, "res": res,
                                          "start": "2026-01-01T00:00:00.000000", "end": "2026-01-01T00:00:01.500000"}}


def test_the_report_dir_comes_from_the_published_verify_result():
    runner = SimpleNamespace(
        stats={"ok": {"gpu1": 3}, "changed": {}, "failures": {}, "dark": {}},
        events=[
            event("runner_on_ok", "Name this run's report directory",
                  {"ansible_facts": {"__verify_report_path": "/tmp/not-published"}}),
            event("runner_on_ok", "Publish the verify result",
                  {"ansible_facts": {"verify_result": {"report_dir": "/art/gpu1/20260101T000000Z", "passed": True}}}),
            event("runner_on_ok", "Summary", {"msg": ["report: /art/gpu1/20260101T000000Z/report.md"]}),
        ],
    )
    summary = ci_playbook.host_summaries(runner)["gpu1"]
    assert summary["verify_report"] == "/art/gpu1/20260101T000000Z"
    assert summary["status"] == "ok" and summary["elapsed_s"] == 1.5


def test_no_verify_run_leaves_the_report_empty():
    runner = SimpleNamespace(stats={"ok": {"gpu1": 1}}, events=[event("runner_on_ok", "x", {"changed": False})])
    assert ci_playbook.host_summaries(runner)["gpu1"]["verify_report"] is None
    assert ci_playbook.verify_report_dir({"ansible_facts": {"verify_result": "not a dict"}}) is None


def run_outside_the_venv(*args: str) -> subprocess.CompletedProcess[str]:
    """The script under a Python that has no site-packages at all (-I -S), as `python3` on a fresh machine."""
    return subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, check=False, cwd="/")


def test_help_works_with_any_python3():
    shown = run_outside_the_venv("--help")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: ci_playbook.py") and "--redact-env NAME" in shown.stdout


def test_a_run_without_ansible_runner_says_how_to_get_it_not_a_traceback():
    refused = run_outside_the_venv("verify.yml")
    assert refused.returncode == 2
    assert "Traceback" not in refused.stderr
    assert "ansible-runner is not installed for" in refused.stderr and "source scripts/env.sh" in refused.stderr
