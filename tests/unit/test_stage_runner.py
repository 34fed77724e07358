"""The test command's scheduler (tests/stage_runner.py, which scripts/test.sh runs): every stage runs or is reported
as skipped with why, a failure stops only what needs it, the budget holds, an overdue stage's group is ended, and
the closing line names what did not pass and counts the JUnit test cases.

The stages here are real processes (sh); the clock is injected, so nothing here depends on how fast this machine
is. The JUnit file is pytest's own, written under this project's pytest settings (pyproject.toml) for a tiny test
file with passes, a failure, an error, a skip and an expected failure."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.stage_runner import (
    PARTS,
    Printer,
    Runner,
    StageSpec,
    closing_lines,
    junit_counts,
    main,
    stage_environment,
    stage_specs,
    wanted_specs,
)

REPO = Path(__file__).resolve().parents[2]
TINY_TESTS = '''
import pytest


@pytest.fixture
def broken():
    raise RuntimeError("a fixture that breaks")


def test_passes(record_property):
    record_property("tiny_property", "recorded-value")


def test_passes_too():
    pass


def test_fails():
    assert 1 == 2


def test_errors(broken):
    pass


@pytest.mark.skip(reason="skipped on purpose")
def test_skipped():
    pass


@pytest.mark.xfail(strict=True, reason="a known defect")
def test_expected_failure():
    assert 1 == 2
'''
@pytest.fixture(scope="module")
def junit_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The JUnit file pytest writes for the tiny tests, and what pytest printed."""
    work = tmp_path_factory.mktemp("tiny")
    (work / "test_tiny.py").write_text(TINY_TESTS)
    junit = work / "pytest.xml"
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    ran = subprocess.run([sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(work),
                          "-p", "no:cacheprovider", "-W", "default", f"--junitxml={junit}", str(work / "test_tiny.py")],
                         cwd=work, env=environment, capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 1, ran.stdout + ran.stderr  # a test failed
    return junit, ran.stdout + ran.stderr


def sh(name: str, script: str, needs: tuple[str, ...] = (), slots: int = 1, junit: tuple[str, ...] = ()) -> StageSpec:
    return StageSpec(name, "unit", ("sh", "-c", script), needs, slots, junit)


class StepClock:
    """A clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(specs: list[StageSpec], results: Path, *, slots: int = 4, timeout_s: float = 3000, clock=None,
        kill_grace_s: float = 5) -> tuple[list, list[str]]:
    results.mkdir(exist_ok=True)
    out = io.StringIO()
    runner = Runner(specs, results, slots=slots, timeout_s=timeout_s, printer=Printer(out),
                    clock=clock or StepClock(), poll_s=0.01, kill_grace_s=kill_grace_s)
    outcomes = runner.run()
    return outcomes, out.getvalue().splitlines() + closing_lines(outcomes)


def test_a_failed_stage_stops_only_what_needs_it_and_every_stage_is_reported(tmp_path: Path):
    specs = [sh("setup", "echo set up"), sh("lint", "echo lint says no; exit 3", ("setup",)),
             sh("units", "echo units ok", ("setup",)), sh("hosts", "echo never", ("lint",)),
             sh("after-hosts", "echo never", ("hosts",))]
    outcomes, lines = run(specs, tmp_path / "results")
    assert {o.name: o.status for o in outcomes} == {"setup": "passed", "lint": "failed", "units": "passed",
                                                    "hosts": "skipped", "after-hosts": "skipped"}
    assert "[lint] lint says no" in lines and "[units] units ok" in lines and "[hosts] never" not in lines
    table = lines[lines.index("### stages (name, started at, took, status; test cases)") + 1:-1]
    assert [row.split()[0] for row in table] == ["setup", "lint", "units", "hosts", "after-hosts"], table
    assert "SKIPPED (needs lint, which failed)" in table[3] and "SKIPPED (needs hosts, which did not run)" in table[4]
    assert lines[-1] == ("FAILED: lint (exit 3), hosts (skipped: needs lint, which failed), after-hosts (skipped: "
                         "needs hosts, which did not run); 2 of 5 stages passed; 0 tests (0 passed)"), lines[-1]
    assert (tmp_path / "results" / "lint.log").read_text() == "lint says no\n"


def test_the_closing_line_names_failed_tests_and_counts_every_stages_cases(tmp_path: Path, junit_run):
    junit, _ = junit_run
    results = tmp_path / "results"
    results.mkdir()
    (results / "pytest.xml").write_text(junit.read_text())
    (results / "molecule-default.xml").write_text(junit.read_text())
    specs = [sh("units", "exit 1", junit=("pytest.xml",)), sh("molecule-default", "exit 0", junit=("molecule-*.xml",))]
    outcomes, lines = run(specs, results)
    elements = junit_elements(junit)
    assert elements["testcase"] == 6, elements
    # the verifier's stage exited 0, but its JUnit file holds failures: it did not pass
    assert [o.status for o in outcomes] == ["failed", "failed"]
    assert lines[-1] == ("FAILED: units (2 failed), molecule-default (2 failed); 0 of 2 stages passed; "
                         "12 tests (4 passed, 4 failed, 4 skipped)"), lines[-1]
    assert "of the skipped tests, 2 are expected failures" in lines[-2], lines
    # A log read from its end (CI keeps only the end) says why each test failed, before the table.
    failed = lines[lines.index("### failed tests (stage: test: the start of its failure)") + 1:
                   lines.index("### stages (name, started at, took, status; test cases)") - 1]
    assert len(failed) == 4 and failed[0].startswith("  units: ") and failed[2].startswith("  molecule-default: "), \
        failed
    assert "test_tiny::test_fails: assert 1 == 2" in failed[0], failed
    assert "test_tiny::test_errors: " in failed[1] and "RuntimeError: a fixture that breaks" in failed[1], failed


def test_a_failure_message_is_cut_to_its_start_on_one_line(tmp_path: Path):
    junit, long_message = tmp_path / "long.xml", "AssertionError: Rolling back ALSO failed&#10;" + "x" * 900
    junit.write_text('<testsuites><testsuite><testcase classname="tests.integration.test_host" name="test_rollback">'
                     f'<failure message="{long_message}">trace</failure></testcase></testsuite></testsuites>')
    [line] = junit_counts(junit).failures
    assert line.startswith("tests.integration.test_host::test_rollback: AssertionError: Rolling back ALSO failed x")
    assert line.endswith("x ...") and len(line) < 500 and "\n" not in line, line


def test_all_passed_says_so_last(tmp_path: Path):
    _outcomes, lines = run([sh("a", "true"), sh("b", "true", ("a",))], tmp_path / "results")
    assert lines[-1] == "PASSED: 2 of 2 stages passed; 0 tests (0 passed)"


def test_a_stage_with_tests_that_wrote_no_junit_did_not_pass(tmp_path: Path):
    outcomes, lines = run([sh("units", "exit 0", junit=("pytest.xml",))], tmp_path / "results")
    assert outcomes[0].status == "failed" and "wrote no JUnit file: its tests did not run" in lines[-1]


def test_a_cut_junit_file_counts_as_a_failure(tmp_path: Path):
    cut = tmp_path / "cut.xml"
    cut.write_text("<testsuites><testsuite><testcase name='a'/>")
    counts = junit_counts(cut)
    assert counts.failed == 1 and counts.failures == ["cut.xml: the JUnit file cannot be read (cut short by a killed "
                                                      "stage?)"], counts


def test_the_budget_holds_stages_back_until_slots_are_free(tmp_path: Path):
    """Two 2-slot stages in a budget of 3 never overlap: the second starts after the first ended (order of the
    runner's own lines), and a stage bigger than the budget still runs, alone."""
    marks = tmp_path / "marks"
    specs = [sh("big-a", f"echo a-start >> {marks}; sleep 0.3; echo a-end >> {marks}", slots=2),
             sh("big-b", f"echo b-start >> {marks}; echo b-end >> {marks}", slots=2),
             sh("huge", f"echo huge >> {marks}", ("big-a", "big-b"), slots=9)]
    outcomes, _ = run(specs, tmp_path / "results", slots=3)
    assert marks.read_text().split() == ["a-start", "a-end", "b-start", "b-end", "huge"]
    assert all(o.passed for o in outcomes)


def test_small_stages_run_beside_a_big_one(tmp_path: Path):
    marks = tmp_path / "marks"
    # "small" waits for "big" to have started and "big" for "small" to have written: only side by side do both end
    specs = [sh("big", f"echo big >> {marks}; until grep -q small {marks}; do sleep 0.01; done", slots=2),
             sh("small", f"until grep -q big {marks}; do sleep 0.01; done; echo small >> {marks}")]
    outcomes, _ = run(specs, tmp_path / "results", slots=3, timeout_s=60, clock=None)
    assert [o.status for o in outcomes] == ["passed", "passed"]


class JumpingClock(StepClock):
    """Past every deadline once the stage has started: the runner's time limit, with no waiting."""

    def __call__(self) -> float:
        self.now += 100.0
        return self.now


def test_an_overdue_stage_is_ended_by_its_group_and_reported_timed_out(tmp_path: Path):
    pids = tmp_path / "pids"
    # a shell that starts a child and ignores SIGTERM: the group's SIGKILL after the grace ends both
    specs = [sh("hangs", f"trap '' TERM; sleep 600 & echo $$ $! > {pids}; wait"), sh("after", "true", ("hangs",)),
             sh("beside", "true")]
    outcomes, lines = run(specs, tmp_path / "results", timeout_s=250, clock=JumpingClock(), kill_grace_s=150)
    assert [o.status for o in outcomes] == ["timed out", "skipped", "passed"]
    assert "past its 250s limit (BWS_STAGE_TIMEOUT_S): SIGTERM" in "\n".join(lines)
    for pid in pids.read_text().split():
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert lines[-1].startswith("FAILED: hangs (killed after 250s), after (skipped: needs hangs, which timed out)")


def test_a_cancelled_run_ends_its_stages_groups_and_still_prints_the_table(tmp_path: Path):
    """SIGTERM to the scheduler (a CI cancel): the running stage's whole group is ended, the stage is reported as
    interrupted, the stages not started as skipped, and the run fails."""
    results, pids = tmp_path / "results", tmp_path / "pids"
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import stage_runner as r; "
        "specs = [r.StageSpec('hangs', 'unit', ('sh', '-c', sys.argv[3])), "
        "r.StageSpec('later', 'unit', ('true',), ('hangs',))]; "
        "runner = r.Runner(specs, r.Path(sys.argv[2]), slots=2, timeout_s=3000, poll_s=0.01, kill_grace_s=5); "
        "import signal; signal.signal(signal.SIGTERM, r.interrupted); "
        "outcomes = runner.run(); print('\\n'.join(r.closing_lines(outcomes)))"
    )
    results.mkdir()
    scheduler = subprocess.Popen([sys.executable, "-c", script, str(REPO / "tests"), str(results),
                                  f"sleep 600 & echo $$ $! > {pids}; wait"], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(3000):  # until the stage has started its child (a safety limit, not a bound)
            if pids.exists() and len(pids.read_text().split()) == 2:
                break
            subprocess.run(["sleep", "0.01"], check=True)
        scheduler.terminate()
        out, _ = scheduler.communicate(timeout=120)
    finally:
        scheduler.kill()
    lines = out.splitlines()
    assert lines[-1] == ("FAILED: hangs (the run was interrupted), later (skipped: the run was interrupted); "
                         "0 of 2 stages passed; 0 tests (0 passed)"), lines
    for pid in pids.read_text().split():
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", pid


def test_a_command_that_cannot_start_fails_its_stage_and_its_dependents(tmp_path: Path):
    specs = [StageSpec("missing", "unit", ("no-such-program-bws",)), sh("after", "true", ("missing",))]
    outcomes, _lines = run(specs, tmp_path / "results")
    assert [o.status for o in outcomes] == ["failed", "skipped"]
    assert "could not start" in (tmp_path / "results" / "missing.log").read_text()


def test_the_parts_choose_their_stages_and_the_setup_they_need():
    specs = stage_specs("2", "5")
    assert {spec.part for spec in specs} == {*PARTS, "setup"}
    assert [s.name for s in wanted_specs(specs, ["contract"])] == ["bootstrap", "contract-venvs", "contracts"]
    host = [s.name for s in wanted_specs(specs, ["host"])]
    assert host == ["bootstrap", "image", "prepared-image", "contract-venvs", "host-scenarios"]
    assert [s.name for s in wanted_specs(specs, ["molecule"], ["provision"])] == ["bootstrap", "image",
                                                                                 "molecule-provision"]
    assert len(wanted_specs(specs, list(PARTS))) == len(specs), "the whole run runs every stage"
    (hosts,) = [spec for spec in specs if spec.part == "host"]
    assert hosts.slots == 5 and specs[-1] is hosts, "the host scenarios run alone in the default budget, last"
    names = {spec.name for spec in specs}
    assert all(need in names for spec in specs for need in spec.needs)


def test_every_molecule_scenario_is_a_stage():
    scenarios = sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))
    assert sorted(s.name.split("-", 1)[1] for s in stage_specs("2", "5") if s.part == "molecule") == scenarios


def test_a_bad_worker_count_is_refused_naming_it(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("BWS_TEST_SLOTS", "two")
    with pytest.raises(SystemExit, match="BWS_TEST_SLOTS='two'"):
        main(["--results", str(tmp_path)])


def junit_elements(junit: Path) -> dict[str, int]:
    root = ET.parse(junit).getroot()
    return {tag: len(list(root.iter(tag))) for tag in ("testcase", "failure", "error", "skipped")}


def test_pytest_junit_files_keep_recorded_properties(junit_run: tuple[Path, str]):
    junit, printed = junit_run
    properties = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert properties.get("tiny_property") == "recorded-value", ET.tostring(ET.parse(junit).getroot())
    assert "record_property is incompatible" not in printed, printed


def test_the_stages_find_the_project_venv_before_a_bin_pyenv_put_first() -> None:
    """Started through a pyenv shim, the scheduler inherits pyenv's version bin (its own pytest, no xdist) before
    the venv's: every stage must get the venv first, and the rest of PATH kept in order."""
    environ = {"VENV_DIR": "/c/venv", "PATH": "/p/versions/3.11/bin:/c/venv/bin:/usr/bin", "HOME": "/h"}
    env = stage_environment(environ)
    assert env["PATH"] == "/c/venv/bin:/p/versions/3.11/bin:/usr/bin"
    assert env["HOME"] == "/h" and environ["PATH"].startswith("/p/")
    assert stage_environment({"PATH": "/usr/bin"}) == {"PATH": "/usr/bin"}
