"""Import the repository's module_utils/<name>.py as ansible.module_utils.<name>, as Ansible ships it to a target."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_module_util(name: str) -> ModuleType:
    full = f"ansible.module_utils.{name}"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, REPO / "module_utils" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]
