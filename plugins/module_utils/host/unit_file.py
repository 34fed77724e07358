"""What systemd makes of a unit file: its [Service] settings and the environment it gives the process
(stdlib only; runs on the target). Used by the interconnect_proof module to run the proof as the unit runs, by
secrets/unit_secrets.py to find the keys a unit gives its engine (its environment and its LoadCredential= files), and by
engine_drain for the unit's command line."""

from __future__ import annotations


def service_settings(unit_text: str) -> list[tuple[str, str]]:
    """(key, value) of every [Service] line of a unit file, in order, continuation lines joined."""
    settings, section, pending = [], None, ""
    for raw in unit_text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section == "Service" and "=" in line:
            key, _, value = line.partition("=")
            settings.append((key.strip(), value.strip()))
    return settings


def unquote_words(value: str) -> list[str]:
    """Split a systemd word list ("A=1" 'B=2' C=3) as systemd does for Environment=, un-escaping \\, \\" and %%."""
    words, current, quote, index, in_word = [], [], None, 0, False
    while index < len(value):
        char = value[index]
        if quote:
            if char == "\\" and index + 1 < len(value):
                index += 1
                current.append(value[index])
            elif char == quote:
                quote = None
            else:
                current.append(char)
        elif char in "\"'":
            quote, in_word = char, True
        elif char.isspace():
            if in_word:
                words.append("".join(current))
                current, in_word = [], False
        else:
            current.append(char)
            in_word = True
        index += 1
    if in_word:
        words.append("".join(current))
    return [word.replace("%%", "%") for word in words]


def exec_start_argv(settings: list[tuple[str, str]]) -> list[str]:
    """The first ExecStart= of the unit, split as systemd splits it (its prefixes -@:+! dropped, %% and $$ undone)."""
    for key, value in settings:
        if key == "ExecStart" and value:
            return [word.replace("$$", "$") for word in unquote_words(value.lstrip("-@:+!"))]
    return []


def parse_environment_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines of an EnvironmentFile= (comments and blank lines skipped, one level of quotes removed)."""
    env = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def unit_environment(settings: list[tuple[str, str]], read_file=None) -> dict[str, str]:
    """The environment the unit gives its process, as systemd builds it: Environment= lines, then EnvironmentFile=."""
    read_file = read_file or read_text
    env: dict[str, str] = {}
    for key, value in settings:
        if key == "Environment":
            for word in unquote_words(value):
                name, eq, val = word.partition("=")
                if eq:
                    env[name] = val
    for key, value in settings:
        if key == "EnvironmentFile":
            optional = value.startswith("-")
            path = value[1:] if optional else value
            text = read_file(path)
            if text is None and not optional:
                raise OSError(f"EnvironmentFile {path} of the unit cannot be read")
            env.update(parse_environment_file(text or ""))
    return env


def load_credentials(settings: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(id, source) of every LoadCredential=ID[:PATH] of the unit, in order; the source is the id itself where no
    path is given (systemd then looks the id up in its credential stores)."""
    credentials = []
    for key, value in settings:
        if key == "LoadCredential" and value:
            credential_id, sep, source = value.partition(":")
            credentials.append((credential_id, source if sep else credential_id))
    return credentials


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None
