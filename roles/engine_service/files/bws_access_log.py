"""uvicorn's request lines without their query strings, for both engines' front ends.

uvicorn's access log (logger `uvicorn.access`: one line per request, the target as the client sent it) and its
WebSocket handshake lines (logger `uvicorn.error`) write the request target query string included, and a key a client
put in a query string (`?api_key=...`: neither engine reads a key there, clients send one all the same) reached the
journal. `RedactQueryString` on those loggers keeps each line, its client, method, path and status, with the query
string replaced. SGLang's release puts it there through its logging.json (roles/sglang/files/bws_sglang_logging.py);
vLLM's through the key middleware (roles/vllm/files/bws_vllm_auth.py, `redact_uvicorn_query_strings`).

Installed by the engine roles in every release directory (on the unit's PYTHONPATH); the standard library only.
"""

from __future__ import annotations

import logging

REDACTED = "<redacted>"
UVICORN_LOGGERS = ("uvicorn.access", "uvicorn.error")
# uvicorn's lines that carry the request target, and the index of the target among their arguments: the access line
# (logger uvicorn.access) and the WebSocket handshake lines (logger uvicorn.error), uvicorn/protocols/*/*_impl.py.
_TARGET_ARG = {'%s - "%s %s HTTP/%s" %d': 2, '%s - "WebSocket %s" [accepted]': 1, '%s - "WebSocket %s" 403': 1,
               '%s - "WebSocket %s" %d': 1}


def redact_query(target: str) -> str:
    """A request target with its query string, whatever it holds, replaced: `/v1/models?<redacted>`."""
    path, question, _ = target.partition("?")
    return f"{path}?{REDACTED}" if question else target


class RedactQueryString(logging.Filter):
    """For uvicorn's request lines (`'%s - "%s %s HTTP/%s" %d'`: client, method, target, version, status, which
    uvicorn's AccessFormatter unpacks; and its WebSocket lines): the target's query string replaced, the record's
    arguments otherwise as they were. Other records pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        index = _TARGET_ARG.get(record.msg) if isinstance(record.msg, str) else None
        args = record.args
        if index is not None and isinstance(args, tuple) and len(args) > index and isinstance(args[index], str):
            record.args = (*args[:index], redact_query(args[index]), *args[index + 1:])
        return True


def redact_uvicorn_query_strings() -> None:
    """Put RedactQueryString on uvicorn's loggers, once (dictConfig keeps a logger's filters when it configures the
    logger again)."""
    for name in UVICORN_LOGGERS:
        target = logging.getLogger(name)
        if not any(isinstance(existing, RedactQueryString) for existing in target.filters):
            target.addFilter(RedactQueryString())
