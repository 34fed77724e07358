"""ASGI middleware for vLLM's API server: every route needs the API key, not only those under /v1.

vLLM 0.33.0 checks the key only on paths under /v1, /v2, /inference and /cohere
(`entrypoints/serve/middleware/authenticate.py`, GUARDED_PREFIX). Routes outside them serve without it, and
two generate: SageMaker's `/invocations` (always registered, `entrypoints/serve/sagemaker/api_router.py`),
which dispatches to chat and completions, and `/generative_scoring`; `/tokenize` and the others answer too.
vLLM has no switch to guard or drop them; it does take extra ASGI middleware by import path
(`--middleware`, `entrypoints/serve/middleware/register.py`), which is how the vllm role adds this one.

Open without the key, as SGLang leaves them (`srt/utils/auth.py`): the probes and the scrape, which carry no
prompt and no completion (/health, /ping, /metrics, /version) and CORS preflights (OPTIONS). Everything
else, HTTP and WebSocket, needs `Authorization: Bearer <key>`, compared as vLLM compares it (SHA-256 digests,
constant time). The key is the systemd credential `api-key` (the unit's `LoadCredential=api-key:<release>/api-key`,
a root-only file): systemd gives the API server process a copy in `$CREDENTIALS_DIRECTORY/api-key`, readable by the
service user alone, so the key is in no process's environment (vLLM's engine core and workers inherit the API
server's) and vLLM's own VLLM_API_KEY check stays off (this middleware covers its routes too). Without the credential
every guarded request is refused (fail closed; the role adds this middleware only when a key is set).

uvicorn's access log writes each request target as the client sent it, query string included (logger
`uvicorn.access`; WebSocket handshakes on `uvicorn.error`), and a key a client put in a query string (`?api_key=...`:
vLLM reads the key only from `Authorization`) reached the journal. vLLM configures uvicorn's logging before the app
starts (`entrypoints/launchers/api_server/entry.py`: uvicorn's defaults, or a file of its own through
`--log-config-file` / VLLM_LOGGING_CONFIG_PATH, which then replaces vLLM's own logging configuration too). When vLLM
builds this middleware (at the app's start, after that configuration), it puts `RedactQueryString` on those two
loggers (roles/engine_service/files/bws_access_log.py, shared with SGLang's release): the access log stays, each
line with its client, method, path and status, the query string replaced. Without a key the keyless middleware below
does the same (no key to leak then, but a query string may hold other secrets).

Without a key (the role allows that on loopback only) every route serves whoever reaches the port, and vLLM 0.33.0
checks no `Host` (it has no trusted-hosts option): a web page in a browser on the same machine drives it by DNS
rebinding. The role then adds `SameOriginOnly` instead, which refuses (403) a request whose `Host` is not a loopback
name or the listen address, or whose `Origin` is not the engine's own (roles/engine_service/files/bws_same_origin.py,
the rules SGLang's keyless guard uses). The listen address and port are the ones vLLM parsed (`app.state.args`, set by
`entrypoints/launchers/app.py` build_app before the middleware is built), read at the first request.

Installed by the vllm role in the release directory (the unit's PYTHONPATH), beside bws_access_log.py and
bws_same_origin.py; the standard library only.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from pathlib import Path

from bws_access_log import redact_uvicorn_query_strings
from bws_same_origin import refuse, same_origin

OPEN_PATHS = ("/health", "/ping", "/metrics", "/version")
CREDENTIAL = "api-key"
logger = logging.getLogger("vllm.bws_vllm_auth")


def is_open(path: str) -> bool:
    return any(path == open_path or path.startswith(open_path + "/") for open_path in OPEN_PATHS)


def credential_key() -> str:
    """The API key systemd passed as the credential `api-key` (one trailing newline dropped); empty when there is
    none, which refuses every guarded request."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY", "")
    if not directory:
        logger.warning("no CREDENTIALS_DIRECTORY: the unit passes no credential %s", CREDENTIAL)
        return ""
    try:
        return (Path(directory) / CREDENTIAL).read_text(encoding="utf-8").removesuffix("\n")
    except OSError as exc:
        logger.warning("the credential %s cannot be read: %s", CREDENTIAL, exc.strerror or exc)
        return ""


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token if scheme.lower() == "bearer" else None
    return None


class RequireApiKey:
    """Refuses, with vLLM's own 401 reply, every request outside OPEN_PATHS that lacks the key."""

    def __init__(self, app) -> None:
        self.app = app
        key = credential_key()
        self._digest = hashlib.sha256(key.encode("utf-8")).digest() if key else None
        if self._digest is None:
            logger.warning("no API key: every route but %s is refused", ", ".join(OPEN_PATHS))
        redact_uvicorn_query_strings()

    def allowed(self, scope: dict) -> bool:
        if scope.get("method") == "OPTIONS":
            return True
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if is_open(path):
            return True
        token = bearer_token(scope.get("headers", []))
        if self._digest is None or token is None:
            return False
        return secrets.compare_digest(hashlib.sha256(token.encode("utf-8")).digest(), self._digest)

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
            return
        await refuse(scope, receive, send, 401, {"error": "Unauthorized"})


def listen_address(scope: dict) -> tuple[str, int]:
    """The host and port vLLM parsed (`app.state.args`); ValueError when the app carries none."""
    args = getattr(getattr(scope.get("app"), "state", None), "args", None)
    port = getattr(args, "port", None)
    if not isinstance(port, int):
        raise ValueError("the app carries no parsed arguments (app.state.args.port)")
    return str(getattr(args, "host", None) or ""), port


class SameOriginOnly:
    """Refuses (403) every request, probes included, whose Host or Origin is not the engine's own; for an engine
    without a key. A scope whose listen address cannot be read is refused too (fail closed)."""

    def __init__(self, app) -> None:
        self.app = app
        self._address: tuple[str, int] | None = None
        redact_uvicorn_query_strings()

    def allowed(self, scope: dict) -> bool:
        try:
            if self._address is None:
                self._address = listen_address(scope)
        except ValueError as exc:
            logger.error("refusing the request: %s", exc)
            return False
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}
        return same_origin(headers, *self._address)

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        await refuse(scope, receive, send, 403, {"error": "Forbidden"})
