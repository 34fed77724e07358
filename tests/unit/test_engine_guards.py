"""What the deploy adds around the engines so that the API key stays secret and guards every route:
SGLang's logging filter (roles/sglang/files/bws_sglang_logging.py), vLLM's middleware (roles/vllm/files/
bws_vllm_auth.py), verify's no-key route probe (plugins/filter/route_probes.py) and the benchmark
result allow-list (plugins/modules/bench_result.py). The real front ends run them in
tests/contract/test_real_front_ends.py."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import jinja2
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from module_utils_loader import load_library_module  # noqa: E402

KEY = "sk-'q\"uote\\d-Zq7"  # quotes and a backslash: repr and JSON escape them differently


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dictConfig's "()" imports the filter by name
    spec.loader.exec_module(module)
    return module


load(REPO / "roles" / "engine_service" / "files" / "bws_access_log.py")  # vLLM's middleware imports it by name
load(REPO / "roles" / "engine_service" / "files" / "bws_same_origin.py")  # and this one
sglang_logging = load(REPO / "roles" / "sglang" / "files" / "bws_sglang_logging.py")
vllm_auth = load(REPO / "roles" / "vllm" / "files" / "bws_vllm_auth.py")
route_probes = load(REPO / "plugins" / "filter" / "route_probes.py")
bench_result = load_library_module("bench_result")


# --- SGLang's start-up line ------------------------------------------------------------------------------------------
def server_args_line(**fields: object) -> str:
    """The line as SGLang 0.5.23 writes it: f"server_args={dict}" (srt/entrypoints/engine.py)."""
    return f"server_args={ {'model_path': '/srv/m', **fields, 'port': 30000} }"


@pytest.mark.parametrize("fields", [{"api_key": KEY}, {"api_key": KEY, "admin_api_key": KEY + "-admin"},
                                    {"api_key": "plain"}])
def test_the_filter_redacts_every_key_of_the_server_args_line(fields: dict) -> None:
    redacted = sglang_logging.redact(server_args_line(**fields))
    for value in fields.values():
        assert value not in redacted and repr(value)[1:-1] not in redacted
    assert redacted.count("'<redacted>'") == len(fields)
    assert "'model_path': '/srv/m'" in redacted and "'port': 30000" in redacted


def test_the_filter_leaves_a_line_without_a_key_alone_and_a_null_key_too() -> None:
    line = server_args_line(api_key=None)
    assert sglang_logging.redact(line) == line
    assert sglang_logging.redact("Load weight end. type=KimiK25") == "Load weight end. type=KimiK25"


@pytest.mark.parametrize("text", ["--api-key sk-flag-Form --port 1", "--api-key=secret-Value --port 1",
                                  "--admin-api-key 'a b' --port 1", '{"api_key": "json-form"}',
                                  "Engine(api_key='dataclass-form')"])
def test_the_filter_redacts_flags_json_and_keyword_forms(text: str) -> None:
    redacted = sglang_logging.redact(text)
    assert "<redacted>" in redacted
    for secret in ("sk-", "secret-Value", "a b", "json-form", "dataclass-form"):
        assert secret not in redacted


LOG_WITH_THE_RELEASE_CONFIGURATION = """
import logging, logging.config, json, sys
engine_logger = logging.getLogger("sglang.srt.entrypoints.engine")  # made at import, before configure_logger
logging.config.dictConfig(json.loads(open(sys.argv[1]).read()))
engine_logger.info(f"server_args={ {'api_key': sys.argv[2], 'tp_size': 8} }")
engine_logger.debug("below the level")
engine_logger.info("%s ready", "server")
"""


def test_the_release_logging_configuration_keeps_the_line_and_loses_the_key(tmp_path: Path) -> None:
    """The role's logging.json, loaded as SGLang loads it (dictConfig in configure_logger), in a process of its own
    with the filter on PYTHONPATH as the unit has it: records of loggers made before it still come out
    (disable_existing_loggers false), in SGLang's format, the key redacted."""
    template = (REPO / "roles" / "sglang" / "templates" / "sglang-logging.json.j2").read_text(encoding="utf-8")
    config = tmp_path / "logging.json"
    config.write_text(jinja2.Template(template).render(sglang_logging_level="info"), encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", LOG_WITH_THE_RELEASE_CONFIGURATION, str(config), KEY],
                          env={"PYTHONPATH": os.pathsep.join([str(REPO / "roles" / "sglang" / "files"),
                                                              str(REPO / "roles" / "engine_service" / "files")])},
                          capture_output=True,
                          text=True, check=True, timeout=60)
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr
    assert lines[0].endswith("server_args={'api_key': '<redacted>', 'tp_size': 8}") and lines[0].startswith("[20")
    assert lines[1].endswith("] server ready")


# --- vLLM's middleware -----------------------------------------------------------------------------------------------
def call(middleware, path: str, *, key: str | None = None, method: str = "POST", kind: str = "http") -> list[dict]:
    """The ASGI messages the middleware sends for one request (none when it passed the request on)."""
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    headers = [(b"authorization", f"Bearer {key}".encode("latin-1"))] if key is not None else []
    scope = {"type": kind, "path": path, "method": method, "headers": headers, "root_path": ""}
    asyncio.run(middleware(scope, None, send))
    return sent


def pass_credential(monkeypatch: pytest.MonkeyPatch, directory: Path, content: str | None) -> None:
    """As systemd's LoadCredential=api-key:... gives it: $CREDENTIALS_DIRECTORY/api-key (None: the unit passes none)."""
    directory.mkdir(exist_ok=True)
    if content is not None:
        (directory / "api-key").write_text(content, encoding="utf-8")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(directory))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    pass_credential(monkeypatch, tmp_path / "credentials", KEY)
    sent: list[dict] = []

    async def app(scope, receive, send) -> None:
        sent.append({"passed": True})

    return vllm_auth.RequireApiKey(app), sent


def run(guard, path: str, **kwargs) -> str:
    middleware, passed = guard
    before = len(passed)
    messages = call(middleware, path, **kwargs)
    if len(passed) > before:
        return "passed"
    return str(messages[0].get("status", messages[0].get("code")))


@pytest.mark.parametrize("path", ["/invocations", "/generative_scoring", "/tokenize", "/v1/chat/completions",
                                  "/pooling", "/docs", "/openapi.json", "/healthz"])
def test_vllm_guard_refuses_every_route_without_the_key(guard, path: str) -> None:
    assert run(guard, path) == "401"
    assert run(guard, path, key="wrong") == "401"
    assert run(guard, path, key=KEY) == "passed"


@pytest.mark.parametrize("path", ["/health", "/ping", "/metrics", "/metrics/", "/version"])
def test_vllm_guard_leaves_the_probes_and_the_scrape_open(guard, path: str) -> None:
    assert run(guard, path, method="GET") == "passed"


def test_vllm_guard_passes_cors_preflight_and_closes_an_unkeyed_websocket(guard) -> None:
    assert run(guard, "/v1/chat/completions", method="OPTIONS") == "passed"
    assert run(guard, "/v1/realtime", kind="websocket", method="GET") == "1008"
    assert run(guard, "/v1/realtime", kind="websocket", method="GET", key=KEY) == "passed"


@pytest.mark.parametrize("where", ["no credentials directory", "no api-key credential", "an empty credential"])
def test_vllm_guard_without_its_credential_refuses_every_guarded_route(monkeypatch, tmp_path: Path, where) -> None:
    """Fail closed; and the key in the environment, where vLLM itself would look, is not taken: it must not be there."""
    if where == "no credentials directory":
        monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    else:
        pass_credential(monkeypatch, tmp_path / "credentials", None if where == "no api-key credential" else "")
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    sent: list[dict] = []

    async def app(scope, receive, send) -> None:
        sent.append({"passed": True})

    middleware = vllm_auth.RequireApiKey(app)
    assert run((middleware, sent), "/invocations", key="") == "401"
    assert run((middleware, sent), "/invocations", key=KEY) == "401"
    assert run((middleware, sent), "/health", method="GET") == "passed"


def test_vllm_guard_reads_a_credential_written_with_a_trailing_newline(monkeypatch, tmp_path: Path) -> None:
    pass_credential(monkeypatch, tmp_path / "credentials", KEY + "\n")
    sent: list[dict] = []

    async def app(scope, receive, send) -> None:
        sent.append({"passed": True})

    middleware = vllm_auth.RequireApiKey(app)
    assert run((middleware, sent), "/invocations", key=KEY) == "passed"
    assert run((middleware, sent), "/invocations", key=KEY + "\n") == "401"


# --- vLLM without a key: its own Host and Origin only ----------------------------------------------------------------
class _Args:  # what vLLM parsed (app.state.args, vllm/entrypoints/launchers/app.py)
    def __init__(self, host: str | None, port: int | None) -> None:
        self.host, self.port = host, port


class _App:
    def __init__(self, host: str | None, port: int | None) -> None:
        self.state = type("State", (), {"args": _Args(host, port)})()


def same_origin_run(headers: dict[str, str], *, listen: tuple[str | None, int | None] = ("127.0.0.1", 8000),
                    kind: str = "http", app: object = None) -> str:
    passed: list[bool] = []
    sent: list[dict] = []

    async def inner(scope, receive, send) -> None:
        passed.append(True)

    async def receive() -> dict:
        return {"type": "websocket.connect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": kind, "path": "/v1/chat/completions", "method": "POST", "root_path": "",
             "headers": [(name.lower().encode(), value.encode()) for name, value in headers.items()],
             "app": _App(*listen) if app is None else app}
    asyncio.run(vllm_auth.SameOriginOnly(inner)(scope, receive, send))
    return "passed" if passed else str(sent[0].get("status", sent[0].get("code")))


@pytest.mark.parametrize("headers", [{"Host": "127.0.0.1:8000"}, {"Host": "localhost:8000"}, {"Host": "[::1]:8000"},
                                     {"Host": "localhost"}, {}, {"Host": "127.0.0.1:8000",
                                                                 "Origin": "http://localhost:8000"}])
def test_vllm_without_a_key_serves_its_own_host_and_origin(headers: dict[str, str]) -> None:
    assert same_origin_run(headers) == "passed"


@pytest.mark.parametrize("headers", [{"Host": "evil.example:8000"}, {"Host": "evil.example"},
                                     {"Host": "127.0.0.1:9999"}, {"Host": "127.0.0.1.nip.io:8000"},
                                     {"Host": "127.0.0.1:8000", "Origin": "http://evil.example"},
                                     {"Host": "127.0.0.1:8000", "Origin": "null"},
                                     {"Host": "127.0.0.1:8000", "Origin": "http://127.0.0.1:9999"},
                                     {"Host": "bad:port:x"}])
def test_vllm_without_a_key_refuses_a_foreign_host_or_origin(headers: dict[str, str]) -> None:
    assert same_origin_run(headers) == "403"
    assert same_origin_run(headers, kind="websocket") == "1008"


def test_vllm_without_a_key_takes_the_listen_address_vllm_parsed() -> None:
    assert same_origin_run({"Host": "10.0.0.7:8000"}, listen=("10.0.0.7", 8000)) == "passed"
    assert same_origin_run({"Host": "10.0.0.7:8000"}) == "403"
    assert same_origin_run({"Host": "127.0.0.1:8001"}, listen=("127.0.0.1", 8001)) == "passed"
    # vLLM's default host (None: every interface) leaves the loopback names only
    assert same_origin_run({"Host": "127.0.0.1:8000"}, listen=(None, 8000)) == "passed"


def test_vllm_without_a_key_refuses_when_the_listen_address_cannot_be_read() -> None:
    """Fail closed: an app that carries no parsed arguments (another vLLM's layout) serves nothing."""
    assert same_origin_run({"Host": "127.0.0.1:8000"}, app=object()) == "403"
    assert same_origin_run({"Host": "127.0.0.1:8000"}, listen=("127.0.0.1", None)) == "403"


# --- verify's no-key route probe -------------------------------------------------------------------------------------
def test_route_probes_ask_every_post_route_of_the_table_and_the_known_ones() -> None:
    table = {"status": 200, "json": {"paths": {
        "/v1/chat/completions": {"post": {}}, "/tokenize": {"post": {}}, "/v1/models": {"get": {}},
        "/ping": {"get": {}, "post": {}}, "/v1/models/{model}": {"post": {}}}}}
    probes = route_probes.unauthenticated_route_probes(table, ["/ping"], ["/invocations"], 30)
    assert [probe["path"] for probe in probes] == ["/invocations", "/tokenize", "/v1/chat/completions"]
    assert all(probe["auth"] is False and probe["method"] == "POST" and isinstance(probe["body"], str)
               for probe in probes)


def test_route_probes_fall_back_to_the_known_routes_without_a_table() -> None:
    for table in ({"status": 404, "json": {"detail": "Not Found"}}, {}, {"status": 200, "json": {"paths": []}}):
        probes = route_probes.unauthenticated_route_probes(table, [], ["/generate", "/v1/completions"], 5)
        assert [probe["path"] for probe in probes] == ["/generate", "/v1/completions"]


def test_routes_not_refused_names_each_route_and_what_it_answered() -> None:
    results = {"/a": {"status": 401}, "/b": {"status": 403}, "/invocations": {"status": 200}, "/c": {"status": -1}}
    assert route_probes.routes_not_refused(results) == ["/c answered HTTP -1", "/invocations answered HTTP 200"]


# --- the benchmark result allow-list ---------------------------------------------------------------------------------
def sglang_result_line(**extra: object) -> str:
    """A line as SGLang's client appends it: the numbers and the raw /server_info reply (benchmark/serving.py)."""
    return json.dumps({"backend": "sglang-oai", "completed": 8, "output_throughput": 812.5, "accept_length": None,
                       "server_info": {"api_key": KEY, "tp_size": 8}, "generated_texts": ["x"], "flag": True, **extra})


def test_bench_result_keeps_only_the_numbers_of_the_last_line(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    path.write_text(sglang_result_line(completed=4) + "\n" + sglang_result_line() + "\n\n", encoding="utf-8")
    document = bench_result.read_document(path, "jsonl")
    kept, dropped = bench_result.keep_plain(document, bench_result.DEFAULT_FIELDS)
    assert kept == {"completed": 8, "output_throughput": 812.5, "accept_length": None, "backend": "sglang-oai"}
    assert dropped == ["flag", "generated_texts", "server_info"]
    assert KEY not in json.dumps([kept, dropped]) and "sk-" not in json.dumps([kept, dropped])


def test_bench_result_drops_a_listed_field_that_is_not_a_plain_value(tmp_path: Path) -> None:
    path = tmp_path / "c1.json"
    path.write_text(json.dumps({"completed": True, "duration": {"s": 1}, "backend": "x" * 129,
                                "dataset_name": "two\nlines", "output_throughput": 3}), encoding="utf-8")
    kept, dropped = bench_result.keep_plain(bench_result.read_document(path, "json"), bench_result.DEFAULT_FIELDS)
    assert kept == {"output_throughput": 3} and dropped == ["backend", "completed", "dataset_name", "duration"]


@pytest.mark.parametrize(("content", "fmt", "message"), [
    (None, "json", "cannot read the benchmark result"),
    ("\n\n", "jsonl", "is empty: the client wrote no result line"),
    ("{not json", "json", "is not JSON"),
    ("[1, 2]", "json", "is a JSON list, not an object"),
])
def test_bench_result_says_what_is_wrong_with_the_file(tmp_path: Path, content: str | None, fmt: str,
                                                       message: str) -> None:
    path = tmp_path / "result"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(bench_result.ResultError, match=message):
        bench_result.read_document(path, fmt)
