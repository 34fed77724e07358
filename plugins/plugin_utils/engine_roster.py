# SPDX-License-Identifier: Apache-2.0
"""The engine roster (meta/engines.yml), read and checked on the controller.

Each engine's entry names what the engine-neutral code needs: its role and entry point, its unit, service user,
process patterns and /dev/shm names, the variables and flags that carry its keys, its routes and metric names. A
missing or unknown key, or a value of the wrong type, fails with the entry and the key named: a typo in the roster
must not quietly leave an engine's processes running on a teardown.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from ansible_collections.blackwell.serving.plugins.module_utils.engine.metrics import scheme_problems
from ansible_collections.blackwell.serving.plugins.plugin_utils.parallel_layout import (
    LAYOUT_KEYS,
    roster_layout_problems,
)

ROSTER_FILE = Path(__file__).resolve().parents[2] / "meta" / "engines.yml"
ENGINE_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
# key -> type; every key is required (an engine without a value says so: "", [] or false).
FIELDS: dict[str, type] = {
    "role": str, "playbook": str, "unit": str, "service_user": str, "process_patterns": list, "shm_patterns": list,
    "env_prefixes": list, "secret_flags": list, "reserved_flags": dict, "flag_aliases": dict, "layout": dict,
    "api_key_variable": str,
    "distinct_secrets": list, "nodes_group_variable": str, "readiness_timeout_s": int, "generating_routes": list,
    "admin_routes": list, "reasoning_field": str, "server_info": bool, "server_info_layout": dict,
    "key_guard_hint": str,
    "unguarded_route_hint": str, "drain": bool, "metrics": dict,
}
# A /dev/shm pattern names the engine's own entries: a literal prefix of at least this many characters before the
# first wildcard, and no directory. gpu_release removes every entry it matches that a service user owns and no process
# holds, so "*" or "t*" would take entries that are not the engine's.
SHM_PREFIX_MIN = 4
WILDCARDS = re.compile(r"[*?\[]")


class RosterError(ValueError):
    """The roster file is missing, not YAML, or an entry does not have the shape FIELDS names."""


def _check_metrics(name: str, metrics: dict) -> list[str]:
    """The engine's acceptance declaration, by the rules of the code that computes it (module_utils/engine/metrics)."""
    return [f"{name}.{problem}" for problem in scheme_problems(metrics)]


def _shm_pattern_ok(pattern: str) -> bool:
    literal = WILDCARDS.split(pattern, maxsplit=1)[0]
    return "/" not in pattern and len(literal) >= SHM_PREFIX_MIN


def check_entry(name: str, entry: Any) -> list[str]:
    """What is wrong with one engine's entry (empty when nothing is)."""
    if not ENGINE_NAME.fullmatch(str(name)):
        return [f"engine name {name!r} must be lower-case letters, digits and '_' (it prefixes variables and units)"]
    if not isinstance(entry, dict):
        return [f"{name} must be a mapping, got {type(entry).__name__}"]
    problems = [f"{name}.{key} is missing" for key in FIELDS if key not in entry]
    problems += [f"{name}.{key} is not a roster key (known: {', '.join(FIELDS)})" for key in entry if key not in FIELDS]
    for key, kind in FIELDS.items():
        value = entry.get(key)
        if key in entry and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            problems.append(f"{name}.{key} must be a {kind.__name__}, got {type(value).__name__}")
        elif kind is list and key in entry and not all(isinstance(item, str) for item in value):
            problems.append(f"{name}.{key} must be a list of strings")
    if not problems:
        problems += _check_metrics(name, entry["metrics"])
        for key in ("role", "unit", "service_user", "api_key_variable"):
            if not entry[key]:
                problems.append(f"{name}.{key} must not be empty")
        if not entry["process_patterns"]:
            problems.append(f"{name}.process_patterns must name at least one pattern (a teardown looks for them)")
        problems += [f"{name}.shm_patterns: {pattern!r} must start with a name prefix of at least {SHM_PREFIX_MIN} "
                     "characters before any wildcard, and name no directory (gpu_release removes what it matches)"
                     for pattern in entry["shm_patterns"] if not _shm_pattern_ok(pattern)]
        problems += [f"{name}.reserved_flags.{flag} must name what sets the flag (a non-empty string)"
                     for flag, what in entry["reserved_flags"].items() if not isinstance(what, str) or not what]
        problems += _alias_problems(name, entry)
        problems += roster_layout_problems(name, entry["layout"])
        problems += [f"{name}.server_info_layout.{key} must be a layout key ({', '.join(LAYOUT_KEYS)}) naming a "
                     "/server_info field (a string)" for key, field in entry["server_info_layout"].items()
                     if key not in LAYOUT_KEYS or not isinstance(field, str) or not field]
    return problems


def _alias_problems(name: str, entry: dict) -> list[str]:
    """Aliases name other spellings of a reserved flag: a list of strings, each the alias of one flag only."""
    problems, seen = [], {}
    for flag, aliases in entry["flag_aliases"].items():
        if flag not in entry["reserved_flags"]:
            problems.append(f"{name}.flag_aliases.{flag} is not a reserved flag (aliases keep a reserved flag's "
                            "other spellings to the same value)")
        if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
            problems.append(f"{name}.flag_aliases.{flag} must be a list of flag names")
            continue
        for alias in aliases:
            if alias in seen or alias in entry["reserved_flags"]:
                problems.append(f"{name}.flag_aliases: {alias} is named twice")
            seen[alias] = flag
    return problems


def reserved_spellings(entry: dict) -> dict[str, str]:
    """Every spelling of each reserved flag (the flag itself and its aliases) -> the reserved flag."""
    spellings = {flag: flag for flag in entry["reserved_flags"]}
    for flag, aliases in entry["flag_aliases"].items():
        spellings.update({alias: flag for alias in aliases})
    return spellings


def check_roster(data: Any) -> dict[str, dict]:
    """The roster's engines, each with its `name` added; RosterError naming every problem otherwise."""
    engines = data.get("engines") if isinstance(data, dict) else None
    if not isinstance(engines, dict) or not engines:
        raise RosterError("the roster must be a mapping with a non-empty `engines` mapping")
    problems = [p for name, entry in engines.items() for p in check_entry(name, entry)]
    units = [entry.get("unit") for entry in engines.values() if isinstance(entry, dict)]
    problems += [f"unit {unit} is named by more than one engine"
                 for unit in sorted({u for u in units if units.count(u) > 1})]
    if problems:
        raise RosterError("engine roster: " + "; ".join(problems))
    return {name: {"name": name, **entry} for name, entry in engines.items()}


@lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int) -> dict[str, dict]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RosterError(f"cannot read the engine roster {path}: {exc}") from exc
    return check_roster(data)


def load_roster(path: Path = ROSTER_FILE) -> dict[str, dict]:
    """The checked roster, read once per change of the file."""
    try:
        mtime_ns = path.stat().st_mtime_ns
    except OSError as exc:
        raise RosterError(f"cannot read the engine roster {path}: {exc}") from exc
    return _load(str(path), mtime_ns)


def field_values(roster: dict[str, dict], key: str) -> list:
    """One key over every engine, in roster order; list values are flattened (every unit, every pattern)."""
    if key != "name" and key not in FIELDS:
        raise RosterError(f"{key!r} is not a roster key (known: name, {', '.join(FIELDS)})")
    values: list = []
    for entry in roster.values():
        value = entry[key]
        values.extend(value if isinstance(value, list) else [value])
    return values
