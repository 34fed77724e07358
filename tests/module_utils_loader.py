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
