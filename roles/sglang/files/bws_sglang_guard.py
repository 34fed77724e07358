"""SGLang plugin: the API keys never leave SGLang in a reply, a dump or a log line.

SGLang 0.5.23's `/server_info` and `/get_server_info` return the resolved server arguments, `api_key` and
`admin_api_key` included (`srt/entrypoints/http_server.py` `get_server_info`, `srt/utils/common.py`
`build_server_info`), to every client that holds the API key; so an API client could read the admin key. Every
place that publishes the server arguments (that reply, the native gRPC reply, the start-up `server_args=` line in
`srt/entrypoints/engine.py`, the request dumps of `srt/managers/tokenizer_manager.py`) passes them through
`redact_watermark_secrets` (`srt/sampling/watermarking/core.py`), which blanks only watermark secrets. This plugin
hooks that function so that it blanks the keys too.

The way in is SGLang's own plugin framework: general plugins are the entry points of the group
`sglang.srt.plugins` (`srt/plugins/__init__.py`), loaded in every SGLang process before the server starts, and
hooks are registered on a dotted target with `HookRegistry` (`srt/plugins/hook_registry.py`), which also rebinds
the names other modules imported. The entry point is declared by the `bws_sglang_guard-1.dist-info` directory
that the sglang role writes beside this file in the release directory, on the unit's PYTHONPATH.

SGLang logs a plugin that fails and goes on (fails open), so verify checks the outcome: a `/server_info` reply
that holds the key fails the gate (`roles/verify/tasks/readiness.yml`). Standard library only.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from bws_sglang_logging import REDACTED, redact

TARGET = "sglang.srt.sampling.watermarking.core.redact_watermark_secrets"
KEY_FIELDS = frozenset({"api_key", "admin_api_key"})


def redact_keys(value: Any) -> Any:
    """`value` with every api_key / admin_api_key field that holds a key replaced, in mappings, lists, dataclasses
    and command-line strings (`launch_command`); other values are returned as they are."""
    if isinstance(value, dict):
        return {key: REDACTED if key in KEY_FIELDS and item else redact_keys(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(redact_keys(item) for item in value)
    if isinstance(value, str):
        return redact(value) if "api-key" in value or "api_key" in value else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [field.name for field in dataclasses.fields(value) if field.name in KEY_FIELDS]
        if any(getattr(value, name) for name in fields):
            value = copy.copy(value)
            for name in fields:
                if getattr(value, name):
                    object.__setattr__(value, name, REDACTED)
    return value


def _redact_keys_after(result: Any, *args: Any, **kwargs: Any) -> Any:
    return redact_keys(result)


def register() -> None:
    """The entry point: SGLang's load_plugins() calls it in each of its processes."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _redact_keys_after, HookType.AFTER)
