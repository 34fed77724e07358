"""Flag shaping shared by the engine roles: layers of flags merged in order, and flags as command-line words.

An engine role says which flags its profile sets (its own table, in its role); these filters do the rest the same way
for every engine: ``merged_flags`` combines the layers (base, speculative, multi-node, the role's defaults, the
profile's options, the extra options: a later layer wins a key), dropping every flag whose value is null or false
(a switch that is off, or a default the engine keeps); ``argv_words`` turns each flag into the words of a command line
(``--name value``; true: a bare switch; a list: the name then each item).
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

__all__ = ["FilterModule", "argv_words", "merged_flags"]


def merged_flags(layers: list) -> dict:
    """The layers combined in order (a later one wins a key), without the flags set to null or false."""
    merged: dict = {}
    for index, layer in enumerate(layers):
        if not isinstance(layer, Mapping):
            raise AnsibleFilterError(f"merged_flags: layer {index} must be a mapping of flags, got "
                                     f"{type(layer).__name__}")
        merged.update(layer)
    return {key: value for key, value in merged.items() if value is not None and value is not False}


def flag_words(key: str, value: object) -> list[str]:
    if not isinstance(key, str) or not key or key.startswith("-"):
        raise AnsibleFilterError(f"option {key!r}: give the flag's full name without leading dashes")
    if value is True:
        return [f"--{key}"]
    if isinstance(value, (list, tuple)):
        return [f"--{key}", *(str(item) for item in value)]
    return [f"--{key}", str(value)]


def argv_words(flags: Mapping) -> list[str]:
    """Every flag as command-line words, in order."""
    return [word for key, value in flags.items() for word in flag_words(key, value)]


class FilterModule:
    def filters(self) -> dict:
        return {"merged_flags": merged_flags, "argv_words": argv_words}
