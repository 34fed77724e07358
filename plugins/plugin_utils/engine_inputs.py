# SPDX-License-Identifier: Apache-2.0
"""What each engine's role says of the inputs the engine finally runs with, read and applied on the controller.

The input check (plugins/action/input_check.py) looks through these at the effective configuration, not only at
the variables it names: the option mappings (a profile's ``<engine>_options``, ``<engine>_extra_options``,
``<engine>_default_options``) and the environment mappings (``<engine>_environment``,
``<engine>_extra_environment``). What is engine-specific lives in the engine's role, found through the roster's
``role``:

- ``files/flags-<version>.txt``: the long option names of that version's real parser, one a line
  (tests/contract/engine_flag_names.py writes it, a contract test keeps it equal to the parser). A key that is not
  on it is refused naming the closest flag; without a list for the version the engine's own parser on the host
  is the only check.
- ``files/guarded_inputs.yml``: options and environment variables that take a guard away (a key check that no
  longer runs, a route that serves without a key, a key written somewhere), each with the condition, why, the
  upstream file and the way out.

The roster's ``reserved_flags`` are flags the role sets from variables (the bind address, the port, the parallel
layout), in every spelling its ``flag_aliases`` name: never in options. Keys are compared normalised, ``_`` and ``-``
alike (vLLM's parser takes both spellings), before any ``.`` (vLLM's ``--compilation-config.mode`` sets one field of a
JSON flag). ``files/refused-flags-<version>.yml``, where a role has one, names flags of the parser that the way the
role serves the engine cannot pass (SGLang's config reader refuses some), each with what to write instead.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import yaml
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import reserved_spellings

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"
FLAG_LIST = "files/flags-{version}.txt"
REFUSED_LIST = "files/refused-flags-{version}.yml"
GUARDS_FILE = "files/guarded_inputs.yml"
GUARD_KEYS = {"name", "aliases", "refused_when", "why", "upstream", "way_out"}
FALSE_WORDS = {"", "0", "false", "no", "n", "off", "f", "none"}


class GuardFileError(ValueError):
    """An engine role's guarded_inputs.yml or flag list is unreadable or not of the shape this module reads."""


@dataclass(frozen=True)
class Guard:
    """One guarded input: the names it goes by, when it is refused, why, where upstream does it, the way out."""

    names: tuple[str, ...]
    condition: str
    argument: Any
    why: str
    upstream: str
    way_out: str

    def refuses(self, value: Any) -> bool:
        if self.condition == "present":
            return value is not None and value is not False
        if self.condition == "truthy":
            return truthy(value)
        if self.condition == "greater_than":
            number = _number(value)
            return number is not None and number > self.argument
        return value is not None and re.search(self.argument, str(value)) is not None

    def message(self, where: str, value: Any) -> str:
        shown = "set" if self.condition == "present" else json.dumps(value, default=str)
        return f"{where} is {shown}: {self.why}; see {self.upstream}; way out: {self.way_out}"


@dataclass(frozen=True)
class RefusedFlags:
    """Flags of the parser that the way the role serves the engine cannot take (SGLang's config reader refuses some),
    each with what to write instead (None: nothing), why, and where upstream says so."""

    flags: dict[str, str | None]
    why: str
    upstream: str


@dataclass
class EngineInputs:
    """Per engine: its flag list (version, names) or None, the flags its role cannot pass, and its guarded options
    and environment."""

    flags: dict[str, tuple[str, frozenset[str]] | None] = field(default_factory=dict)
    options: dict[str, list[Guard]] = field(default_factory=dict)
    environment: dict[str, list[Guard]] = field(default_factory=dict)
    refused: dict[str, RefusedFlags | None] = field(default_factory=dict)


def flag_key(key: Any) -> str:
    """The flag an option key names: no leading dashes, the part before any `.`, `_` as `-`, lower case."""
    return str(key).lstrip("-").split(".", 1)[0].replace("_", "-").lower()


def truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in FALSE_WORDS
    return bool(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def read_flag_list(path: Path) -> frozenset[str] | None:
    """The names of a flag list, or None when there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise GuardFileError(f"cannot read the flag list {path}: {exc}") from exc
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def read_refused_flags(path: Path) -> RefusedFlags | None:
    """A role's refused-flags file ({why, upstream, flags: {flag: instead or null}}), or None when there is none."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, yaml.YAMLError) as exc:
        raise GuardFileError(f"cannot read {path}: {exc}") from exc
    flags = data.get("flags") if isinstance(data, dict) else None
    if (not isinstance(data, dict) or set(data) != {"why", "upstream", "flags"} or not isinstance(flags, dict)
            or not all(isinstance(v, str) for v in (data["why"], data["upstream"]))
            or not all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in flags.items())):
        raise GuardFileError(f"{path}: a mapping of why, upstream (strings) and flags (flag: what to write instead, "
                             "or null)")
    return RefusedFlags({flag_key(k): v for k, v in flags.items()}, " ".join(data["why"].split()),
                        " ".join(data["upstream"].split()))


def _guard(entry: Any, where: str) -> Guard:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise GuardFileError(f"{where}: each entry is a mapping with a non-empty `name`")
    where = f"{where} {entry['name']}"
    problems = [f"unknown key {key}" for key in sorted(set(entry) - GUARD_KEYS)]
    problems += [f"{key} must be a non-empty string" for key in ("why", "upstream", "way_out")
                 if not isinstance(entry.get(key), str) or not entry[key].strip()]
    aliases = entry.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        problems.append("aliases must be a list of names")
    when = entry.get("refused_when")
    condition, argument = None, None
    if when in ("present", "truthy"):
        condition = when
    elif isinstance(when, dict) and len(when) == 1 and next(iter(when)) in ("greater_than", "matches"):
        ((condition, argument),) = when.items()
    if condition is None:
        problems.append("refused_when must be present, truthy, {greater_than: N} or {matches: REGEX}")
    elif condition == "greater_than" and (isinstance(argument, bool) or not isinstance(argument, (int, float))):
        problems.append("greater_than needs a number")
    elif condition == "matches":
        try:
            re.compile(str(argument))
        except re.error as exc:
            problems.append(f"matches is not a regular expression: {exc}")
    if problems:
        raise GuardFileError(f"{where}: " + "; ".join(problems))
    return Guard((entry["name"], *aliases), condition, argument, " ".join(entry["why"].split()),
                 " ".join(entry["upstream"].split()), " ".join(entry["way_out"].split()))


def read_guards(path: Path) -> tuple[list[Guard], list[Guard]]:
    """The guarded options and environment variables of one role's file (none when it has no file)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [], []
    except (OSError, yaml.YAMLError) as exc:
        raise GuardFileError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or set(data) - {"options", "environment"}:
        raise GuardFileError(f"{path}: a mapping with `options` and `environment` lists")
    lists = []
    for kind in ("options", "environment"):
        entries = data.get(kind) or []
        if not isinstance(entries, list):
            raise GuardFileError(f"{path}: {kind} must be a list")
        lists.append([_guard(entry, f"{path} {kind}") for entry in entries])
    return lists[0], lists[1]


def load_engine_inputs(roster: dict[str, dict], versions: dict[str, str], roles_dir: Path = ROLES_DIR) -> EngineInputs:
    """Each engine's flag list for its version (versions[engine], if any) and its guarded inputs."""
    inputs = EngineInputs()
    for engine, entry in roster.items():
        role_dir = roles_dir / entry["role"]
        version = versions.get(engine)
        names = read_flag_list(role_dir / FLAG_LIST.format(version=version)) if version else None
        inputs.flags[engine] = (version, names) if names is not None else None
        refused = role_dir / REFUSED_LIST.format(version=version)
        inputs.refused[engine] = read_refused_flags(refused) if version else None
        inputs.options[engine], inputs.environment[engine] = read_guards(role_dir / GUARDS_FILE)
    return inputs


def _engine_mappings(values: dict[str, Any], roster: dict[str, dict], suffix: str):
    """(engine, mapping name, mapping) for each mapping named `<engine>_..._<suffix>`, engines in roster order."""
    for name, value in values.items():
        if isinstance(value, dict) and name.endswith(suffix):
            for engine in roster:
                if name.startswith(f"{engine}_"):
                    yield engine, name, value


def _closest(name: str, candidates: frozenset[str]) -> str | None:
    found = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.75)
    return found[0] if found else None


def option_problems(options: dict[str, Any], roster: dict[str, dict], inputs: EngineInputs) -> list[str]:
    """Keys of the engines' option mappings that a role's variable owns, that the engine's parser does not know,
    or that take a guard away. The secret flags are keys_in_options' (the input check), skipped here."""
    messages = []
    for engine, name, mapping in _engine_mappings(options, roster, "_options"):
        entry = roster[engine]
        secret = {flag_key(flag) for flag in entry["secret_flags"]}
        reserved = {flag_key(spelling): (flag, entry["reserved_flags"][flag])
                    for spelling, flag in reserved_spellings(entry).items()}
        guards = {flag_key(alias): guard for guard in inputs.options.get(engine, []) for alias in guard.names}
        flags, refused = inputs.flags.get(engine), inputs.refused.get(engine)
        for key, value in mapping.items():
            flag = flag_key(key)
            if flag in secret:
                continue
            if flag in reserved:
                messages.append(f"{name}.{key}: {reserved[flag][0]} is set by {reserved[flag][1]}, never by an option "
                                "(the unit, the no-key refusal off loopback and verify read that): set it there")
            elif refused is not None and flag in refused.flags:
                messages.append(f"{name}.{key}: {refused.why}; see {refused.upstream}; "
                                + _instead(refused.flags[flag], reserved))
            elif flags is not None and flag not in flags[1]:
                hint = _closest(flag, flags[1])
                messages.append(f"{name}.{key} is not a flag of {engine} {flags[0]} (roles/{entry['role']}/"
                                f"{FLAG_LIST.format(version=flags[0])})" + (f"; did you mean {hint}?" if hint else ""))
            elif flag in guards and guards[flag].refuses(value):
                messages.append(guards[flag].message(f"{name}.{key}", value))
    return messages


def _instead(replacement: str | None, reserved: dict[str, tuple[str, str]]) -> str:
    """What to write instead of a refused flag: the engine's own word for it, and the variable that sets it when
    that flag is reserved (SGLang's `--attn-dp-size` is the profile's attention_data_parallel_size)."""
    if replacement is None:
        return "no key of the file sets it: leave it out"
    new_flag = flag_key(re.split(r"[\s=]", replacement.strip(), maxsplit=1)[0])
    setter = f" (set by {reserved[new_flag][1]})" if new_flag in reserved else ""
    return f"use {replacement} instead{setter}"


def refusing_environment_guard(guards: list[Guard], variable: Any, value: Any) -> Guard | None:
    """The first guard whose names (globs) match `variable` and that refuses `value`, or None."""
    return next((guard for guard in guards if any(fnmatchcase(str(variable), pattern) for pattern in guard.names)
                 and guard.refuses(value)), None)


def environment_problems(values: dict[str, Any], roster: dict[str, dict], inputs: EngineInputs) -> list[str]:
    """Variables of the engines' environment mappings that take a guard away, as given."""
    messages = []
    for engine, name, mapping in _engine_mappings(values, roster, "_environment"):
        for variable, value in mapping.items():
            guard = refusing_environment_guard(inputs.environment.get(engine, []), variable, value)
            if guard is not None:
                messages.append(guard.message(f"{name}.{variable}", value))
    return messages
