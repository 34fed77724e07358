"""The secrets an engine unit gives its engine, read on the host: what verify looks for in the engine's answers, so
that it finds a key the engine publishes whichever key verify itself sent (SGLang's admin key is the host's, and
verify never holds it). Standard library only: it runs on the target.

Where the unit holds them: its command line (`--<flag> VALUE` or `--<flag>=VALUE`), the flat config file its command
line names with `--config FILE` (`key: <JSON value>` lines, as the sglang role renders it), and its environment
(Environment=, EnvironmentFile=: a variable whose name ends with the flag's, `VLLM_API_KEY` for `api-key`), and the
files it passes as credentials (LoadCredential=ID:PATH whose id ends with the flag's name, `api-key` as the vllm role
writes it: the whole file is the secret). The flags are the engine roster's `secret_flags`.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import unit_properties
from ansible_collections.blackwell.serving.plugins.module_utils.host.unit_file import (
    exec_start_argv,
    load_credentials,
    read_text,
    service_settings,
    unit_environment,
)

Reader = Callable[[str], "str | None"]


class UnitSecretsError(Exception):
    """A file the unit names cannot be read: the secrets it holds would go unlooked-for."""


def argv_values(argv: list[str], flags: list[str]) -> list[str]:
    """The values of `--<flag>` in argv, in either spelling (`--flag VALUE`, `--flag=VALUE`)."""
    values = []
    for index, word in enumerate(argv):
        for flag in flags:
            if word == f"--{flag}" and index + 1 < len(argv):
                values.append(argv[index + 1])
            elif word.startswith(f"--{flag}="):
                values.append(word[len(flag) + 3:])
    return values


def config_values(text: str, flags: list[str]) -> list[str]:
    """The values of the flags' keys (`-` or `_` alike) in a flat `key: <JSON value>` config file."""
    wanted = {flag.replace("_", "-") for flag in flags}
    values = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "---")) or ":" not in line:
            continue
        key, _, value = line.partition(":")
        if key.strip().replace("_", "-") not in wanted:
            continue
        try:
            parsed = json.loads(value.strip())
        except ValueError:
            parsed = value.strip()
        if parsed is not None and parsed is not False:
            values.append(parsed if isinstance(parsed, str) else json.dumps(parsed))
    return values


def names_a_flag(name: str, flags: list[str]) -> bool:
    """The name ends with a flag's, `_` and `-` alike (`VLLM_API_KEY` and `admin-api-key` end with `api-key`)."""
    suffixes = tuple("_" + flag.upper().replace("-", "_") for flag in flags)
    return ("_" + name).endswith(suffixes)


def environment_values(environment: dict[str, str], flags: list[str]) -> list[str]:
    return [value for name, value in environment.items() if names_a_flag(name, flags)]


def credential_values(credentials: list[tuple[str, str]], flags: list[str], read: Reader) -> list[str]:
    """The contents of the credentials whose id names a secret flag (`api-key`, `admin_api_key` alike), one trailing
    newline dropped as the engine's reader drops it; raises UnitSecretsError for one whose file cannot be read (a
    relative path or bare id is looked up in systemd's credential stores, which this does not search)."""
    values = []
    for credential_id, source in credentials:
        if not names_a_flag(credential_id.upper().replace("-", "_"), flags):
            continue
        text = read(source) if source.startswith("/") else None
        if text is None:
            raise UnitSecretsError(f"the unit's credential {credential_id} ({source}) cannot be read")
        values.append(text.removesuffix("\n"))
    return values


def unit_text_secrets(unit_text: str, flags: list[str], read: Reader = read_text) -> list[str]:
    """The non-empty secret values a unit file gives its process; raises UnitSecretsError when a file it names
    (its --config, a non-optional EnvironmentFile=, a LoadCredential= of a secret flag) cannot be read."""
    settings = service_settings(unit_text)
    argv = exec_start_argv(settings)
    values = argv_values(argv, flags)
    if "--config" in argv[:-1]:
        path = argv[argv.index("--config") + 1]
        text = read(path)
        if text is None:
            raise UnitSecretsError(f"the unit's config file {path} cannot be read")
        values += config_values(text, flags)
    try:
        values += environment_values(unit_environment(settings, read), flags)
    except OSError as error:
        raise UnitSecretsError(str(error)) from error
    values += credential_values(load_credentials(settings), flags, read)
    return sorted({value for value in values if value})


def unit_secrets(unit: str, flags: list[str], read: Reader = read_text) -> list[str]:
    """The secrets of the unit systemd loaded (its FragmentPath: the trial copy while a release is on trial); none
    where systemd does not run here or knows no such unit."""
    path = unit_properties(unit, ("FragmentPath",)).get("FragmentPath") if unit else None
    text = read(path) if path else None
    return unit_text_secrets(text, flags, read) if text is not None else []
