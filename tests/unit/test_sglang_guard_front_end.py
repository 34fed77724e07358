"""The front-end half of the SGLang guard plugin (roles/sglang/files/bws_sglang_guard.py): nothing keyless grows
SGLang's metrics, no foreign Host or Origin reaches a keyless engine, no WebSocket passes without the key, and dumps
carry no key; and the query-string redaction both engines' roles put on uvicorn's loggers. The real front end runs the
same code in tests/contract/test_real_front_ends.py."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
KEY, ADMIN = "sk-guard-Zq7", "admin-guard-Kd3"


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # the guard imports bws_sglang_logging by name, as on the unit's PYTHONPATH
    spec.loader.exec_module(module)
    return module


access_log = load(REPO / "roles" / "engine_service" / "files" / "bws_access_log.py")  # both releases ship it
same_origin = load(REPO / "roles" / "engine_service" / "files" / "bws_same_origin.py")  # and this one
sglang_logging = load(REPO / "roles" / "sglang" / "files" / "bws_sglang_logging.py")
guard_module = load(REPO / "roles" / "sglang" / "files" / "bws_sglang_guard.py")
vllm_auth = load(REPO / "roles" / "vllm" / "files" / "bws_vllm_auth.py")


# --- a stand-in for the app's routes, as Starlette matches them -------------------------------------------------------
class Match(Enum):
    NONE = 0
    PARTIAL = 1
    FULL = 2


@dataclass
class Route:
    path: str
    methods: tuple[str, ...] = ("GET",)
    prefix: bool = False  # a mount: SGLang's /metrics matches every path under it (srt/utils/common.py)

    def matches(self, scope: dict) -> tuple[Match, dict]:
        hit = scope["path"].startswith(self.path) if self.prefix else scope["path"] == self.path
        if not hit:
            return Match.NONE, {}
        return (Match.FULL if scope.get("method") in self.methods or self.prefix else Match.PARTIAL), {}


@dataclass
class EffectiveContext:
    path: str


@dataclass
class IncludedRouter:
    """FastAPI 0.165's `_IncludedRouter`: no path of its own, its routes in effective_route_contexts()."""

    routes: list[Route]

    def effective_route_contexts(self) -> list[EffectiveContext]:
        return [EffectiveContext(route.path) for route in self.routes]

    def matches(self, scope: dict) -> tuple[Match, dict]:
        found = [route.matches(scope)[0] for route in self.routes]
        return max(found, key=lambda match: match.value, default=Match.NONE), {}


@dataclass
class App:
    routes: list = field(default_factory=lambda: [
        Route("/health"), Route("/health_generate"), Route("/metrics", prefix=True),
        Route("/v1/chat/completions", ("POST",)), Route("/v1/models"),
        IncludedRouter([Route("/scale_elastic_ep", ("POST",)), Route("/is_scaling_elastic_ep")])])


def settings(api_key: str | None = KEY, host: str = "127.0.0.1", port: int = 30000):
    return guard_module.Settings(api_key=api_key, admin_api_key=ADMIN, host=host, port=port)


def ask(guard, path: str, *, method: str = "GET", key: str | None = None, kind: str = "http",
        headers: dict[str, str] | None = None) -> str:
    """'passed', or the status (HTTP) / close code (WebSocket) the guard answered with."""
    sent: list[dict] = []
    passed: list[bool] = []

    async def app(scope, receive, send) -> None:
        passed.append(True)

    async def receive() -> dict:
        return {"type": "websocket.connect"}

    async def send(message: dict) -> None:
        sent.append(message)

    given = {"host": "127.0.0.1:30000", **{name.lower(): value for name, value in (headers or {}).items()}}
    if key is not None:
        given["authorization"] = f"Bearer {key}"
    # a header given replaces the default Host; None leaves it out
    raw = [(name.encode(), value.encode()) for name, value in given.items() if value is not None]
    scope = {"type": kind, "path": path, "method": method, "headers": raw, "root_path": "", "query_string": b""}
    middleware = guard_module.KeylessGuard(app, fastapi_app=guard, settings=lambda: guard.settings)
    asyncio.run(middleware(scope, receive, send))
    if passed:
        return "passed"
    return str(sent[0].get("status", sent[0].get("code")))


@dataclass
class Engine:
    settings: object
    routes: list = field(default_factory=lambda: App().routes)


# --- nothing keyless grows -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/health", "/health_generate", "/metrics", "/metrics/"])
def test_the_engines_own_open_routes_pass_without_a_key(path: str) -> None:
    assert ask(Engine(settings()), path) == "passed"


@pytest.mark.parametrize("path", ["/health9f3a", "/healthz", "/health/x", "/ready", "/readyz", "/metricsXYZ",
                                  "/metrics/x", "/health_generate2"])
def test_an_unknown_path_under_the_open_prefixes_is_404_with_or_without_a_key(path: str) -> None:
    """SGLang passes every /health*, /ready*, /metrics* without a key and its metrics label an unmatched path by its
    raw text: only the app's own route paths under those prefixes go on."""
    for configured in (KEY, None):
        for key in (None, KEY, "wrong"):
            assert ask(Engine(settings(api_key=configured)), path, key=key) == "404", (configured, key)


def test_an_unknown_path_elsewhere_is_left_to_sglangs_401_without_the_key_and_404_with_it() -> None:
    engine = Engine(settings())
    assert ask(engine, "/no-such-route", key=None) == "passed"  # SGLang's own middleware answers 401
    assert ask(engine, "/no-such-route", key="wrong") == "passed"
    assert ask(engine, "/no-such-route", key=KEY) == "404"
    assert ask(engine, "/no-such-route", key=ADMIN) == "404"
    assert ask(Engine(settings(api_key=None)), "/no-such-route") == "404"  # no key set: nothing answers 401


def test_known_routes_pass_for_any_method_and_included_routers_count() -> None:
    engine = Engine(settings())
    assert ask(engine, "/v1/chat/completions", method="POST") == "passed"
    assert ask(engine, "/v1/chat/completions", method="OPTIONS") == "passed"  # CORS preflight: SGLang's own answer
    assert ask(engine, "/scale_elastic_ep", method="POST", key=KEY) == "passed"
    assert ask(engine, "/is_scaling_elastic_ep", key=KEY) == "passed"


def test_the_open_paths_are_read_again_when_the_app_gains_a_route() -> None:
    """SGLang mounts /metrics in its lifespan, after the middleware is built (srt/utils/common.py)."""
    engine = Engine(settings(), routes=[Route("/health")])
    sent: list[dict] = []

    async def app(scope, receive, send) -> None:
        sent.append({"passed": True})

    middleware = guard_module.KeylessGuard(app, fastapi_app=engine, settings=lambda: engine.settings)
    scope = {"type": "http", "path": "/metrics", "method": "GET", "headers": [(b"host", b"localhost:30000")]}
    assert middleware.refusal(scope) == guard_module.NOT_FOUND
    engine.routes.append(Route("/metrics", prefix=True))
    assert middleware.refusal(scope) is None


def test_the_root_path_is_not_part_of_the_route_path() -> None:
    assert guard_module.route_path({"path": "/api/health", "root_path": "/api"}) == "/health"
    assert guard_module.route_path({"path": "/health", "root_path": ""}) == "/health"
    assert guard_module.route_path({"path": "/apix/health", "root_path": "/api"}) == "/apix/health"


# --- Host and Origin where no API key is set -------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["127.0.0.1:30000", "127.0.0.1", "localhost:30000", "LOCALHOST", "[::1]:30000",
                                  "[::1]", "10.1.2.3:30000", "10.1.2.3"])
def test_without_a_key_loopback_names_and_the_listen_address_pass(host: str) -> None:
    engine = Engine(settings(api_key=None, host="10.1.2.3"))
    assert ask(engine, "/v1/models", headers={"Host": host}) == "passed"


@pytest.mark.parametrize("host", ["evil.example", "evil.example:30000", "127.0.0.1:8080", "localhost:1",
                                  "127.0.0.1.evil.example", "[::1]x", "localhost:port", ""])
def test_without_a_key_a_foreign_host_is_refused(host: str) -> None:
    assert ask(Engine(settings(api_key=None)), "/v1/models", headers={"Host": host}) == "403"
    assert ask(Engine(settings(api_key=None)), "/health", headers={"Host": host}) == "403"


@pytest.mark.parametrize("origin", ["http://evil.example", "http://evil.example:30000", "http://127.0.0.1:8080",
                                    "http://localhost", "null", "file://", "https://127.0.0.1:30000.evil.example",
                                    "http://127.0.0.1:notaport"])
def test_without_a_key_a_foreign_origin_is_refused(origin: str) -> None:
    engine = Engine(settings(api_key=None))
    assert ask(engine, "/v1/chat/completions", method="POST", headers={"Origin": origin}) == "403"
    assert ask(engine, "/v1/chat/completions", method="OPTIONS", headers={"Origin": origin}) == "403"


@pytest.mark.parametrize("origin", ["http://127.0.0.1:30000", "http://localhost:30000", "http://[::1]:30000",
                                    "https://localhost:30000"])
def test_without_a_key_the_engines_own_origin_passes(origin: str) -> None:
    assert ask(Engine(settings(api_key=None)), "/v1/models", headers={"Origin": origin}) == "passed"


def test_with_a_key_host_and_origin_are_left_to_the_key() -> None:
    engine = Engine(settings())
    assert ask(engine, "/v1/models", key=KEY, headers={"Host": "api.example", "Origin": "http://app.example"}) \
        == "passed"


def test_a_request_without_host_passes() -> None:
    """HTTP/1.0 without Host: no browser sends that."""
    engine = Engine(settings(api_key=None))
    assert ask(engine, "/v1/models", headers={"Host": None}) == "passed"


# --- WebSockets: SGLang's key middleware passes every scope that is not HTTP (srt/utils/auth.py) ---------------------
def test_a_websocket_without_the_key_is_closed_and_one_with_it_passes() -> None:
    engine = Engine(settings())
    assert ask(engine, "/v1/realtime", kind="websocket") == "1008"
    assert ask(engine, "/v1/realtime", kind="websocket", key="wrong") == "1008"
    assert ask(engine, "/v1/realtime", kind="websocket", key=KEY) == "passed"


def test_without_a_key_a_cross_origin_websocket_is_closed() -> None:
    engine = Engine(settings(api_key=None))
    assert ask(engine, "/v1/realtime", kind="websocket", headers={"Origin": "http://evil.example"}) == "1008"
    assert ask(engine, "/v1/realtime", kind="websocket") == "passed"


def test_the_lifespan_and_other_scopes_pass_untouched() -> None:
    passed: list[str] = []

    async def app(scope, receive, send) -> None:
        passed.append(scope["type"])

    middleware = guard_module.KeylessGuard(app, fastapi_app=Engine(settings()), settings=settings)
    asyncio.run(middleware({"type": "lifespan"}, None, None))
    assert passed == ["lifespan"]


def test_install_puts_the_guard_first_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starlette runs user_middleware[0] first (outermost); the guard is put there after SGLang's metrics middleware
    and again after its key middleware, and is there once."""

    class Middleware:  # starlette.middleware.Middleware's shape: the class and its arguments
        def __init__(self, cls: type, *args: object, **kwargs: object) -> None:
            self.cls, self.kwargs = cls, kwargs

    starlette, middleware = ModuleType("starlette"), ModuleType("starlette.middleware")
    middleware.Middleware = Middleware
    monkeypatch.setitem(sys.modules, "starlette", starlette)
    monkeypatch.setitem(sys.modules, "starlette.middleware", middleware)

    class FakeApp:
        def __init__(self) -> None:
            self.user_middleware = [Middleware(object), Middleware(dict)]

    app = FakeApp()
    guard_module._install_after(None, app)  # after add_http_request_metrics_middleware(app)
    app.user_middleware.insert(0, Middleware(list))  # SGLang's key middleware, added later, outermost
    guard_module._install_after(None, app, api_key=KEY, admin_api_key=ADMIN)  # after add_api_key_middleware
    assert [entry.cls for entry in app.user_middleware] == [guard_module.KeylessGuard, list, object, dict]
    assert app.user_middleware[0].kwargs == {"fastapi_app": app}


# --- dumps ----------------------------------------------------------------------------------------------------------
class ServerArgs:
    """Stands for SGLang's ServerArgs (a msgspec Struct, not a dataclass): resolved_dict() is what it publishes."""

    def resolved_dict(self) -> dict:
        return {"api_key": KEY, "admin_api_key": ADMIN, "port": 30000, "launch_command": f"serve --api-key {KEY}"}


def test_a_dump_gets_the_resolved_arguments_without_the_keys() -> None:
    """TokenizerManager._server_args_for_dump returns the record itself unless a watermark is set
    (srt/managers/tokenizer_manager.py): the hook makes it the redacted dictionary."""
    dumped = guard_module._dump_without_keys(ServerArgs(), object())
    assert dumped["api_key"] == dumped["admin_api_key"] == "<redacted>" and dumped["port"] == 30000
    assert KEY not in repr(dumped) and ADMIN not in repr(dumped)
    watermarked = guard_module._dump_without_keys({"api_key": KEY, "tp_size": 8}, object())
    assert watermarked == {"api_key": "<redacted>", "tp_size": 8}


def test_a_dump_whose_arguments_cannot_be_read_has_none_rather_than_the_keys() -> None:
    class Broken:
        def resolved_dict(self) -> dict:
            raise RuntimeError("no")

    assert guard_module._dump_without_keys(Broken(), object()) == {}


def test_register_hooks_every_target() -> None:
    registered: list[tuple[str, object]] = []
    hook_registry = ModuleType("sglang.srt.plugins.hook_registry")

    class HookType(Enum):
        AFTER = "after"

    class HookRegistry:
        @staticmethod
        def register(target: str, hook: object, kind: HookType) -> None:
            registered.append((target, kind))

    hook_registry.HookRegistry, hook_registry.HookType = HookRegistry, HookType
    sys.modules["sglang.srt.plugins.hook_registry"] = hook_registry
    try:
        guard_module.register()
    finally:
        del sys.modules["sglang.srt.plugins.hook_registry"]
    assert [target for target, _ in registered] == [guard_module.TARGET, guard_module.DUMP_TARGET,
                                                    guard_module.METRICS_TARGET, guard_module.AUTH_TARGET]


# --- uvicorn's request lines: the query string out -------------------------------------------------------------------
ACCESS = '%s - "%s %s HTTP/%s" %d'


def test_the_access_line_loses_its_query_string_and_keeps_its_shape() -> None:
    module = access_log
    record = logging.LogRecord("uvicorn.access", logging.INFO, "h11_impl.py", 1, ACCESS,
                               ("127.0.0.1:5000", "GET", f"/v1/models?api_key={KEY}&x=1", "1.1", 401), None)
    assert module.RedactQueryString().filter(record) is True
    assert record.getMessage() == '127.0.0.1:5000 - "GET /v1/models?<redacted> HTTP/1.1" 401'
    plain = logging.LogRecord("uvicorn.access", logging.INFO, "h11_impl.py", 1, ACCESS,
                              ("127.0.0.1:5000", "GET", "/health", "1.1", 200), None)
    module.RedactQueryString().filter(plain)
    assert plain.args == ("127.0.0.1:5000", "GET", "/health", "1.1", 200)


def test_the_websocket_lines_lose_their_query_string() -> None:
    module = access_log
    for message, args in (('%s - "WebSocket %s" [accepted]', ("1.2.3.4:5", f"/v1/realtime?key={KEY}")),
                          ('%s - "WebSocket %s" 403', ("1.2.3.4:5", f"/v1/realtime?key={KEY}")),
                          ('%s - "WebSocket %s" %d', ("1.2.3.4:5", f"/v1/realtime?key={KEY}", 401))):
        record = logging.LogRecord("uvicorn.error", logging.INFO, "ws.py", 1, message, args, None)
        module.RedactQueryString().filter(record)
        assert KEY not in record.getMessage() and "/v1/realtime?<redacted>" in record.getMessage()


def test_other_records_pass_unchanged() -> None:
    module = access_log
    record = logging.LogRecord("uvicorn.error", logging.INFO, "x.py", 1, "What is %s?", ("1 + 2",), None)
    module.RedactQueryString().filter(record)
    assert record.getMessage() == "What is 1 + 2?"


def test_the_vllm_middleware_puts_the_filter_on_uvicorns_loggers_once(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    (tmp_path / "api-key").write_text(KEY, encoding="utf-8")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    for name in access_log.UVICORN_LOGGERS:
        for existing in list(logging.getLogger(name).filters):
            logging.getLogger(name).removeFilter(existing)

    async def app(scope, receive, send) -> None:
        return None

    vllm_auth.RequireApiKey(app)
    vllm_auth.RequireApiKey(app)
    for name in access_log.UVICORN_LOGGERS:
        assert [type(f).__name__ for f in logging.getLogger(name).filters] == ["RedactQueryString"], name


def test_sglangs_logging_configuration_names_the_shared_filter() -> None:
    """logging.json's filter is the one both releases ship: dictConfig imports it by that name."""
    template = (REPO / "roles" / "sglang" / "templates" / "sglang-logging.json.j2").read_text()
    assert '"redact_query_strings": {"()": "bws_access_log.RedactQueryString"}' in template
