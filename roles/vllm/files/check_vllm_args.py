#!/usr/bin/env python3
"""Validate a rendered `vllm serve` argv with the installed vLLM's own parser, abbreviations off.

Run it with the engine venv's interpreter:

    <venv>/bin/python check_vllm_args.py argv.json      # or: ... check_vllm_args.py - < argv.json
    <venv>/bin/python check_vllm_args.py --many cases.json   # a JSON list of argv lists, one import for all

The input is the JSON list of arguments the role renders (not a string to re-split), for example
["serve", "/models/kimi", "--tensor-parallel-size", "8", "--speculative-config", "{\"method\": …}"].
A leading program ("vllm" or a path ending in /vllm) is ignored; a list that does not start with "serve"
is taken as the arguments of `vllm serve`.

What it checks, with vLLM's real code of the installed version (0.14 … 0.33):
  * the `vllm serve` parser, with prefix abbreviations disabled on the parser and on every subparser
    (`--tensor-parallel 8` or `--speculative-num-step` are errors here, although vLLM itself would take them);
  * the serve command's own validation (validate_parsed_serve_args);
  * --speculative-config: its JSON keys against the SpeculativeConfig fields (the config forbids unknown
    keys, but vLLM only finds out after loading the model) and each value against the field's type.
On success it prints one JSON object with the arguments that differ from vLLM's defaults and exits 0.
On failure it prints the parser's own message to stderr and exits 2 (1 for unusable input).
With --many it prints a JSON list (per argv: ok, and non_default or error) and exits 2 if any is rejected.
No GPU is needed: where vLLM finds no platform, a parse-only one is installed so its config defaults resolve.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import sys
from typing import Any

EXIT_INPUT = 1
EXIT_REJECTED = 2


def read_json(source: str):
    try:
        if source == "-":
            return json.loads(sys.stdin.read())
        with open(source, encoding="utf-8") as handle:
            return json.loads(handle.read())
    except (OSError, ValueError) as exc:
        sys.exit(f"check_vllm_args: cannot read JSON from {source}: {exc}")


def normalise_argv(argv) -> list[str]:
    if isinstance(argv, dict) and "argv" in argv:
        argv = argv["argv"]
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        sys.exit("check_vllm_args: the input must be a JSON list of strings (the rendered argv)")
    if argv and (argv[0] == "vllm" or argv[0].endswith("/vllm")):
        argv = argv[1:]
    if not argv or argv[0] != "serve":
        argv = ["serve", *argv]
    return argv


def install_parse_only_platform() -> None:
    """Without a GPU vLLM's platform is 'unspecified' and DeviceConfig() cannot infer a device type."""
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.interface import UnspecifiedPlatform

        class ParseOnlyPlatform(UnspecifiedPlatform):
            device_type = "cpu"

        platforms._current_platform = ParseOnlyPlatform()


def disable_abbreviations(parser: argparse.ArgumentParser) -> None:
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                disable_abbreviations(sub)


def build_parser():
    from vllm.entrypoints.cli import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm", allow_abbrev=False)
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = serve.cmd_init()[0]
    command.subparser_init(subparsers)
    disable_abbreviations(parser)
    return parser, command


def speculative_config_errors(value: Any) -> list[str]:
    """Unknown keys and ill-typed values in --speculative-config, judged by SpeculativeConfig's fields."""
    if value is None:
        return []
    if not isinstance(value, dict):
        return [f"--speculative-config must be a JSON object, got {type(value).__name__}"]
    from vllm.config.speculative import SpeculativeConfig

    fields = {f.name: f for f in dataclasses.fields(SpeculativeConfig) if f.init}
    errors = [f"--speculative-config: unknown key '{key}' (SpeculativeConfig does not accept it; "
              f"valid keys: {', '.join(sorted(fields))})" for key in value if key not in fields]
    try:
        from typing import get_type_hints

        from pydantic import TypeAdapter

        hints = get_type_hints(SpeculativeConfig, include_extras=True)
    except Exception:  # type checking is a bonus; unknown keys are the main check
        return errors
    for key, item in value.items():
        if key in fields and key in hints:
            try:
                TypeAdapter(hints[key]).validate_python(item)
            except Exception as exc:  # pydantic's ValidationError, or a type it cannot build
                if exc.__class__.__name__ == "ValidationError":
                    lines = str(exc).splitlines()  # "1 validation error for …", then the reason
                    reason = lines[1].strip() if len(lines) > 1 else str(exc)
                    errors.append(f"--speculative-config: '{key}'={item!r}: {reason}")
    return errors


def jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def check(parser, command, argv: list[str]) -> dict:
    """Parse and validate one argv; argparse's own error message on failure (it exits 2 via SystemExit)."""
    namespace = parser.parse_args(argv)
    serve_parser = parser._subparsers._group_actions[0].choices["serve"]
    try:
        command.validate(namespace)
    except (ValueError, TypeError, argparse.ArgumentError) as exc:
        serve_parser.error(str(exc))
    problems = speculative_config_errors(getattr(namespace, "speculative_config", None))
    if problems:
        serve_parser.error("; ".join(problems))
    defaults = vars(parser.parse_args(["serve"]))
    changed = {key: jsonable(value) for key, value in sorted(vars(namespace).items())
               if key != "dispatch_function" and defaults.get(key, object()) != value}
    return {"ok": True, "argv": argv, "non_default": changed}


def check_capturing(parser, command, argv: list[str]) -> dict:
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return check(parser, command, argv)
    except SystemExit as exc:
        return {"ok": False, "argv": argv, "exit": exc.code, "error": stderr.getvalue().strip()}


def main(args: list[str]) -> int:
    many = bool(args) and args[0] == "--many"
    if many:
        args = args[1:]
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return EXIT_INPUT
    data = read_json(args[0])
    if many and not isinstance(data, list):
        sys.exit("check_vllm_args: --many needs a JSON list of argv lists")
    cases = [normalise_argv(item) for item in data] if many else [normalise_argv(data)]
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    install_parse_only_platform()
    parser, command = build_parser()
    import importlib.metadata

    version = importlib.metadata.version("vllm")
    if many:
        results = [check_capturing(parser, command, argv) for argv in cases]
        print(json.dumps({"vllm_version": version, "results": results}, indent=2, sort_keys=True))
        return 0 if all(r["ok"] for r in results) else EXIT_REJECTED
    result = check(parser, command, cases[0])  # on a rejection argparse prints and exits 2
    print(json.dumps({**result, "vllm_version": version}, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
