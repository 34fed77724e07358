"""The README reads as a guide and its reference pages are in docs/: it stays short, no table cell is a wall of
text, and every link and repository path that the README and docs/ name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP_DIRS = ("scripts", "roles", "tests", "bench", "playbooks", "inventory", "library", "module_utils", "action_plugins",
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
