"""Logging filter for SGLang's processes: the API keys never reach the journal.

SGLang 0.5.23 logs `server_args={...}` at INFO on every start, `api_key` and `admin_api_key` included: only
watermark secrets are redacted (`srt/entrypoints/engine.py`, `_server_args_for_logging`). The way upstream
allows to change that is its logging configuration: when `SGLANG_LOGGING_CONFIG_PATH` names a JSON file,
every SGLang process (server, scheduler, detokenizer) passes it to `logging.config.dictConfig` instead of its
own `basicConfig` (`srt/utils/common.py`, `configure_logger`). The release's logging.json puts this filter on
the one handler, so the line is still logged, with the keys' values replaced.

uvicorn's access log (logger `uvicorn.access`: one line per request, the target as the client sent it) is
configured by uvicorn itself after SGLang's logging (its LOGGING_CONFIG, adjusted by `srt/utils/common.py`
set_uvicorn_logging_configs: a handler of its own, no propagation), so the filter above never saw it, and a key a
client put in a query string (`?api_key=...`: SGLang reads the key only from `Authorization`, clients send one there
all the same) reached the journal. logging.json puts `bws_access_log.RedactQueryString` (shared with vLLM's release,
roles/engine_service/files/bws_access_log.py) on that logger itself, and on `uvicorn.error`, which logs WebSocket
handshakes with their target: dictConfig leaves a logger's filters in place when it configures the logger again (it
replaces its handlers only), so uvicorn's own configuration keeps them. Each line keeps its client, method, path and
status; the query string is replaced.

Installed by the sglang role beside logging.json in the release directory (on the unit's PYTHONPATH); the
standard library only.
"""

from __future__ import annotations

import logging
import re

REDACTED = "<redacted>"
# A Python or JSON string literal: what a repr'd dict (server_args=...) or a JSON document holds.
_STRING = r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*\""""
_FIELD = re.compile(r"""(?P<name>['"]?\b(?:admin_)?api_key['"]?\s*[:=]\s*)(?P<value>""" + _STRING + ")")
_FLAG = re.compile(r"(?P<name>--(?:admin-)?api-key(?:=|\s+))(?P<value>'[^']*'|\"[^\"]*\"|\S+)")


def redact(text: str) -> str:
    """The text with the value of every api_key / admin_api_key field and --api-key flag replaced."""
    text = _FIELD.sub(lambda m: f"{m['name']}'{REDACTED}'", text)
    return _FLAG.sub(lambda m: f"{m['name']}{REDACTED}", text)


class RedactApiKeys(logging.Filter):
    """Rewrites a record whose message names a key field; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not format: leave it to the handler's own error path
            return True
        if "api_key" in message or "api-key" in message:
            record.msg, record.args = redact(message), None
        return True
