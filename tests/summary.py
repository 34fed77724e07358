"""Print the end of a test run (scripts/test.sh): the stage table, the stages' verdicts and the closing line.

The results folder holds:
- stages.tsv: a line per stage that run_stage ran, ``name<TAB>rc<TAB>seconds`` (seconds may be missing); a stage
  run twice (the test-host image, awaited by two parts) has two lines and gets one row;
- NAME.done: a background stage's ``name<TAB>rc<TAB>seconds`` (start_background); the stage of the same name that
  awaited it shows them in its row, with the time the run waited for it;
- lane-times: the side-by-side parts' rows, as scripts/test.sh writes them;
- *.xml: JUnit files (pytest, ansible-test units, the Molecule verifiers).

The last line, alone, counts the JUnit test cases only, pytest-style: ``N passed, N failed[, N skipped]``. The line
before it counts the stages apart, each once, and names those that failed.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Stage:
    """One row of the stage table."""

    name: str
    rc: int
    seconds: int | None = None  # run_stage's time; for a background stage, how long the run waited for it
    background: int | None = None  # a background stage's own time

    def add_run(self, rc: int, seconds: int | None) -> None:
        """The same stage run again: the first failure is its status, the times add up."""
        self.rc = self.rc or rc
        if seconds is not None:
            self.seconds = (self.seconds or 0) + seconds

    def row(self) -> str:
        verdict = "ok" if self.rc == 0 else "FAILED"
        if self.background is None:
            return f"{self.name:<28} {seconds_text(self.seconds):>6}  {verdict}"
        waited = "" if self.seconds is None else f", waited {self.seconds}s"
        return f"{self.name:<28} {seconds_text(self.background):>6}  {verdict} (background{waited})"


@dataclass
class Counts:
    """JUnit test cases by outcome; xfailed are among the skipped (pytest writes an expected failure as a skip)."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    xfailed: int = 0

    def add(self, other: Counts) -> None:
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped
        self.xfailed += other.xfailed

    def line(self) -> str:
        return f"{self.passed} passed, {self.failed} failed" + (f", {self.skipped} skipped" if self.skipped else "")


def seconds_text(seconds: int | None) -> str:
    return "?" if seconds is None else f"{seconds}s"


def parse_int(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().lstrip("-").isdigit() else None


def tsv_fields(line: str) -> tuple[str, int, int | None]:
    """name, rc and seconds of a ``name<TAB>rc[<TAB>seconds]`` line (an unreadable rc counts as a failure)."""
    fields = line.split("\t")
    rc = parse_int(fields[1]) if len(fields) > 1 else None
    return fields[0], 1 if rc is None else rc, parse_int(fields[2]) if len(fields) > 2 else None


def read_stages(results: Path) -> list[Stage]:
    """The stage table's rows in the order the stages ran, each stage once, background stages not awaited last."""
    stages: dict[str, Stage] = {}
    tsv = results / "stages.tsv"
    for line in tsv.read_text().splitlines() if tsv.exists() else []:
        if not line.strip():
            continue
        name, rc, seconds = tsv_fields(line)
        if name in stages:
            stages[name].add_run(rc, seconds)
        else:
            stages[name] = Stage(name, rc, seconds)
    for done in sorted(results.glob("*.done")):
        name, rc, seconds = tsv_fields(done.read_text().strip())
        stage = stages.setdefault(name, Stage(name, rc))
        stage.rc, stage.background = stage.rc or rc, seconds
    return list(stages.values())


def junit_counts(path: Path) -> Counts:
    counts = Counts()
    for case in ET.parse(path).getroot().iter("testcase"):
        outcomes = {child.tag: child for child in case}
        if outcomes.keys() & {"failure", "error"}:
            counts.failed += 1
        elif "skipped" in outcomes:
            counts.skipped += 1
            counts.xfailed += outcomes["skipped"].get("type") == "pytest.xfail"
        else:
            counts.passed += 1
    return counts


def case_counts(results: Path) -> Counts:
    counts = Counts()
    for xml in sorted(results.glob("*.xml")):
        counts.add(junit_counts(xml))
    return counts


def stages_line(stages: list[Stage]) -> str:
    failed = [stage.name for stage in stages if stage.rc != 0]
    line = f"stages: {len(stages) - len(failed)} ok, {len(failed)} failed"
    return line + (f"; failed: {', '.join(failed)}" if failed else "")


def report(results: Path) -> list[str]:
    """The lines to print, the closing line last."""
    stages = read_stages(results)
    lines = ["", "### stage times", *(f"  {stage.row()}" for stage in stages)]
    lanes = results / "lane-times"
    if lanes.exists():
        lines += ["  of which, side by side:", *(f"    {row}" for row in lanes.read_text().splitlines())]
    lines.append(stages_line(stages))
    counts = case_counts(results)
    if counts.xfailed:
        lines.append(f"of the skipped, {counts.xfailed} are expected failures "
                     "(strict xfail: known engine defects, named in each)")
    return [*lines, counts.line()]


def main(results: Path) -> None:
    print("\n".join(report(results)))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
