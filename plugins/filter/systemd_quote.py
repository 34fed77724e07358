"""Filters that render an argv list as a systemd ExecStart= command line, and read back what systemd made of it.

systemd splits ExecStart= itself (systemd.service(5), "Command lines"): words are separated by
whitespace, double or single quotes group, backslash escapes inside quotes, `$VAR`/`${VAR}` are
expanded from the environment and `%x` are unit specifiers. Every word is therefore escaped so
that systemd hands the engine exactly the argv the role computed.
"""

from __future__ import annotations

import re

from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import parse_show

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


# Commands the unit template never sets: one of them in the loaded unit is a value that became a directive.
SHOWN_COMMANDS = ("ExecStartPre", "ExecStartPost", "ExecStop", "ExecStopPost", "ExecReload", "ExecCondition")


def systemd_show(text: str) -> dict[str, str]:
    """`systemctl show` KEY=VALUE lines of one unit as a mapping (host/systemd.py's parser, which the modules use)."""
    return parse_show(str(text))[0]


def unit_problems(shown: dict[str, str], intended: dict[str, object]) -> list[str]:
    """How the unit systemd loaded differs from the one the release meant: user, group, description, the one
    command line (systemd's own split of ExecStart=, argv[] joined by spaces) and no command beside it."""
    problems = [f"{key}={shown.get(key, '')!r}, the release says {intended[key]!r}"
                for key in ("User", "Group", "Description") if shown.get(key, "") != intended[key]]
    commands = re.findall(r"argv\[\]=(.*?) ; ignore_errors=", shown.get("ExecStart", ""))
    # Specifiers (%%) are resolved when systemd loads the unit, $$ only when it runs the command.
    wanted = " ".join(str(word).replace("$", "$$") for word in intended["ExecStart"])  # type: ignore[union-attr]
    if commands != [wanted]:
        problems.append(f"ExecStart runs {commands!r}, the release says [{wanted!r}]")
    problems += [f"{key}={shown[key]!r}: the release sets no such command" for key in SHOWN_COMMANDS
                 if shown.get(key)]
    return problems


def systemd_env_value(value: object) -> str:
    """Quote one Environment= assignment value (the whole KEY=value word is quoted by the template)."""
    return str(value).replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')


class FilterModule:
    def filters(self) -> dict:
        return {
            "systemd_exec_args": systemd_exec_args,
            "systemd_escape_word": systemd_escape_word,
            "systemd_env_value": systemd_env_value,
            "systemd_show": systemd_show,
            "systemd_unit_problems": unit_problems,
        }
