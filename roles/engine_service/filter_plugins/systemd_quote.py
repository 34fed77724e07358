"""Filters that render an argv list as a systemd ExecStart= command line.

systemd splits ExecStart= itself (systemd.service(5), "Command lines"): words are separated by
whitespace, double or single quotes group, backslash escapes inside quotes, `$VAR`/`${VAR}` are
expanded from the environment and `%x` are unit specifiers. Every word is therefore escaped so
that systemd hands the engine exactly the argv the role computed.
"""

from __future__ import annotations

import re

_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./${}-]+$")


def systemd_escape_word(word: object) -> str:
    text = str(word)
    if text == "":
        return '""'
    text = text.replace("%", "%%").replace("$", "$$")
    if _SAFE_WORD.match(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def systemd_exec_args(argv: list[object]) -> str:
    if not isinstance(argv, list) or not argv:
        raise ValueError("systemd_exec_args needs a non-empty list of arguments")
    return " ".join(systemd_escape_word(word) for word in argv)


def systemd_env_value(value: object) -> str:
    """Quote one Environment= assignment value (the whole KEY=value word is quoted by the template)."""
    return str(value).replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')


class FilterModule:
    def filters(self) -> dict:
        return {
            "systemd_exec_args": systemd_exec_args,
            "systemd_escape_word": systemd_escape_word,
            "systemd_env_value": systemd_env_value,
        }
