"""The test command's interface (scripts/test.sh): its help, its named parts, and CI running all of it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PARTS = ["lint", "unit", "molecule", "contract", "host"]


def run_test_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "scripts" / "test.sh"), *args], capture_output=True, text=True,
                          timeout=30, check=False, cwd=REPO)


def test_help_names_every_part_and_the_pytest_form_and_runs_nothing():
    for flag in ("--help", "-h"):
        shown = run_test_command(flag)
        assert shown.returncode == 0, shown.stderr
        assert "### bootstrap" not in shown.stdout  # nothing ran
        described = re.findall(r"^  (\w+) ", shown.stdout, re.MULTILINE)
        assert described == [*PARTS, "pytest"], shown.stdout
        assert "bash scripts/test.sh pytest tests/unit/" in shown.stdout


def test_an_unknown_part_fails_naming_it_and_the_parts_before_anything_runs():
    refused = run_test_command("unit", "hosts")
    assert refused.returncode == 2
    assert "unknown part hosts" in refused.stderr and " ".join(PARTS) in refused.stderr, refused.stderr
    assert refused.stdout == ""


def test_ci_runs_the_whole_test_command_with_no_part():
    ci = (REPO / ".ci" / "run").read_text()
    commands = [line for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert commands == ['exec bash "$(dirname "$0")/../scripts/test.sh" "$@"'], commands


def test_the_readme_names_the_parts():
    readme = (REPO / "README.md").read_text()
    for part in PARTS:
        assert f"bash scripts/test.sh {part}" in readme, part
    assert "bash scripts/test.sh pytest " in readme
