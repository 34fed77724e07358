"""The README reads as a guide and its reference pages are in docs/: it stays short, no table cell is a wall of
text, and every link and repository path that the README and docs/ name exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP_DIRS = ("scripts", "roles", "tests", "bench", "playbooks", "inventory", "plugins", "collections",
            "docs", "molecule", "requirements", ".ci")
PATH = re.compile(r"`((?:" + "|".join(re.escape(d) for d in TOP_DIRS) + r")/[^`\s]*)`")
USERS_OWN = ("inventory/mine",)  # the README has the user make it: cp -r inventory/production inventory/mine
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


def test_the_readme_is_a_guide_of_at_most_250_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 250


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_table_cell_is_over_400_characters(page: Path):
    long = [(number, len(cell)) for number, line in enumerate(page.read_text().splitlines(), 1) if line.startswith("|")
            for cell in line.strip("|").split(" | ") if len(cell) > 400]
    assert long == [], f"{page_id(page)}: (line, characters) {long}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_link_and_repository_path_named_exists(page: Path):
    text = page.read_text()
    missing = [target for target in LINK.findall(text)
               if "://" not in target and not (page.parent / target).exists()]
    # paths with placeholders (<engine>, *, {...}) name a family of files, not one
    missing += [path for path in PATH.findall(text)
                if not re.search(r"[<>*{}]", path) and not path.startswith(USERS_OWN)
                and not (REPO / path.rstrip(".,:;")).exists()]
    assert missing == [], f"{page_id(page)} names what does not exist: {missing}"


def test_the_readme_links_every_docs_page():
    readme = (REPO / "README.md").read_text()
    assert [page.name for page in PAGES[1:] if f"(docs/{page.name})" not in readme] == []


def command_lines() -> list[tuple[str, str]]:
    """(page, command) for every line of the pages' shell blocks, comments and continuations dropped."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```(?:sh|bash)?\n(.*?)```", page.read_text(), flags=re.S):
            for line in block.splitlines():
                command = line.split("  #", 1)[0].rstrip(" \\").strip()
                if command and not line.startswith(" "):
                    found.append((page_id(page), command))
    return found


def test_every_command_of_the_pages_runs_a_program_that_is_here():
    """`bash X`, `python3 X` and `ansible-playbook ... Y.yml` name files of the repository (a playbook: a root-level
    entry point or one under playbooks/), every repository path given as an argument exists, and the test
    command's parts are the ones it accepts."""
    parts = set(re.findall(r"^  (\w+) ", subprocess.run(["bash", str(REPO / "scripts" / "test.sh"), "--help"],
                                                          capture_output=True, text=True, check=True).stdout, re.M))
    problems = []
    commands = command_lines()
    for page, command in commands:
        words = command.split()
        if words[0] in ("bash", "python3") and words[1] != "-m" and not (REPO / words[1]).is_file():
            problems.append(f"{page}: {command!r}: no {words[1]}")
        if words[0] == "ansible-playbook":
            playbooks = [word for word in words if word.endswith(".yml")]
            problems += [f"{page}: {command!r}: no playbook {p}" for p in playbooks
                         if not ((REPO / p).is_file() or (REPO / "playbooks" / p).is_file())]
        if words[:2] == ["bash", "scripts/test.sh"] and len(words) > 2 and words[2] not in parts:
            problems.append(f"{page}: {command!r}: {words[2]} is not a part of the test command")
        problems += [f"{page}: {command!r}: no {word}" for word in words[1:]
                     if word.startswith(tuple(d + "/" for d in TOP_DIRS)) and not word.startswith(USERS_OWN)
                     and not (REPO / word).exists()]
    assert len(commands) > 15 and problems == []
