"""SGLang plugin: the API keys never leave SGLang in a reply, a dump or a log line, and nothing keyless grows or
reaches across origins.

Keys out of what SGLang publishes. SGLang 0.5.23's `/server_info` and `/get_server_info` return the resolved server
arguments, `api_key` and `admin_api_key` included (`srt/entrypoints/http_server.py` `get_server_info`,
`srt/utils/common.py` `build_server_info`), to every client that holds the API key; so an API client could read the
admin key. Every place that publishes the server arguments (that reply, the native gRPC reply, the start-up
`server_args=` line in `srt/entrypoints/engine.py`, the dumps' resolved config of `srt/managers/tokenizer_manager.py`)
passes them through `redact_watermark_secrets` (`srt/sampling/watermarking/core.py`), which blanks only watermark
secrets: this plugin hooks that function so that it blanks the keys too. The crash dump and the request dump
(`TokenizerManager._dump_data_to_file`, `dump_requests_before_crash`) also pickle `_server_args_for_dump()`, which is
the ServerArgs record as it is unless a watermark is configured: hooked, it is the redacted resolved dictionary (the
form upstream dumps with a watermark).

The front end (`KeylessGuard`, an ASGI middleware put outermost, before SGLang's own middleware):
- Paths under `/health`, `/ready` and `/metrics` pass SGLang's key middleware without a key
  (`srt/utils/auth.py` `decide_request_auth`), and SGLang's HTTP metrics label a path no route matches by its raw
  text (`srt/observability/http_request_metrics.py` `_get_fastapi_request_path`): each keyless `GET /health<random>`
  made new series, for ever. Under those prefixes only the app's own route paths pass; anything else is answered 404
  before SGLang's metrics see it. A path no route of the app matches is answered 404 the same way where no API key is
  set or the request holds a key; a keyless request to such a path where a key is set is left to SGLang's 401.
- Where no API key is set (the roles allow that on loopback only), SGLang serves every route but its admin routes to
  whoever reaches the port, and its CORS middleware (`srt/entrypoints/http_server.py`: every origin, credentials,
  every method and header) lets any web page read the answers. The guard then refuses (403) a request whose `Host`
  is not a loopback name or the listen address (with or without the listen port: a DNS-rebinding page names its
  own host) and one whose `Origin` is not the engine's own origin (a cross-origin page): the rules of
  roles/engine_service/files/bws_same_origin.py, which vLLM's keyless middleware shares.
- SGLang's key middleware passes every scope that is not HTTP (`srt/utils/auth.py`), so a WebSocket route
  (`/v1/realtime`) would need no key; no WebSocket library is in the pinned venv today (uvicorn answers no upgrade),
  and the guard closes a WebSocket without the key all the same (tests/unit checks the lock).

The middleware goes in through SGLang's own hooks, so that it is outermost when the server starts: after
`add_http_request_metrics_middleware` (called when `srt/entrypoints/http_server.py` is imported, after the plugins are
loaded) and again after `add_api_key_middleware` (`_setup_and_run_http_server`), each time moved to the front of the
app's middleware (Starlette runs the first entry of `user_middleware` first).

The way in is SGLang's own plugin framework: general plugins are the entry points of the group
`sglang.srt.plugins` (`srt/plugins/__init__.py`), loaded in every SGLang process before the server starts, and
hooks are registered on a dotted target with `HookRegistry` (`srt/plugins/hook_registry.py`), which also rebinds
the names other modules imported. The entry point is declared by the `bws_sglang_guard-1.dist-info` directory
that the sglang role writes beside this file in the release directory, on the unit's PYTHONPATH.

SGLang logs a plugin that fails and goes on (fails open), so verify checks the outcome: a `/server_info` reply
that holds a key fails the gate (`roles/verify/tasks/readiness.yml`). Standard library only (Starlette, which SGLang
serves with, is imported when the middleware is installed).
"""

from __future__ import annotations

import copy
import dataclasses
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from bws_same_origin import refuse, same_origin
from bws_sglang_logging import REDACTED, redact

TARGET = "sglang.srt.sampling.watermarking.core.redact_watermark_secrets"
DUMP_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._server_args_for_dump"
METRICS_TARGET = "sglang.srt.observability.http_request_metrics.add_http_request_metrics_middleware"
AUTH_TARGET = "sglang.srt.utils.auth.add_api_key_middleware"
KEY_FIELDS = frozenset({"api_key", "admin_api_key"})
# The paths SGLang's key middleware lets through without a key (srt/utils/auth.py decide_request_auth, by prefix).
OPEN_PREFIXES = ("/health", "/ready", "/metrics")
NOT_FOUND = (404, {"detail": "Not Found"})  # FastAPI's own answer to a path no route matches
FORBIDDEN = (403, {"error": "Forbidden"})  # the shape of SGLang's own refusals (srt/utils/auth.py)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


# --- keys out of what SGLang publishes and dumps -------------------------------------------------------------------
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


def _dump_without_keys(result: Any, *args: Any, **kwargs: Any) -> Any:
    """What a crash or request dump pickles as its `server_args`: the resolved dictionary with the keys blanked (the
    ServerArgs record as it is holds them; its `resolved_dict()` is what /server_info publishes)."""
    if not isinstance(result, dict):
        try:
            result = result.resolved_dict()
        except Exception:  # no server arguments in the dump rather than the keys
            return {}
    return redact_keys(result)


# --- the front end: bounded, keyed, same-origin --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Settings:
    """What the guard needs of SGLang's serving arguments."""

    api_key: str | None
    admin_api_key: str | None
    host: str
    port: int


def sglang_settings() -> Settings:
    """From SGLang's published configuration (srt/runtime_context.py get_serving), read at the first request."""
    from sglang.srt.runtime_context import get_serving

    serving = get_serving()
    return Settings(api_key=serving.api_key or None, admin_api_key=serving.admin_api_key or None,
                    host=str(serving.host or ""), port=int(serving.port))


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers") or []}


def holds_key(headers: dict[str, str], keys: tuple[str | None, ...]) -> bool:
    """Whether the request's `Authorization: Bearer` is one of `keys`, compared in constant time."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    found = False
    for key in keys:
        if key:  # the header's bytes as they came (latin-1), against the key's UTF-8
            found |= secrets.compare_digest(token.encode("latin-1"), key.encode("utf-8"))
    return found


def route_path(scope: Scope) -> str:
    """The path the router matches: the request's path without the app's root path (Starlette's get_route_path)."""
    path, root = scope.get("path") or "/", scope.get("root_path") or ""
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root):] or "/"
    return path


def _route_paths(routes: list[Any]) -> set[str]:
    """Every route path of the app, those of included routers too (FastAPI's `_IncludedRouter` keeps them in its
    `effective_route_contexts()`; it has no path of its own)."""
    paths: set[str] = set()
    for route in routes:
        if hasattr(route, "effective_route_contexts"):
            paths.update(str(context.path) for context in route.effective_route_contexts() if context.path)
        elif isinstance(getattr(route, "path", None), str):
            paths.add(route.path)
    return paths


def _matches(routes: list[Any], scope: Scope) -> bool:
    """Whether a route of the app matches the request's path (fully, or for another method), as the router and
    SGLang's metrics middleware match it."""
    for route in routes:
        try:
            match, _ = route.matches(scope)
        except Exception:  # a route that cannot judge this scope does not match it
            continue
        if getattr(match, "name", "NONE") != "NONE":
            return True
    return False


class KeylessGuard:
    """The ASGI middleware; `fastapi_app` is the app whose routes are the engine's (SGLang's module-level app)."""

    def __init__(self, app: App, fastapi_app: Any, settings: Callable[[], Settings] = sglang_settings) -> None:
        self.app, self.fastapi_app = app, fastapi_app
        self._read_settings, self._settings = settings, None
        self._open_paths: tuple[int, frozenset[str]] = (-1, frozenset())

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = self._read_settings()
        return self._settings

    def _routes(self) -> list[Any]:
        """The app's routes, as SGLang's key middleware reads them (srt/utils/auth.py)."""
        router = getattr(self.fastapi_app, "router", None)
        return getattr(router, "routes", None) or getattr(self.fastapi_app, "routes", [])

    def open_paths(self, routes: list[Any]) -> frozenset[str]:
        """The app's own route paths under the open prefixes (a mount's with its trailing slash too); the routes are
        read again when their number changes (SGLang mounts /metrics at start-up, srt/utils/common.py)."""
        if self._open_paths[0] != len(routes):
            paths = {path for path in _route_paths(routes) if path.startswith(OPEN_PREFIXES)}
            self._open_paths = (len(routes), frozenset(paths | {path + "/" for path in paths}))
        return self._open_paths[1]

    def refusal(self, scope: Scope) -> tuple[int, dict[str, str]] | None:
        """The answer that refuses the request, or None to pass it on."""
        settings, headers = self.settings, _headers(scope)
        if not settings.api_key and not same_origin(headers, settings.host, settings.port):
            return FORBIDDEN
        if scope["type"] == "websocket":
            if settings.api_key and not holds_key(headers, (settings.api_key, settings.admin_api_key)):
                return FORBIDDEN
            return None
        path, routes = route_path(scope), self._routes()
        if path.startswith(OPEN_PREFIXES):
            return None if path in self.open_paths(routes) else NOT_FOUND
        if _matches(routes, scope):
            return None
        if settings.api_key and not holds_key(headers, (settings.api_key, settings.admin_api_key)):
            return None  # SGLang's own middleware answers 401, whether the path exists or not
        return NOT_FOUND

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = self.refusal(scope) if scope["type"] in ("http", "websocket") else None
        if refused is None:
            await self.app(scope, receive, send)
            return
        await refuse(scope, receive, send, *refused)


def install(app: Any) -> None:
    """Put the guard first (outermost) in the app's middleware, once; before the app starts."""
    from starlette.middleware import Middleware

    app.user_middleware[:] = [entry for entry in app.user_middleware if getattr(entry, "cls", None) is not KeylessGuard]
    app.user_middleware.insert(0, Middleware(KeylessGuard, fastapi_app=app))


def _install_after(result: Any, app: Any, *args: Any, **kwargs: Any) -> None:
    install(app)


def register() -> None:
    """The entry point: SGLang's load_plugins() calls it in each of its processes."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _redact_keys_after, HookType.AFTER)
    HookRegistry.register(DUMP_TARGET, _dump_without_keys, HookType.AFTER)
    HookRegistry.register(METRICS_TARGET, _install_after, HookType.AFTER)
    HookRegistry.register(AUTH_TARGET, _install_after, HookType.AFTER)
