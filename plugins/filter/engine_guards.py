"""The engine guard filters: the checks every engine role runs on what the engine will get, at the role's entry.

After every merge (base, speculative, multi-node, the role's defaults, the profile's options, the extra options) an
option could still have moved what must not move: each of the engine roster's ``reserved_flags`` (the bind address,
the port, ``trust-remote-code``) must hold the value of what sets it, since the unit, the no-key refusal, verify and
the commit-pin rule of remote code read that; an address other than loopback must be served with a key (the roster's
``api_key_variable``), or every route of the engine serves whoever reaches the port; and no option or environment
variable of the engine role's ``files/guarded_inputs.yml`` may take a guard away. The input check refuses the same on
the host's variables before anything changes; these run on the effective flags and environment inside the roles, so
a play's ``vars:``, extra vars or a direct call of the role cannot bring a refused input back.

Loopback is decided by parsing the address (``ipaddress``), never by its prefix: ``127.0.0.1.nip.io`` is a name
that resolves wherever its owner says.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path

from ansible.errors import AnsibleFilterError
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_inputs import (
    GUARDS_FILE,
    ROLES_DIR,
    GuardFileError,
    flag_key,
    read_guards,
    refusing_environment_guard,
    truthy,
)
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import reserved_spellings

__all__ = ["FilterModule", "engine_environment_problems", "engine_guard_problems", "is_loopback"]


def is_loopback(host: object) -> bool:
    """Whether an engine bound to `host` is reachable from this host only: `localhost`, or an address (IPv4, IPv6,
    bracketed or not, IPv4-mapped IPv6) in a loopback network. Names other than `localhost` are not resolved."""
    text = str(host or "").strip().lower()
    if text == "localhost":
        return True
    text = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _guards(entry: Mapping, roles_dir: Path) -> tuple[list, list]:
    try:
        return read_guards(roles_dir / entry["role"] / GUARDS_FILE)
    except GuardFileError as exc:
        raise AnsibleFilterError(f"engine guards of {entry['name']}: {exc}") from exc


def _reserved_problems(flags: Mapping, entry: Mapping, expected: Mapping) -> list[str]:
    """Keys are compared as the parsers read them (`trust_remote_code` is `trust-remote-code`): every spelling of a
    reserved flag among the merged flags (the roster's `flag_aliases` too: SGLang's `ep` is `ep-size`) must hold the
    expected value."""
    problems = []
    for flag, setter in entry["reserved_flags"].items():
        if flag not in expected:
            raise AnsibleFilterError(f"engine_guard_problems: the role gives no value for the reserved flag {flag} "
                                     f"({setter}) of {entry['name']}")
        spellings = {flag_key(spelling) for spelling, reserved in reserved_spellings(entry).items() if reserved == flag}
        given = [(key, value) for key, value in flags.items() if flag_key(key) in spellings]
        if isinstance(expected[flag], bool):  # a switch: absent (dropped when false) is false
            wrong = [(key, value) for key, value in given if truthy(value) is not expected[flag]]
            if expected[flag] and not given:
                wrong = [(flag, "(none: its default)")]
        else:
            wrong = [(key, value) for key, value in given if str(value) != str(expected[flag])]
            if not given:
                wrong = [(flag, "(none: its default)")]
        problems += [f"{entry['name']} would get {key} {value} after the options are merged, not "
                     f"{expected[flag]} ({setter}): set it with {setter}, never in the engine's options (a "
                     f"profile's {entry['role']}_options, or the role's default or extra options)."
                     for key, value in wrong]
    return problems


def _option_guard_problems(flags: Mapping, entry: Mapping, roles_dir: Path) -> list[str]:
    guards = {flag_key(name): guard for guard in _guards(entry, roles_dir)[0] for name in guard.names}
    return [guards[flag_key(key)].message(f"{entry['name']}'s effective flag {key}", value)
            for key, value in flags.items() if flag_key(key) in guards and guards[flag_key(key)].refuses(value)]


def engine_guard_problems(flags: Mapping, entry: Mapping, expected: Mapping, key_set: bool,
                          roles_dir: str | None = None) -> list[str]:
    """What is wrong with the engine's effective flags (empty when nothing is). ``entry`` is the engine's roster entry,
    ``expected`` the value of each reserved flag (a bool for a switch), ``key_set`` whether the role's API key
    variable holds a key; ``roles_dir`` where the engine's role is (default: this collection's roles)."""
    if not isinstance(flags, Mapping) or not isinstance(expected, Mapping):
        raise AnsibleFilterError("engine_guard_problems: the flags and the reserved values must be mappings")
    problems = _reserved_problems(flags, entry, expected)
    problems += _option_guard_problems(flags, entry, Path(roles_dir) if roles_dir else ROLES_DIR)
    host = str(flags.get("host", ""))
    if not key_set and not is_loopback(host):
        bound = host or "(no host flag: the engine's default address)"
        problems.append(f"{entry['name']} would bind {bound} but {entry['api_key_variable']} is empty: it would serve "
                        f"generation (and every other route) to anyone who reaches the port. Set "
                        f"{entry['api_key_variable']} (from a vault), or bind the engine to 127.0.0.1 and put a proxy "
                        "that authenticates in front.")
    return problems


def engine_environment_problems(environment: Mapping, entry: Mapping, roles_dir: str | None = None) -> list[str]:
    """The variables of the engine's effective environment (what its unit gets) that take a guard away."""
    if not isinstance(environment, Mapping):
        raise AnsibleFilterError("engine_environment_problems: the environment must be a mapping")
    guards = _guards(entry, Path(roles_dir) if roles_dir else ROLES_DIR)[1]
    problems = []
    for variable, value in environment.items():
        guard = refusing_environment_guard(guards, variable, value)
        if guard is not None:
            problems.append(guard.message(f"{entry['name']}'s environment {variable}", value))
    return problems


class FilterModule:
    def filters(self) -> dict:
        return {"engine_guard_problems": engine_guard_problems,
                "engine_environment_problems": engine_environment_problems}
