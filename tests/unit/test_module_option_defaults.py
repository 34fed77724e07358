"""Each module option is declared with one meaning: a role that passes its own variable to a module option has the
module's default as that variable's default, except where the role turns on what the module leaves off by default
(listed below, with why). That a module's DOCUMENTATION and its argument spec agree (type, default, choices,
elements, required, sub-options) is ansible-test sanity's validate-modules (scripts/ansible_test.sh sanity)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
from tests.module_utils_loader import load_library_module  # noqa: E402

MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py"))
# (role variable, module.option): the role's value differs on purpose; the module's default keeps a direct call
# conservative (off, or nothing allowed).
ROLE_TURNS_ON = {
    ("engine_service_all_units", "engine_preflight.port_allowed_units"): "a switch may find the engines' port held",
    ("engine_service_stall_timeout_s", "engine_wait.stall_timeout_s"): "stall detection, off (0) in the module",
    ("model_store_retries", "model_fetch.retries"): "more resumes in the role's long downloads",
    ("model_store_slice_s", "model_fetch.slice_s"): "the role reports progress per slice; one call by default",
    ("model_store_reserve_bytes", "model_fetch.reserve_bytes"): "10 GiB kept free; no reserve in the module",
    ("gpu_release_shm_patterns", "gpu_release.shm_patterns"):
        "the module's names and every engine's own of the engine roster, which the module on the host cannot read",
}


def documented_options(name: str) -> dict[str, Any]:
    return yaml.safe_load(load_library_module(name).DOCUMENTATION).get("options") or {}


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
