"""The end of a test run (tests/summary.py, which scripts/test.sh runs on its results folder): the closing line
counts the JUnit test cases only, the stages are counted apart, each once, and the failed ones are named.

The JUnit file is pytest's own, written under this project's pytest settings (pyproject.toml) for a tiny test
file with passes, a failure, an error, a skip and an expected failure."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.summary import read_stages, report

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
STAGES = [  # name, rc, seconds: as run_stage writes them
    ("bootstrap", 0, 3), ("yamllint", 1, 2), ("ruff", 0, 1), ("ansible-lint", 0, 5),
    ("image", 0, 7), ("pytest", 1, 20), ("image", 0, 0),
]
BACKGROUND = [("ansible-lint", 0, 125), ("image", 0, 40), ("contract-venvs", 0, 300)]  # start_background's .done


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


def write_stages(results: Path) -> None:
    results.mkdir(exist_ok=True)
    (results / "stages.tsv").write_text("".join(f"{name}\t{rc}\t{seconds}\n" for name, rc, seconds in STAGES))
    for name, rc, seconds in BACKGROUND:
        (results / f"{name}.done").write_text(f"{name}\t{rc}\t{seconds}\n")


def run_summary(results: Path) -> list[str]:
    """What test.sh prints at the end: tests/summary.py run on the results folder."""
    ran = subprocess.run([sys.executable, str(REPO / "tests" / "summary.py"), str(results)], capture_output=True,
                         text=True, timeout=60, check=True)
    return ran.stdout.splitlines()


def junit_elements(junit: Path) -> dict[str, int]:
    root = ET.parse(junit).getroot()
    return {tag: len(list(root.iter(tag))) for tag in ("testcase", "failure", "error", "skipped")}


def closing_counts(line: str) -> dict[str, int]:
    assert re.fullmatch(r"\d+ passed, \d+ failed(, \d+ skipped)?", line), line
    return {word: int(number) for number, word in re.findall(r"(\d+) (\w+)", line)}


def test_the_closing_line_counts_the_junit_test_cases_only(tmp_path: Path, junit_run: tuple[Path, str]):
    junit, _ = junit_run
    results = tmp_path / "results"
    write_stages(results)
    (results / "pytest.xml").write_text(junit.read_text())
    (results / "molecule-default.xml").write_text(junit.read_text())  # a second JUnit file adds its cases
    lines = run_summary(results)
    elements = {tag: 2 * count for tag, count in junit_elements(junit).items()}
    counts = closing_counts(lines[-1])
    assert elements["testcase"] == 12, elements
    assert counts["passed"] + counts["failed"] + counts["skipped"] == elements["testcase"], (counts, elements)
    assert counts["failed"] == elements["failure"] + elements["error"] == 4, (counts, elements)
    assert counts["skipped"] == elements["skipped"] == 4, (counts, elements)
    assert "of the skipped, 2 are expected failures" in lines[-2], lines


def test_the_stages_are_counted_apart_and_the_failed_ones_named(tmp_path: Path, junit_run: tuple[Path, str]):
    results = tmp_path / "results"
    write_stages(results)
    (results / "pytest.xml").write_text(junit_run[0].read_text())
    lines = run_summary(results)
    stage_lines = [line for line in lines if line.startswith("stages:")]
    assert stage_lines == ["stages: 5 ok, 2 failed; failed: yamllint, pytest"], lines  # 7 stages, each once
    assert lines.index(stage_lines[0]) < len(lines) - 1


def test_only_stages_print_no_test_case(tmp_path: Path):
    results = tmp_path / "results"
    write_stages(results)
    lines = run_summary(results)
    assert lines[-1] == "0 passed, 0 failed", lines
    assert lines[-2] == "stages: 5 ok, 2 failed; failed: yamllint, pytest", lines


def test_an_empty_results_folder(tmp_path: Path):
    assert run_summary(tmp_path)[-2:] == ["stages: 0 ok, 0 failed", "0 passed, 0 failed"]


def test_the_stage_table_lists_each_stage_once(tmp_path: Path):
    results = tmp_path / "results"
    write_stages(results)
    (results / "lane-times").write_text("molecule default               30s  ok\n")
    lines = report(results)
    table = lines[lines.index("### stage times") + 1:lines.index("  of which, side by side:")]
    names = [row.split()[0] for row in table]
    assert names == ["bootstrap", "yamllint", "ruff", "ansible-lint", "image", "pytest", "contract-venvs"], table
    rows = {row.split()[0]: row.split(None, 1)[1] for row in table}
    assert rows["ansible-lint"] == "125s  ok (background, waited 5s)", rows
    assert rows["image"] == "40s  ok (background, waited 7s)", rows  # awaited twice: one row, both waits
    assert rows["contract-venvs"] == "300s  ok (background)", rows  # awaited inside another stage
    assert rows["yamllint"] == "2s  FAILED", rows
    assert "    molecule default               30s  ok" in lines


def test_a_background_stage_that_failed_fails_its_row(tmp_path: Path):
    (tmp_path / "stages.tsv").write_text("image\t1\t4\n")
    (tmp_path / "image.done").write_text("image\t1\t50\n")
    (stage,) = read_stages(tmp_path)
    assert (stage.rc, stage.background, stage.seconds) == (1, 50, 4)
    assert report(tmp_path)[-2:] == ["stages: 0 ok, 1 failed; failed: image", "0 passed, 0 failed"]


def test_two_column_stage_lines_still_read(tmp_path: Path):
    """stages.tsv as earlier runs wrote it: name and status only."""
    (tmp_path / "stages.tsv").write_text("yamllint\t0\nruff\t1\n")
    assert [(s.name, s.rc, s.seconds) for s in read_stages(tmp_path)] == [("yamllint", 0, None), ("ruff", 1, None)]


def test_pytest_junit_files_keep_recorded_properties(junit_run: tuple[Path, str]):
    junit, printed = junit_run
    properties = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert properties.get("tiny_property") == "recorded-value", ET.tostring(ET.parse(junit).getroot())
    assert "record_property is incompatible" not in printed, printed
