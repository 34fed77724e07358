"""Each module option is declared with one meaning: its DOCUMENTATION (what ansible-doc shows) and its argument spec
(what the module enforces) agree on type, default, choices, elements and required; and a role that passes its own
variable to a module option has the module's default as that variable's default, except where the role turns on
what the module leaves off by default (listed below, with why)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
from tests.module_utils_loader import use_repository_module_utils  # noqa: E402

use_repository_module_utils()
from ansible.module_utils import basic  # noqa: E402

MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py"))
FIELDS = ("type", "default", "choices", "elements", "required")
# (role variable, module.option): the role's value differs on purpose; the module's default keeps a direct call
# conservative (off, or nothing allowed).
ROLE_TURNS_ON = {
    ("engine_service_all_units", "engine_preflight.port_allowed_units"): "a switch may find the engines' port held",
    ("engine_service_stall_timeout_s", "engine_wait.stall_timeout_s"): "stall detection, off (0) in the module",
    ("model_store_retries", "model_fetch.retries"): "more resumes in the role's long downloads",
    ("model_store_slice_s", "model_fetch.slice_s"): "the role reports progress per slice; one call by default",
    ("model_store_reserve_bytes", "model_fetch.reserve_bytes"): "10 GiB kept free; no reserve in the module",
}


class _SpecGivenError(Exception):
    pass


def load_module(name: str):
    spec = importlib.util.spec_from_file_location(f"bws_library_{name}", REPO / "plugins" / "modules" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def argument_spec(name: str, monkeypatch) -> dict[str, Any]:
    """The spec main() gives AnsibleModule (main() is stopped there)."""

    def capture(self, argument_spec=None, **_):
        raise _SpecGivenError(argument_spec)

    monkeypatch.setattr(basic.AnsibleModule, "__init__", capture)
    with pytest.raises(_SpecGivenError) as caught:
        load_module(name).main()
    return caught.value.args[0]


def documented_options(name: str) -> dict[str, Any]:
    return yaml.safe_load(load_module(name).DOCUMENTATION).get("options") or {}


def normalised(option: dict[str, Any], field: str) -> Any:
    value = option.get(field)
    if field == "type":
        return value or "str"
    if field == "required":
        return bool(value)
    return value


@pytest.mark.parametrize("name", MODULES)
def test_documentation_and_argument_spec_agree(name: str, monkeypatch) -> None:
    sys.path.insert(0, str(REPO / "plugins" / "modules"))
    spec, doc = argument_spec(name, monkeypatch), documented_options(name)
    assert sorted(spec) == sorted(doc), f"{name}: options only in the spec or only in DOCUMENTATION"
    differ = [(option, field, normalised(doc[option], field), normalised(spec[option], field))
              for option in spec for field in FIELDS
              if normalised(doc[option], field) != normalised(spec[option], field)]
    assert differ == [], f"{name}: (option, field, DOCUMENTATION, argument spec) {differ}"


def module_calls(node: Any):
    if isinstance(node, list):
        for item in node:
            yield from module_calls(item)
    elif isinstance(node, dict):
        for key, args in node.items():
            if key.split(".")[-1] in MODULES and isinstance(args, dict):
                yield key.split(".")[-1], args
        for key in ("block", "rescue", "always"):
            yield from module_calls(node.get(key))


def role_passthroughs() -> list[tuple[str, str, str, Any]]:
    """(task file, role variable, module.option, role default) for every `option: "{{ role_variable }}"`."""
    found = []
    whole = re.compile(r"^\{\{\s*(\w+)\s*\}\}$")
    for role in sorted((REPO / "roles").iterdir()):
        defaults_file = role / "defaults" / "main.yml"
        defaults = (yaml.safe_load(defaults_file.read_text()) if defaults_file.exists() else None) or {}
        for tasks in sorted((role / "tasks").glob("*.yml")):
            for module, args in module_calls(yaml.safe_load(tasks.read_text())):
                for option, value in args.items():
                    match = whole.match(str(value))
                    if match and match.group(1) in defaults:
                        found.append((str(tasks.relative_to(REPO)), match.group(1), f"{module}.{option}",
                                      defaults[match.group(1)]))
    return found


def test_role_defaults_are_the_module_defaults(monkeypatch) -> None:
    passthroughs = role_passthroughs()
    assert any(call == "gpu_release.timeout_s" for _, _, call, _ in passthroughs), "the scan finds no call"
    differ, exempt_seen = [], set()
    for tasks, variable, call, role_default in passthroughs:
        module, option = call.split(".")
        documented = documented_options(module).get(option, {})
        if "default" not in documented:
            continue
        if (variable, call) in ROLE_TURNS_ON:
            exempt_seen.add((variable, call))
        elif role_default != documented["default"]:
            differ.append(f"{tasks}: {variable}={role_default!r}, {call} defaults to {documented['default']!r}")
    assert differ == [], differ
    assert exempt_seen == set(ROLE_TURNS_ON), f"exemptions no longer needed: {set(ROLE_TURNS_ON) - exempt_seen}"
