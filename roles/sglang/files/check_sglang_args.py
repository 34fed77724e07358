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
5. With --resolve and a drafter (speculative decoding): the drafter's context against the target's, which
   resolution does not compare. SGLang compares them only in the running scheduler, after the switch: its draft
   worker builds the drafter's ModelConfig with the target's context length (srt/speculative/eagle_worker_v2.py,
   srt/managers/tp_worker.py `_init_model_config`), and `ModelConfig._derive_context_length`
   (srt/configs/model_config.py) refuses a target length longer than the one it derives from the drafter's
   config.json, unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1. Here the same ModelConfig is built for the
   drafter and SGLang's own `_derive_context_length` is called with the target's length, in this process's
   environment (the unit's): refused, the check rejects it naming both lengths and the two ways out; allowed by
   the variable, it passes with a WARNING line on stderr.

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
    "model_path", "tokenizer_path", "served_model_name", "tp_size", "dp_size", "attn_dp_size", "ep_size", "pp_size",
    "moe_a2a_backend", "moe_runner_backend", "speculative_draft_model_quantization",
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


class DraftContextRejectedError(RejectedError):
    """SGLang's draft ModelConfig refuses the drafter at the target's context length."""


# The unit's opt-in (the sglang role's sglang_allow_longer_draft_context sets it) and SGLang's own name for it.
DRAFT_CONTEXT_OPT_IN = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
ROLE_OPT_IN = "sglang_allow_longer_draft_context"


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
    resolved = resolve(server_args)
    return {**summarize(resolved), "resolved": True, **draft_context(server_args, resolved)}


def draft_context(server_args: Any, resolved: dict[str, Any]) -> dict[str, Any]:
    """The drafter's context against the target's, decided by SGLang's own code; {} without a drafter.

    The target's length is what its ModelConfig ends with (the profile's context_length, or the length SGLang
    derives from the model when the profile sets none). The drafter's ModelConfig is built as SGLang's draft
    worker builds it, first with a length of 1, which every drafter fits, so `_derive_context_length` neither
    refuses nor rewrites the drafter's config: the length SGLang derives from the drafter is then read with the
    function it uses (`get_context_length`, which applies a rope_scaling factor only without
    original_max_position_embeddings). Then `_derive_context_length` itself is called with the target's length.
    """
    draft_path = resolved.get("speculative_draft_model_path")
    if not resolved.get("speculative_algorithm") or not draft_path:
        return {}
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.utils.hf_transformers_utils import get_context_length

    try:
        target = ModelConfig.from_server_args(server_args).context_len
        draft = ModelConfig.from_server_args(server_args, model_path=draft_path,
                                             model_revision=resolved.get("speculative_draft_model_revision"),
                                             is_draft_model=True, context_length=1)
        derived = int(get_context_length(draft.hf_text_config))
    except ImportError:
        raise
    except Exception as exc:  # the draft worker would fail alike: its config is refused or unreadable
        raise DraftContextRejectedError(f"{type(exc).__name__}: {exc}") from exc
    report = {"draft_context_length": derived, "target_context_length": target}
    try:
        draft._derive_context_length(target)  # raises unless it fits or the environment allows it
    except ValueError as exc:
        raise DraftContextRejectedError(
            f"ValueError: {exc}\nThe drafter {draft_path} derives a context of {derived} tokens, shorter than the "
            f"target's {target}; SGLang would refuse it only after the switch, in its scheduler, where it builds the "
            f"drafter's model config. Either set the profile's context_length to {derived} or less, or set "
            f"{ROLE_OPT_IN}: true ({DRAFT_CONTEXT_OPT_IN}=1 in the unit: the drafter then runs past the context it "
            f"derives, which SGLang warns \"may lead to incorrect model outputs\").") from exc
    if target > derived:
        print(f"WARNING: the drafter {draft_path} derives a context of {derived} tokens, shorter than the target's "
              f"{target}; {DRAFT_CONTEXT_OPT_IN}=1 ({ROLE_OPT_IN}) lets SGLang run it at {target}.",
              file=sys.stderr)
    return {"draft_context": {**report, "runs_past_its_context": target > derived}}


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
                 else "draft model config (ModelConfig._derive_context_length, as its draft worker builds it)"
                 if isinstance(exc, DraftContextRejectedError) else "parser (abbreviations off)")
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
