#!/usr/bin/env python3
"""Check an SGLang YAML config (the file `sglang serve --config FILE` reads) with SGLang's own parser.

Run it with the engine venv's python, so the check uses the installed engine's code:

    <venv>/bin/python check_sglang_args.py [--resolve] /etc/sglang/<profile>.yaml [EXTRA_ARGV ...]

1. The config is merged into argv by SGLang's own merger, the code path `--config` takes
   (`sglang.srt.utils.server_args_config_parser.ConfigArgumentMerger`, as `prepare_server_args` uses it).
2. The merged argv is parsed by `ServerArgs.add_cli_args` on a parser with abbreviations OFF: SGLang's
   server accepts unique prefixes, so a typo such as `speculative-num-step` would otherwise be taken as
   `speculative-num-steps` without a word. Unknown keys, bad choices and bad values are rejected with the
   parser's own message.
3. `ServerArgs.from_cli_args` builds the server's argument object, as the server does.
4. With --resolve (the semantic check, on the GPU host): `ServerArgs.resolve_once()`, the resolution pipeline
   the server runs before it loads anything (sglang/srt/server_args.py, srt/arg_groups/pipeline.py of 0.5.23):
   it reads the model's and the drafter's config.json and runs the model, attention-backend, memory and
   speculative hooks, which reject combinations the parser accepts (for example EAGLE3 with the flex_attention
   backend). Parsing alone never reaches them, and neither does resolution for a dummy model path. Run it as
   the service user with HF_HUB_OFFLINE=1, so it reads the local weights the way the engine will.

Exit status: 0 accepted (prints JSON of the values that matter), 2 rejected by SGLang, 1 unusable input.
Secrets (API keys and the like) are never printed: not in the JSON, not in an error message.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

EXIT_REJECTED = 2
EXIT_UNUSABLE = 1


def running_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


def who() -> str:
    """The interpreter, user and Hub mode this check runs with, for messages about why it could not run."""
    hub = os.environ.get("HF_HUB_OFFLINE", "unset")
    return f"with {sys.executable} as user {running_user()} (HF_HUB_OFFLINE={hub})"


try:
    import yaml  # the engine venv has it: SGLang's --config merger reads the file with PyYAML
except ImportError as _exc:
    print(f"check_sglang_args: cannot import PyYAML {who()}: {_exc}", file=sys.stderr)
    sys.exit(EXIT_UNUSABLE)
# Flag names whose values are secrets: --api-key, --admin-api-key, --ssl-keyfile-password, and the
# watermark configuration (it carries the watermark key; upstream redacts it from its launch command too).
SECRET_KEY = re.compile(r"((^|[-_])(api[-_]key|password|passwd|secret|token)|watermark[-_]config)$",
                        re.IGNORECASE)
REDACTED = "<redacted>"
REPORTED_FIELDS = (
    "model_path", "tokenizer_path", "served_model_name", "tp_size", "dp_size", "ep_size", "pp_size",
    "host", "port", "context_length", "mem_fraction_static", "max_running_requests", "quantization",
    "kv_cache_dtype", "attention_backend", "trust_remote_code", "disable_custom_all_reduce",
    "enable_metrics", "tool_call_parser", "reasoning_parser", "cuda_graph_max_bs_decode",
    "nnodes", "node_rank", "dist_init_addr",
    "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
    "speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_draft_attention_backend",
    "speculative_draft_kv_cache_dtype",
)


class RejectedError(Exception):
    """SGLang's parser refused the configuration."""


class ResolutionRejectedError(RejectedError):
    """SGLang's resolution (ServerArgs.resolve_once) refused a configuration its parser accepted."""


class StrictParser(argparse.ArgumentParser):
    """argparse with abbreviations off whose errors raise instead of printing and exiting."""

    def __init__(self) -> None:
        super().__init__(prog="sglang serve", allow_abbrev=False, add_help=False)

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            # argparse lists the unknown tokens, values included: a misspelled secret key (api-keyy) would
            # print the secret. Name the unknown flags only.
            tokens = message[len(prefix):].split()
            flags = [token.partition("=")[0] for token in tokens if token.startswith("-")]
            message = f"{prefix}{' '.join(flags)} (values not shown)"
        raise RejectedError(message)


class UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice (plain safe_load keeps the last one silently)."""


def _construct_unique_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def secret_values(config: dict[str, Any], extra_argv: list[str]) -> list[str]:
    """The values of every secret-looking key, longest first (so redaction never leaves a tail)."""
    values = [str(value) for key, value in config.items()
              if SECRET_KEY.search(str(key)) and value not in (None, "", True, False)]
    for index, token in enumerate(extra_argv):
        name, eq, inline = token.partition("=")
        if token.startswith("--") and SECRET_KEY.search(name[2:]):
            if eq:
                values.append(inline)
            elif index + 1 < len(extra_argv):
                values.append(extra_argv[index + 1])
    return sorted({v for v in values if v}, key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def load_config(path: Path) -> dict[str, Any]:
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"{path}: SGLang reads only .yaml/.yml config files")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)  # a SafeLoader subclass
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config must be a mapping of flag names to values")
    return data


def resolve(server_args: Any) -> dict[str, Any]:
    """Run SGLang's own resolution; its error is the rejection message. Returns the resolved values."""
    try:
        server_args.resolve_once()
    except ImportError:
        raise
    except Exception as exc:  # the hooks raise ValueError, AssertionError, NotImplementedError, RuntimeError...
        raise ResolutionRejectedError(f"{type(exc).__name__}: {exc}") from exc
    return server_args.resolved_dict()


def check(config_path: Path, extra_argv: list[str], semantic: bool = False) -> dict[str, Any]:
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    parser = StrictParser()
    ServerArgs.add_cli_args(parser)
    try:
        merger = ConfigArgumentMerger(parser)
        argv = merger.merge_config_with_args(["--config", str(config_path), *extra_argv])
    except ValueError as exc:
        raise RejectedError(str(exc)) from exc
    namespace = parser.parse_args(argv)
    try:
        server_args = ServerArgs.from_cli_args(namespace)
    except (ValueError, TypeError, AssertionError) as exc:
        raise RejectedError(f"{type(exc).__name__}: {exc}") from exc
    if not semantic:
        return {**summarize(field_values(server_args)), "resolved": False}
    return {**summarize(resolve(server_args)), "resolved": True}


def field_values(server_args: Any) -> dict[str, Any]:
    """ServerArgs' fields: a msgspec Struct in 0.5.2x (no __dict__ entries), a dataclass before."""
    names = getattr(type(server_args), "__struct_fields__", None)
    if names is None:
        names = [name for name in vars(server_args) if not name.startswith("_")]
    return {name: getattr(server_args, name) for name in names}


def summarize(fields: dict[str, Any]) -> dict[str, Any]:
    summary = {name: fields[name] for name in REPORTED_FIELDS if name in fields}
    summary["api_key_set"] = bool(fields.get("api_key"))
    summary["admin_api_key_set"] = bool(fields.get("admin_api_key"))
    return json.loads(json.dumps(summary, default=str))


def sglang_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return EXIT_UNUSABLE if not argv else 0
    semantic = argv[0] == "--resolve"
    if semantic:
        argv = argv[1:]
        if not argv:
            print(__doc__, file=sys.stderr)
            return EXIT_UNUSABLE
    config_path, extra_argv = Path(argv[0]), argv[1:]
    secrets: list[str] = []
    try:
        config = load_config(config_path)
        secrets = secret_values(config, extra_argv)
        result = check(config_path, extra_argv, semantic)
    except RejectedError as exc:
        print(f"sglang serve: error: {redact(str(exc), secrets)}", file=sys.stderr)
        stage = ("resolution (ServerArgs.resolve_once)" if isinstance(exc, ResolutionRejectedError)
                 else "parser (abbreviations off)")
        print(f"REJECTED by sglang {sglang_version()}'s {stage}: {config_path}", file=sys.stderr)
        return EXIT_REJECTED
    except ValueError as exc:
        print(f"check_sglang_args: {redact(str(exc), secrets)}", file=sys.stderr)
        return EXIT_UNUSABLE
    except ImportError as exc:
        print(f"check_sglang_args: cannot import SGLang's parser {who()}: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    result = {"config": str(config_path), "sglang_version": sglang_version(), "abbreviations": False,
              **result}
    print(redact(json.dumps(result, indent=2, sort_keys=True), secrets))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
