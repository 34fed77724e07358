"""Import the collection's module_utils and modules as plain Python, as Ansible ships them to a target: the
repository is the collection blackwell.serving (collections/ansible_collections/blackwell/serving links to it), so
with collections/ on sys.path `ansible_collections.blackwell.serving.plugins...` imports like any package. One way
for every test (module_utils importing each other resolve too)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
# The directory that holds ansible_collections/: collections/ of a checkout, or the tree that holds an installed copy
# (ansible-test runs the tests inside one).
COLLECTIONS = REPO.parents[2] if REPO.parent.parent.name == "ansible_collections" else REPO / "collections"
PLUGINS = "ansible_collections.blackwell.serving.plugins"
MODULES_DIR = REPO / "plugins" / "modules"
MODULE_UTILS_DIR = REPO / "plugins" / "module_utils"


def use_repository_module_utils() -> None:
    """Make ``ansible_collections.blackwell.serving`` importable from this checkout."""
    if str(COLLECTIONS) not in sys.path:
        sys.path.insert(0, str(COLLECTIONS))


def load_module_util(name: str) -> ModuleType:
    use_repository_module_utils()
    return importlib.import_module(f"{PLUGINS}.module_utils.{name}")


def load_plugin_util(name: str) -> ModuleType:
    """plugins/plugin_utils/<name>.py (controller-side code: the engine roster's reader)."""
    use_repository_module_utils()
    return importlib.import_module(f"{PLUGINS}.plugin_utils.{name}")


def load_library_module(name: str) -> ModuleType:
    """plugins/modules/<name>.py (a module's main() and argument handling), with the collection's module_utils."""
    use_repository_module_utils()
    return importlib.import_module(f"{PLUGINS}.modules.{name}")


# Runs a module file as Ansible does on a target, with the collection importable.
_MODULE_RUNNER = ("import runpy, sys; sys.path.insert(0, sys.argv[2]); "
                  "sys.argv = [sys.argv[1], sys.argv[3]]; runpy.run_path(sys.argv[0], run_name='__main__')")


def run_library_module_file(name: str, workdir: Path, args: dict, check_mode: bool = False) -> dict:
    """plugins/modules/<name>.py run in a child Python with `args` (its arguments file written in `workdir`); its
    result."""
    import json
    import subprocess

    args_file = workdir / f"{name}.args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"_ansible_check_mode": check_mode, **args}}))
    result = subprocess.run([sys.executable, "-c", _MODULE_RUNNER, str(MODULES_DIR / f"{name}.py"),
                             str(COLLECTIONS), str(args_file)], capture_output=True, text=True, check=False)
    return json.loads(result.stdout)
