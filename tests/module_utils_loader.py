"""Import the repository's module_utils/<name>.py as ansible.module_utils.<name>, as Ansible ships it to a target,
and its library/<name>.py modules: one way for every test (module_utils importing each other resolve too)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import ansible.module_utils

REPO = Path(__file__).resolve().parents[1]


def use_repository_module_utils() -> None:
    """Make ``ansible.module_utils.<name>`` find the repository's module_utils/<name>.py."""
    path = str(REPO / "module_utils")
    if path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(path)


def load_module_util(name: str) -> ModuleType:
    use_repository_module_utils()
    return importlib.import_module(f"ansible.module_utils.{name}")


def load_library_module(name: str) -> ModuleType:
    """library/<name>.py (a module's main() and argument handling), with the repository's module_utils."""
    use_repository_module_utils()
    if str(REPO / "library") not in sys.path:
        sys.path.insert(0, str(REPO / "library"))
    return importlib.import_module(name)


# Runs a module file as Ansible does on a target, with the repository's module_utils as ansible.module_utils.
_MODULE_RUNNER = ("import runpy, sys, ansible.module_utils as m; m.__path__.append(sys.argv[2]); "
                  "sys.argv = [sys.argv[1], sys.argv[3]]; runpy.run_path(sys.argv[0], run_name='__main__')")


def run_library_module_file(name: str, workdir: Path, args: dict, check_mode: bool = False) -> dict:
    """library/<name>.py run in a child Python with `args` (its arguments file written in `workdir`); its result."""
    import json
    import subprocess

    args_file = workdir / f"{name}.args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"_ansible_check_mode": check_mode, **args}}))
    result = subprocess.run([sys.executable, "-c", _MODULE_RUNNER, str(REPO / "library" / f"{name}.py"),
                             str(REPO / "module_utils"), str(args_file)], capture_output=True, text=True, check=False)
    return json.loads(result.stdout)
