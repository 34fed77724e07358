"""The engine_guard_problems filter: the checks every engine role runs on its flags as the engine will get them.

After every merge (base, speculative, multi-node, the role's defaults, the profile's options, the extra options) an
option could still have moved what must not move: each of the engine roster's ``reserved_flags`` (the bind address,
the port) must hold the value of what sets it, since the unit, the no-key refusal and verify read that; and an address
other than loopback must be served with a key (the roster's ``api_key_variable``), or every route of the engine
serves whoever reaches the port. Judged on the effective flags, what the engine binds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

__all__ = ["FilterModule", "engine_guard_problems"]

LOOPBACK = re.compile(r"^(127\.|::1$|localhost$)")


def _reserved_problems(flags: Mapping, entry: Mapping, expected: Mapping) -> list[str]:
    problems = []
    for flag, setter in entry["reserved_flags"].items():
        if flag not in expected:
            raise AnsibleFilterError(f"engine_guard_problems: the role gives no value for the reserved flag {flag} "
                                     f"({setter}) of {entry['name']}")
        if flag not in flags or str(flags[flag]) != str(expected[flag]):
            got = flags.get(flag, "(none: its default)")
            problems.append(f"{entry['name']} would get {flag} {got} after the options are merged, not "
                            f"{expected[flag]} ({setter}): set it with {setter}, never in the engine's options (a "
                            f"profile's {entry['role']}_options, or the role's default or extra options).")
    return problems


def engine_guard_problems(flags: Mapping, entry: Mapping, expected: Mapping, key_set: bool) -> list[str]:
    """What is wrong with the engine's effective flags (empty when nothing is). ``entry`` is the engine's roster entry,
    ``expected`` the value of each reserved flag, ``key_set`` whether the role's API key variable holds a key."""
    if not isinstance(flags, Mapping) or not isinstance(expected, Mapping):
        raise AnsibleFilterError("engine_guard_problems: the flags and the reserved values must be mappings")
    problems = _reserved_problems(flags, entry, expected)
    host = str(flags.get("host", ""))
    if not key_set and not LOOPBACK.match(host):
        bound = host or "(no host flag: the engine's default address)"
        problems.append(f"{entry['name']} would bind {bound} but {entry['api_key_variable']} is empty: it would serve "
                        f"generation (and every other route) to anyone who reaches the port. Set "
                        f"{entry['api_key_variable']} (from a vault), or bind the engine to 127.0.0.1 and put a proxy "
                        "that authenticates in front.")
    return problems


class FilterModule:
    def filters(self) -> dict:
        return {"engine_guard_problems": engine_guard_problems}
