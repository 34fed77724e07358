"""Rules the repository keeps: test doubles stay in tests/, no machine-specific paths, FQCN modules."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SHIPPED_YAML = [
    *REPO.glob("roles/*/defaults/*.yml"),
    *REPO.glob("roles/*/vars/*.yml"),
    *REPO.glob("roles/*/tasks/*.yml"),
    *REPO.glob("roles/*/templates/*"),
    *REPO.glob("playbooks/*.yml"),
    *REPO.glob("inventory/production/**/*.yml"),
]


def test_there_is_something_to_check():
    assert len(SHIPPED_YAML) > 20
    assert (REPO / "inventory/sandbox").is_dir()


def test_only_the_sandbox_inventory_refers_to_tests():
    offenders = [str(p.relative_to(REPO)) for p in SHIPPED_YAML
                 if re.search(r"(^|[/'\"\s])tests/|\.\./tests|doubles/", p.read_text())]
    assert offenders == [], f"shipped files must not refer to tests/: {offenders}"


def test_the_sandbox_inventory_does_refer_to_the_double():
    text = "".join(p.read_text() for p in (REPO / "inventory/sandbox").rglob("*.yml"))
    assert "tests/doubles/engine_double.py" in text


def test_no_machine_specific_paths_anywhere():
    pattern = re.compile(r"/work/|/root/\.|/home/\w+/|/tmp/pytest-of")
    offenders = []
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    for path in (REPO / name for name in listed):
        if path.is_file() and path.suffix not in (".png", ".gpg", ".whl") and path != Path(__file__):
            text = path.read_text(errors="replace")
            if pattern.search(text):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


def _tasks(node):
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        if "name" in node and any(k for k in node if "." in k):
            yield node
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            if key in node:
                yield from _tasks(node[key])


def test_every_task_uses_a_fully_qualified_or_local_module_name():
    local_modules = {p.stem for p in (REPO / "library").glob("*.py")}
    bad = []
    for path in [p for p in SHIPPED_YAML if "/tasks/" in str(p) or "/playbooks/" in str(p)]:
        for task in _tasks(yaml.safe_load(path.read_text())):
            actions = [k for k in task if "." in k and k.split(".")[0] in ("ansible", "containers", "community")]
            if not actions and not any(k in local_modules for k in task):
                bad.append(f"{path.relative_to(REPO)}: {task.get('name')}")
    assert bad == []
