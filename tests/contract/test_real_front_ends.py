"""The engines' REAL front ends over the scripted backend: what the deploy's gates meet on a real host.

SGLang 0.5.23's `launch_server` (HTTP server, TokenizerManager, detokenizer process, warm-up, reasoning parser,
metrics collectors) over a scripted scheduler, and vLLM 0.33.0's API server (middleware, routers, serving
classes, parsers, metrics) over a scripted engine, each from its test-engine venv (tests/scripted_engine/).
Only the tokens come from a script; every status code, field, log line and route below is the engine's own.

The front ends run with what the engine roles add around them (SGLang's logging filter, vLLM's middleware); the
tests that name an engine's own leak show it on the engine alone, as the reason the role adds its guard.
"""

from __future__ import annotations

import collections
import http.client
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sglang_helpers import REPO_ROOT, unavailable

sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT / "tests" / "scripted_engine"))
sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))
import engine_venv
import yaml
from front_end import RealFrontEnd
from module_utils_loader import load_library_module, load_module_util, load_plugin_util
from verify_helpers import EngineDouble

pytestmark = pytest.mark.contract

API_KEY = "sk-real-front-end-Zq7"
ADMIN_KEY = "admin-real-front-end-Kd3"  # SGLang's admin_api_key, as the sglang role always sets one
metrics = load_module_util("engine.metrics")
# The counter names the verify role reads, from the engine roster (meta/engines.yml): checked here against the real
# front ends' /metrics.
ROSTER_METRICS = {name: entry["metrics"] for name, entry in load_plugin_util("engine_roster").load_roster().items()}


def engine_python(engine: str) -> Path:
    try:
        return engine_venv.build(engine) / "bin" / "python"
    except SystemExit as failed:
        unavailable(f"the {engine} test-engine venv cannot be built: {failed}")


def _started(engine: str, workdir: Path, **kwargs: object) -> Iterator[RealFrontEnd]:
    front_end = RealFrontEnd(engine_python(engine), workdir, f"real-{engine}", engine, api_key=API_KEY,
                             speculative=True, **kwargs)
    try:
        took = front_end.wait_ready()
        print(f"{engine} front end ready in {took:.1f} s")
        yield front_end
    finally:
        front_end.stop()


@pytest.fixture(scope="module")
def sglang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealFrontEnd]:
    yield from _started("sglang", tmp_path_factory.mktemp("sglang"), admin_api_key=ADMIN_KEY)


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealFrontEnd]:
    yield from _started("vllm", tmp_path_factory.mktemp("vllm"))


@pytest.fixture(params=["sglang", "vllm"])
def engine(request: pytest.FixtureRequest) -> RealFrontEnd:
    return request.getfixturevalue(request.param)


REASONING_FIELD = {"sglang": "reasoning_content", "vllm": "reasoning"}


# --- what verify's smoke relies on --------------------------------------------------------------------------------
def test_thinking_off_answers_in_content(engine: RealFrontEnd) -> None:
    status, body = engine.chat("What is 123 + 456?", thinking=False)
    assert status == 200, body
    message = body["choices"][0]["message"]
    assert "579" in (message.get("content") or ""), message
    assert not message.get(REASONING_FIELD[engine.flavour]), message
    assert body["usage"]["completion_tokens"] > 0


def test_thinking_on_answers_after_reasoning_in_the_engines_field(engine: RealFrontEnd) -> None:
    """Kimi thinks unless told not to: the real kimi_k2 parser moves the thinking into the engine's own field."""
    status, body = engine.chat("What is 321 + 100?", thinking=True)
    assert status == 200, body
    message = body["choices"][0]["message"]
    assert "421" in (message.get(REASONING_FIELD[engine.flavour]) or ""), message
    assert "421" in (message.get("content") or ""), message
    assert "<think>" not in (message.get("content") or "") and "</think>" not in (message.get("content") or "")


def test_chat_without_the_key_is_refused(engine: RealFrontEnd) -> None:
    status, _ = engine.chat("What is 1 + 2?", thinking=False, key=None)
    assert status == 401
    status, _ = engine.chat("What is 1 + 2?", thinking=False, key="wrong-key")
    assert status == 401


def test_streamed_chat_ends_with_usage_then_done(engine: RealFrontEnd) -> None:
    import urllib.request

    request = urllib.request.Request(engine.base_url + "/v1/chat/completions", data=json.dumps({
        "model": engine.served_name, "messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "max_tokens": 64, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"thinking": False}}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        events = [line[len(b"data: "):] for line in response.read().splitlines() if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]", events[-3:]
    chunks = [json.loads(event) for event in events[:-1]]
    text = "".join((choice.get("delta") or {}).get("content") or "" for chunk in chunks for choice in chunk["choices"])
    assert "4" in text, text
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0, chunks[-1]


def test_metrics_have_the_counters_verify_reads(engine: RealFrontEnd) -> None:
    """verify's acceptance and throughput come from these names (plugins/module_utils/engine/metrics.py): the real
    ones."""
    def counters() -> dict[str, float]:
        status, body = engine.request("/metrics", key=API_KEY)
        assert status == 200
        return metrics.parse_prometheus_text(body.decode())

    before = counters()
    assert engine.chat("What is 5 + 6?", thinking=False)[0] == 200
    deadline = time.monotonic() + 15  # SGLang's scheduler pushes its metrics; vLLM's loggers log on an interval
    after = counters()
    generation = ROSTER_METRICS[engine.flavour]["counters"]["generation_tokens"]
    while after.get(generation, 0) <= before.get(generation, 0) and time.monotonic() < deadline:
        time.sleep(0.5)
        after = counters()
    assert after.get(generation, 0) > before.get(generation, 0), sorted(after)[:40]
    assert metrics.has_speculative_counters(ROSTER_METRICS[engine.flavour], after), sorted(after)


# --- the keys stay secret (issue 25) -------------------------------------------------------------------------------
# The front ends run with what the engine roles add around the engines (RealFrontEnd deploy_guards): SGLang's logging
# configuration with roles/sglang/files/bws_sglang_logging.py, vLLM's --middleware roles/vllm/files/bws_vllm_auth.py.
def test_sglang_start_log_keeps_server_args_without_the_api_key(sglang: RealFrontEnd) -> None:
    """SGLang logs server_args=... with api_key at INFO on start (srt/entrypoints/engine.py); the release's
    logging configuration keeps the line and redacts the key."""
    log = sglang.log_text()
    assert "server_args=" in log, "SGLang's start-up line is missing: the check below would be empty"
    assert "'api_key': '<redacted>'" in log, [line for line in log.splitlines() if "server_args=" in line]
    assert API_KEY not in log


def test_sglang_alone_publishes_its_keys_where_it_publishes_its_arguments(tmp_path: Path) -> None:
    """Upstream behaviour the deploy works around: every place SGLang 0.5.23 publishes its server arguments
    (/server_info, srt/utils/common.py build_server_info; the start-up line; dumps) passes them through
    redact_watermark_secrets (srt/sampling/watermarking/core.py), which keeps api_key and admin_api_key. With the
    release's plugin loaded by SGLang's own load_plugins() (its dist-info's entry point on PYTHONPATH, as in the
    unit), the same function blanks them. The day the first half fails, SGLang stopped publishing the keys."""
    release = tmp_path / "release"
    release.mkdir()
    for name in ("bws_sglang_guard.py", "bws_sglang_logging.py"):
        shutil.copy(REPO_ROOT / "roles" / "sglang" / "files" / name, release)
    for name in ("bws_access_log.py", "bws_same_origin.py"):  # both releases ship them
        shutil.copy(REPO_ROOT / "roles" / "engine_service" / "files" / name, release)
    shutil.copytree(REPO_ROOT / "roles" / "sglang" / "files" / "bws_sglang_guard-1.dist-info",
                    release / "bws_sglang_guard-1.dist-info")
    probe = ("import json, sys\n"
             "from sglang.srt.sampling.watermarking.core import redact_watermark_secrets as alone\n"
             "args = {'api_key': sys.argv[1], 'admin_api_key': sys.argv[2], 'port': 30000}\n"
             "before = alone(dict(args))\n"
             "from sglang.srt.plugins import load_plugins\n"
             "load_plugins()\n"
             "from sglang.srt.sampling.watermarking import core\n"
             "print(json.dumps({'alone': before, 'with the plugin': core.redact_watermark_secrets(dict(args))}))\n")
    result = subprocess.run([str(engine_python("sglang")), "-c", probe, API_KEY, ADMIN_KEY], capture_output=True,
                            text=True, timeout=300, check=False, cwd=tmp_path, env={"PYTHONPATH": str(release),
                                                                                     "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["alone"] == {"api_key": API_KEY, "admin_api_key": ADMIN_KEY, "port": 30000}
    assert seen["with the plugin"] == {"api_key": "<redacted>", "admin_api_key": "<redacted>", "port": 30000}


def test_sglang_server_info_keeps_the_keys_from_api_clients(sglang: RealFrontEnd) -> None:
    """With the release's plugin (roles/sglang/files/bws_sglang_guard.py) the real /server_info answers an API
    client without either key. (SGLang logs the plugins it ran before its logging is configured: at the default
    WARNING level of the root logger, so no line says so; the blanked fields do.)"""
    status, body = sglang.request("/server_info")
    text = body.decode()
    assert status == 200 and '"port"' in text, text[:500]
    assert API_KEY not in text and ADMIN_KEY not in text
    assert '"api_key":"<redacted>"' in text.replace(" ", "") and '"admin_api_key":"<redacted>"' in text.replace(" ", "")


def test_sglang_admin_routes_take_the_admin_key_and_refuse_the_api_key(sglang: RealFrontEnd) -> None:
    """SGLang 0.5.23 srt/utils/auth.py: with admin_api_key set, an ADMIN_OPTIONAL route (/flush_cache, and
    /abort_request, which the deploy's drain sends) accepts only it. So API clients are not admins."""
    assert sglang.request("/flush_cache", key=API_KEY)[0] == 401
    assert sglang.request("/flush_cache", key=None)[0] == 401
    assert sglang.request("/flush_cache", key=ADMIN_KEY)[0] == 200


# One body for every POST route: the fields the OpenAI, Anthropic, SageMaker and token-in generate requests need;
# the routes whose request model rejects it get their own (vLLM 0.33.0 protocol classes named).
PROBE_BODY = {"messages": [{"role": "user", "content": "What is 40 + 2?"}], "prompt": "What is 40 + 2?",
              "input": "What is 40 + 2?", "text": "What is 40 + 2?", "token_ids": [1, 2, 3],
              "sampling_params": {"max_tokens": 4, "max_new_tokens": 4}, "max_tokens": 4,
              "max_completion_tokens": 4}
PROBE_BODY_FOR = {
    "/v1/responses": {"input": "What is 40 + 2?", "max_output_tokens": 4},  # openai/responses/protocol.py
    "/v1/chat/completions/batch": {"messages": [[{"role": "user", "content": "What is 40 + 2?"}]],
                                   "max_tokens": 4},  # openai/chat_completion/protocol.py BatchChatCompletionRequest
    "/generative_scoring": {"query": "What is 40 + 2?", "items": ["3"],
                            "label_token_ids": [1, 2]},  # generate/generative_scoring/serving.py
}


def _engine_requests(front_end: RealFrontEnd) -> float:
    """The engine's own count of prompt tokens it was given: it moves when a request reached generation."""
    status, body = front_end.request("/metrics", key=API_KEY)
    assert status == 200
    return metrics.parse_prometheus_text(body.decode()).get(f"{front_end.flavour}:prompt_tokens_total", 0.0)


def _generating_routes_without_key(front_end: RealFrontEnd) -> list[str]:
    """Every POST route of the real app's route table that reaches generation when asked without the key: a
    route the auth middleware lets through is probed, and it generates if the engine's prompt-token counter moves."""
    routes = json.loads(front_end.routes_file.read_text())
    generating = []
    for route in routes:
        path = route["path"] or ""
        if "POST" not in route["methods"] or "{" in path:
            continue
        before = _engine_requests(front_end)
        body = {**PROBE_BODY_FOR.get(path, PROBE_BODY), "model": front_end.served_name}
        status, _ = front_end.request(path, body, key=None, timeout=30)
        if status in (401, 403):
            continue
        # An observation window, not a bound on the engine: SGLang's scheduler pushes its counters after the
        # request finishes. Every unguarded route waits it out, so it stays short.
        deadline = time.monotonic() + 3
        while _engine_requests(front_end) == before and time.monotonic() < deadline:
            time.sleep(0.2)
        if _engine_requests(front_end) > before:
            generating.append(path)
    return generating


def test_the_route_table_is_read_from_the_real_app(engine: RealFrontEnd) -> None:
    """The entry point writes the app's routes when it starts: the route scan below covers the real table."""
    routes = json.loads(engine.routes_file.read_text())
    paths = {route["path"] for route in routes}
    assert {"/v1/chat/completions", "/v1/completions", "/health"} <= paths, sorted(paths)
    if engine.flavour == "vllm":
        assert "/invocations" in paths, sorted(paths)
    else:  # FastAPI 0.165 keeps an included router as one entry; the table lists its routes (script.py route_rows)
        assert {"/scale_elastic_ep", "/is_scaling_elastic_ep", "/v1/loads"} <= paths, sorted(paths)
        assert all(route["path"] for route in routes), [route for route in routes if not route["path"]]


def test_the_route_probe_sees_a_generating_route(engine: RealFrontEnd) -> None:
    """The probe's signal is the engine's own counter: a request with the key moves it (a probe that could not see
    generation would pass every route)."""
    before = _engine_requests(engine)
    assert engine.chat("What is 1 + 1?", thinking=False)[0] == 200
    deadline = time.monotonic() + 30  # a safety limit for the counter to move, not a bound
    while _engine_requests(engine) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _engine_requests(engine) > before


def test_sglang_every_generating_route_needs_the_key(sglang: RealFrontEnd) -> None:
    assert _generating_routes_without_key(sglang) == []


def test_vllm_every_generating_route_needs_the_key(vllm: RealFrontEnd) -> None:
    """With the vllm role's middleware every route of the real app's table refuses a request without the key."""
    assert _generating_routes_without_key(vllm) == []


@pytest.fixture(scope="module")
def vllm_alone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealFrontEnd]:
    """vLLM with its key and nothing the role adds around it."""
    yield from _started("vllm", tmp_path_factory.mktemp("vllm-alone"), deploy_guards=False)


@pytest.mark.parametrize("path", ["/invocations", "/generative_scoring"])
def test_vllm_alone_generates_without_the_key_on_routes_outside_its_guarded_prefixes(vllm_alone: RealFrontEnd,
                                                                                      path: str) -> None:
    """Why the middleware exists: vLLM 0.33.0 checks the key only under /v1, /v2, /inference and /cohere
    (entrypoints/serve/middleware/authenticate.py). The day this fails, vLLM guards these routes itself."""
    before = _engine_requests(vllm_alone)
    status, body = vllm_alone.request(path, {**PROBE_BODY_FOR.get(path, PROBE_BODY), "model": vllm_alone.served_name},
                                      key=None, timeout=30)
    assert status == 200, body[:400]
    deadline = time.monotonic() + 30  # a safety limit for the counter to move, not a bound
    while _engine_requests(vllm_alone) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _engine_requests(vllm_alone) > before


# --- nothing keyless grows, no foreign origin, no key in a log or a dump (issue 46) ----------------------------------
# SGLang passes every path under /health, /ready and /metrics without a key (srt/utils/auth.py decide_request_auth) and
# its HTTP metrics label a path no route matches by its raw text (srt/observability/http_request_metrics.py): the
# release's plugin (roles/sglang/files/bws_sglang_guard.py) answers such a path 404 before those metrics see it.
KEYLESS_REQUESTS = int(os.environ.get("BWS_KEYLESS_REQUESTS", "20000"))


def _main_pid(front_end: RealFrontEnd) -> int:
    """The engine's main process (SGLang's HTTP server): the only child of `unshare --fork`."""
    return int(Path(f"/proc/{front_end.process.pid}/task/{front_end.process.pid}/children").read_text().split()[0])


def _rss_kib(pid: int) -> int:
    return int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("VmRSS:")).split()[1])


def _series(front_end: RealFrontEnd) -> set[str]:
    """The series /metrics holds: each sample line's name and labels."""
    status, body = front_end.request("/metrics", key=None)
    assert status == 200
    return {line.rsplit(" ", 1)[0] for line in body.decode().splitlines() if line and not line.startswith("#")}


def _raw(front_end: RealFrontEnd, method: str, path: str, headers: dict[str, str], body: bytes | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    """One request with exactly these headers (Host included: http.client's own is left out)."""
    connection = http.client.HTTPConnection("127.0.0.1", front_end.port, timeout=60)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in {"Host": f"127.0.0.1:{front_end.port}", **headers}.items():
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def test_sglang_keyless_paths_under_its_open_prefixes_are_refused_before_its_metrics(sglang: RealFrontEnd) -> None:
    """N keyless GET /health<random> (and /ready<random>, /metrics<random>): every one 404, no new series, the
    HTTP server's memory about the same (SGLang alone: 20,000 made 60,000 series and 89 MiB,
    bench/bench_keyless_series.py --alone)."""
    for path in ("/health", "/health_generate", "/ready", "/metrics"):
        assert sglang.request(path, key=None)[0] == 200, path  # the engine's own open routes still answer
    _series(sglang)  # the first scrape adds /metrics' own series
    pid = _main_pid(sglang)
    before, rss_before = _series(sglang), _rss_kib(pid)
    connection = http.client.HTTPConnection("127.0.0.1", sglang.port, timeout=30)
    statuses: collections.Counter[int] = collections.Counter()
    start = time.monotonic()
    for index in range(KEYLESS_REQUESTS):
        connection.request("GET", ("/health", "/ready", "/metrics")[index % 3] + secrets.token_hex(8))
        response = connection.getresponse()
        response.read()
        statuses[response.status] += 1
    took = time.monotonic() - start
    connection.close()
    # Outside the open prefixes: SGLang's own 401 without the key, the guard's 404 with it; neither labelled.
    unknown = "/no-such-route-" + secrets.token_hex(4)
    assert sglang.request(unknown, key=None)[0] == 401
    assert sglang.request(unknown, key=API_KEY)[0] == 404
    time.sleep(1)
    after, rss_after = _series(sglang), _rss_kib(pid)
    new = sorted(after - before)
    print(f"{KEYLESS_REQUESTS} keyless requests in {took:.1f} s ({KEYLESS_REQUESTS / took:.0f}/s): {dict(statuses)}; "
          f"/metrics series {len(before)} -> {len(after)} (new: {new[:5]}); SGLang's HTTP server RSS "
          f"{rss_before} KiB -> {rss_after} KiB ({rss_after - rss_before:+d} KiB)")
    assert statuses == {404: KEYLESS_REQUESTS}, statuses
    assert [series for series in new if "endpoint=" in series] == [], new[:20]
    assert len(new) <= 5, new  # a process metric that appears with time (the detokenizer's CPU seconds), no more
    assert rss_after - rss_before < 16 * 1024, (rss_before, rss_after)


def test_sglang_elastic_ep_routes_take_the_api_key_while_elastic_ep_is_off(sglang: RealFrontEnd) -> None:
    """Upstream behaviour the docs state: the elastic-EP routes are marked ADMIN_OPTIONAL (srt/entrypoints/
    elastic_ep.py) but included through a router, whose match gives SGLang's key middleware no endpoint to read the
    mark from (srt/utils/auth.py _get_auth_level_from_app_and_scope), so it treats them as ordinary routes: the API key
    opens them, the admin key does not. With elastic EP off they answer 404 "not enabled"."""
    assert sglang.request("/is_scaling_elastic_ep", key=None)[0] == 401
    status, body = sglang.request("/is_scaling_elastic_ep", key=API_KEY)
    assert status == 404 and b"elastic EP is not enabled" in body, body
    assert sglang.request("/is_scaling_elastic_ep", key=ADMIN_KEY)[0] == 401
    status, body = sglang.request("/scale_elastic_ep", {"new_ep_size": 2}, key=API_KEY)
    assert status == 404 and b"elastic EP is not enabled" in body, body


def _route_probes():
    spec = importlib.util.spec_from_file_location("route_probes", REPO_ROOT / "plugins" / "filter" / "route_probes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ADMIN_ROUTES = yaml.safe_load((REPO_ROOT / "meta" / "engines.yml").read_text())["engines"]["sglang"]["admin_routes"]


def test_the_sglang_roles_admin_route_list_is_the_real_apps(sglang: RealFrontEnd) -> None:
    """The roster's admin_routes of SGLang (meta/engines.yml: what verify asks without a key) is every POST route of the
    real app that SGLang's key middleware treats as admin and that validates a required request model first; the
    probe's body is refused there (400 or 422, with the admin key) before any handler runs, so asking them changes
    nothing even where a key check failed."""
    rows = json.loads(sglang.routes_file.read_text())
    marked = [row for row in rows if row["auth_level"] != "normal"]
    safe = sorted({row["path"] for row in marked if "POST" in row["methods"] and not row["included"]
                   and "{" not in row["path"] and row["body_required"]})
    assert safe == ADMIN_ROUTES
    assert sorted(row["path"] for row in marked if row["included"]) == ["/is_scaling_elastic_ep", "/scale_elastic_ep"]
    send, admin = load_library_module("engine_requests").send, {"Authorization": f"Bearer {ADMIN_KEY}"}
    for probe in _route_probes().admin_route_probes({}, ADMIN_ROUTES, 30):
        answer = send(sglang.base_url, admin, {"keep_json": [], **probe, "auth": True})
        assert answer["status"] in (400, 422), (probe["path"], answer["status"], answer["msg"])


def test_a_key_in_a_query_string_is_refused_and_never_logged(engine: RealFrontEnd) -> None:
    """Neither engine reads a key from the query string, and uvicorn's access log writes the request target as sent:
    the roles put a filter on uvicorn's loggers (SGLang: its logging.json; vLLM: the middleware) that replaces the
    query string. The captured stdout and stderr are what the journal gets."""
    assert engine.request(f"/v1/models?api_key={API_KEY}", key=None)[0] == 401
    status, _ = engine.request(f"/v1/chat/completions?key={API_KEY}&x=1", {
        "model": engine.served_name, "messages": [{"role": "user", "content": "What is 1 + 2?"}], "max_tokens": 4},
        key=None)
    assert status == 401
    _wait_for_log(engine, "/v1/chat/completions?<redacted>", timeout_s=30)
    log = engine.log_text()
    assert "/v1/models?<redacted>" in log
    assert API_KEY not in log


def test_vllm_alone_writes_a_query_string_key_to_its_access_log(vllm_alone: RealFrontEnd) -> None:
    """Why the filter exists: vLLM 0.33.0's uvicorn access log (uvicorn/protocols/http/h11_impl.py,
    get_path_with_query_string) writes the key a client put in the query string. The day this fails, it does not."""
    assert vllm_alone.request(f"/v1/models?api_key={API_KEY}", key=None)[0] == 401
    _wait_for_log(vllm_alone, f"/v1/models?api_key={API_KEY}", timeout_s=30)


def test_sglang_request_dumps_hold_no_key(sglang: RealFrontEnd, tmp_path: Path) -> None:
    """SGLang's request dumps (/configure_logging dump_requests_folder, an admin route) and crash dumps pickle
    TokenizerManager._server_args_for_dump(), the ServerArgs record with both keys unless a watermark is set
    (srt/managers/tokenizer_manager.py); the plugin makes it the redacted resolved dictionary."""
    folder = tmp_path / "dumps"
    configure = {"dump_requests_folder": str(folder), "dump_requests_threshold": 1}
    assert sglang.request("/configure_logging", configure, key=ADMIN_KEY)[0] == 200
    try:
        assert sglang.chat("What is 2 + 5?", thinking=False)[0] == 200
        deadline = time.monotonic() + 30
        while not list(folder.glob("*.pkl")) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)  # written by a background thread: let it finish
    finally:
        assert sglang.request("/configure_logging", {"dump_requests_folder": ""}, key=ADMIN_KEY)[0] == 200
    dumps = list(folder.glob("*.pkl"))
    assert dumps, "SGLang wrote no request dump"
    data = b"".join(path.read_bytes() for path in dumps)
    assert b"server_args" in data and b"<redacted>" in data
    assert API_KEY.encode() not in data and ADMIN_KEY.encode() not in data


@pytest.fixture(scope="module")
def sglang_keyless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealFrontEnd]:
    """SGLang without an API key, with an admin key: as the sglang role runs it on loopback without sglang_api_key."""
    front_end = RealFrontEnd(engine_python("sglang"), tmp_path_factory.mktemp("sglang-keyless"), "real-keyless",
                             "sglang", admin_api_key=ADMIN_KEY)
    try:
        print(f"keyless sglang front end ready in {front_end.wait_ready():.1f} s")
        yield front_end
    finally:
        front_end.stop()


def test_sglang_alone_reflects_any_origin_with_credentials(sglang: RealFrontEnd) -> None:
    """Upstream behaviour the guard answers where no key is set: SGLang's CORS middleware (srt/entrypoints/
    http_server.py: every origin, credentials, every method and header) lets a foreign page's preflight through."""
    status, headers, _ = _raw(sglang, "OPTIONS", "/v1/chat/completions", {
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert status == 200, headers
    assert headers.get("access-control-allow-origin") == "http://evil.example", headers
    assert headers.get("access-control-allow-credentials") == "true", headers


@pytest.fixture(scope="module")
def vllm_keyless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealFrontEnd]:
    """vLLM without an API key: as the vllm role runs it on loopback without vllm_api_key (SameOriginOnly)."""
    front_end = RealFrontEnd(engine_python("vllm"), tmp_path_factory.mktemp("vllm-keyless"), "real-vkeyless", "vllm")
    try:
        print(f"keyless vllm front end ready in {front_end.wait_ready():.1f} s")
        yield front_end
    finally:
        front_end.stop()


def test_vllm_alone_answers_a_foreign_host_and_origin(vllm_alone: RealFrontEnd) -> None:
    """Upstream behaviour the keyless middleware answers: vLLM 0.33.0 checks no Host and has no trusted-hosts option,
    so without a key a DNS-rebinding page (its own host name, the engine's port) drives every route."""
    key = {"Authorization": f"Bearer {API_KEY}"}  # vLLM alone, with its key: the Host is not looked at
    assert _raw(vllm_alone, "GET", "/v1/models", {**key, "Host": f"evil.example:{vllm_alone.port}"})[0] == 200
    assert _raw(vllm_alone, "GET", "/v1/models", {**key, "Origin": "http://evil.example"})[0] == 200


@pytest.mark.parametrize("front_end", ["sglang_keyless", "vllm_keyless"])
def test_without_a_key_a_foreign_origin_and_a_foreign_host_are_refused(request: pytest.FixtureRequest,
                                                                        front_end: str) -> None:
    """Both engines as the roles run them without a key: SGLang's KeylessGuard and vLLM's SameOriginOnly, one rule
    (roles/engine_service/files/bws_same_origin.py), before any route, the probes included."""
    keyless: RealFrontEnd = request.getfixturevalue(front_end)
    port = keyless.port
    chat = json.dumps({"model": keyless.served_name, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "What is 3 + 4?"}]}).encode()
    json_type = {"Content-Type": "application/json"}
    before = _engine_requests(keyless)
    # a cross-origin page: its request and its preflight
    assert _raw(keyless, "POST", "/v1/chat/completions", {**json_type, "Origin": "http://evil.example"},
                chat)[0] == 403
    assert _raw(keyless, "OPTIONS", "/v1/chat/completions", {
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})[0] == 403
    assert _raw(keyless, "GET", "/v1/models", {"Origin": "null"})[0] == 403
    # a DNS-rebinding page: its own host name, the engine's port
    assert _raw(keyless, "POST", "/v1/chat/completions", {**json_type, "Host": f"evil.example:{port}"},
                chat)[0] == 403
    assert _raw(keyless, "GET", "/v1/models", {"Host": "evil.example"})[0] == 403
    assert _raw(keyless, "POST", "/invocations", {**json_type, "Host": "evil.example"}, chat)[0] == 403
    assert _raw(keyless, "GET", "/health", {"Host": "evil.example"})[0] == 403
    assert _engine_requests(keyless) == before  # none of them reached generation
    # loopback, as the roles' clients and verify ask
    assert _raw(keyless, "GET", "/health", {})[0] == 200
    assert _raw(keyless, "GET", "/v1/models", {})[0] == 200
    assert _raw(keyless, "GET", "/v1/models", {"Host": f"localhost:{port}"})[0] == 200
    assert _raw(keyless, "GET", "/v1/models", {"Origin": f"http://127.0.0.1:{port}"})[0] == 200
    status, _, body = _raw(keyless, "POST", "/v1/chat/completions", json_type, chat)
    assert status == 200 and b'"choices"' in body, body[:300]


def test_sglang_without_a_key_its_admin_routes_refuse_verifys_probe(sglang_keyless: RealFrontEnd) -> None:
    """verify's no-key probe of the admin routes (roles/verify/tasks/smoke.yml), which runs with an API key set or
    not, on the real app: the route table read without a key, each admin route it lists asked without one."""
    engine_requests, route_probes = load_library_module("engine_requests"), _route_probes()
    table = engine_requests.send(sglang_keyless.base_url, {}, {
        "name": "routes", "path": "/openapi.json", "method": "GET", "auth": False, "timeout": 30,
        "keep_json": ["paths"]})
    probes = route_probes.admin_route_probes(table, ADMIN_ROUTES, 30)
    assert [probe["path"] for probe in probes] == ADMIN_ROUTES  # the real table lists every one
    answers = {probe["path"]: engine_requests.send(sglang_keyless.base_url, {}, {"keep_json": [], **probe})
               for probe in probes}
    assert route_probes.routes_not_refused(answers) == []


def test_sglang_without_a_key_server_info_holds_no_key(sglang_keyless: RealFrontEnd) -> None:
    """verify's credential check: the answer is searched for every secret (here the admin key, which verify's module
    reads from the unit on a host), whatever key the request sent (none)."""
    answer = load_library_module("engine_requests").send(sglang_keyless.base_url, {}, {
        "name": "server_info", "path": "/server_info", "method": "GET", "auth": False, "timeout": 30,
        "keep_json": ["version"]}, [ADMIN_KEY])
    assert answer["status"] == 200 and answer["holds_secrets"] is False, answer


# --- parity: the light double against the real front end ----------------------------------------------------------
# The double (tests/doubles/engine_double.py) keeps the fast lifecycle tests fast. For each behaviour it imitates,
# the same request goes to it and to the real front end of the same flavour, configured alike; what the gates read
# (status codes, fields, where the answer is, the stream's shape, metric names) must agree.
def _post(base_url: str, path: str, body: dict, key: str | None) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(base_url + path, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _chat_body(served: str, question: str, thinking: bool, **more: object) -> dict:
    # Room for either model's thinking (the double's is longer): where the answer lands is what is compared.
    return {"model": served, "messages": [{"role": "user", "content": question}], "max_tokens": 512,
            "temperature": 0, "chat_template_kwargs": {"thinking": thinking}, **more}


def _observe_chat(front, thinking: bool) -> dict:
    status, body = _post(front.base_url, "/v1/chat/completions",
                               _chat_body(front.served_name, "What is 123 + 456?", thinking), API_KEY)
    reply = json.loads(body)
    message = reply["choices"][0]["message"]
    where = [field for field in ("content", REASONING_FIELD[front.flavour]) if "579" in (message.get(field) or "")]
    return {"status": status, "answer in": where, "finish_reason": reply["choices"][0]["finish_reason"],
            "usage keys": sorted(reply["usage"]), "object": reply["object"]}


def _observe_no_key(front) -> dict:
    return {"status": _post(front.base_url, "/v1/chat/completions",
                            _chat_body(front.served_name, "What is 1 + 2?", False), None)[0]}


def _observe_stream(front) -> dict:
    status, body = _post(front.base_url, "/v1/chat/completions", _chat_body(
        front.served_name, "What is 2 + 2?", False, stream=True, stream_options={"include_usage": True}), API_KEY)
    events = [line[len(b"data: "):] for line in body.splitlines() if line.startswith(b"data: ")]
    last = json.loads(events[-2])
    return {"status": status, "ends with [DONE]": events[-1] == b"[DONE]", "usage chunk has no choices":
            last["choices"] == [], "usage chunk keys": sorted(last["usage"]), "object": last["object"]}


def _observe_ignore_eos_completion(front) -> dict:
    """The benchmark's request: a raw prompt, ignore_eos, a fixed output length."""
    status, body = _post(front.base_url, "/v1/completions", {
        "model": front.served_name, "prompt": "Hello", "max_tokens": 16, "temperature": 0, "ignore_eos": True},
        API_KEY)
    reply = json.loads(body)
    return {"status": status, "completion_tokens": reply["usage"]["completion_tokens"],
            "finish_reason": reply["choices"][0]["finish_reason"], "object": reply["object"]}


def _observe_models(front) -> dict:
    import urllib.request

    request = urllib.request.Request(front.base_url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        reply = json.loads(response.read())
    return {"object": reply["object"], "served name listed": front.served_name in [m["id"] for m in reply["data"]]}


def _observe_metric_names(front) -> set[str]:
    import urllib.request

    with urllib.request.urlopen(front.base_url + "/metrics", timeout=30) as response:
        return set(metrics.parse_prometheus_text(response.read().decode()))


PARITY = {
    "chat, thinking off: the answer in content": lambda front: _observe_chat(front, thinking=False),
    "chat, thinking on: the answer in the reasoning field and content":
        lambda front: _observe_chat(front, thinking=True),
    "chat without the key: refused": _observe_no_key,
    "streamed chat: a usage chunk without choices, then [DONE]": _observe_stream,
    "ignore-eos completion: exactly max_tokens, finish_reason length": _observe_ignore_eos_completion,
    "/v1/models lists the served name": _observe_models,
}


@pytest.fixture(scope="module")
def doubles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    workdir = tmp_path_factory.mktemp("doubles")
    started = {flavour: EngineDouble(workdir, f"double-{flavour}", flavour, speculative=True, api_key=API_KEY,
                                     options={"reasoning-parser": "kimi_k2"}) for flavour in ("sglang", "vllm")}
    try:
        for double in started.values():
            double.wait_listening()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:  # listening is not ready: /health answers 503 while it loads
                try:
                    if _post(double.base_url, "/health", {}, None)[0] in (200, 405):
                        break
                except OSError:
                    pass
                time.sleep(0.1)
        yield started
    finally:
        for double in started.values():
            double.stop()


@pytest.mark.parametrize("behaviour", sorted(PARITY))
def test_the_double_behaves_as_the_real_front_end(engine: RealFrontEnd, doubles: dict, behaviour: str) -> None:
    observe = PARITY[behaviour]
    real, double = observe(engine), observe(doubles[engine.flavour])
    assert double == real, f"{engine.flavour} double diverges from the real front end on '{behaviour}'"


def test_every_metric_the_gates_read_from_the_double_is_a_real_metric(engine: RealFrontEnd, doubles: dict) -> None:
    counters = ROSTER_METRICS[engine.flavour]
    read = {counters["counters"]["generation_tokens"], *metrics.speculative_counter_names(counters)}
    double_names = {name.split("{")[0] for name in _observe_metric_names(doubles[engine.flavour])}
    real_names = {name.split("{")[0] for name in _observe_metric_names(engine)}
    assert read <= double_names, sorted(read - double_names)
    assert read <= real_names, sorted(read - real_names)


# --- faults driven by the scripted backend: the reactions above it are the engines' own ----------------------------
HEALTH_CHECK_TIMEOUT_S = 3  # SGLANG_HEALTH_CHECK_TIMEOUT (20 s by default) for both the engine and the double
DEADLOCK = {"SCRIPTED_ENGINE_FAULT": "deadlock-on-generate", "SGLANG_HEALTH_CHECK_TIMEOUT": str(HEALTH_CHECK_TIMEOUT_S)}


def _wait_for_log(front_end: RealFrontEnd, text: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in front_end.log_text():
        if front_end.process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} in the {front_end.flavour} log:\n{front_end.log_tail()}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def sglang_deadlocked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealFrontEnd]:
    """SGLang whose scheduler deadlocks on every generation after its warm-up's: it reports ready, then hangs."""
    front_end = RealFrontEnd(engine_python("sglang"), tmp_path_factory.mktemp("sglang-deadlock"), "deadlocked",
                             "sglang", api_key=API_KEY, env={**DEADLOCK, "SCRIPTED_ENGINE_DEADLOCK_AFTER": "1"})
    try:
        _wait_for_log(front_end, "The server is fired up and ready to roll!")  # the warm-up request passed
        yield front_end
    finally:
        front_end.stop()


# What SGLang logs when its /health generation got no output within its health-check timeout (srt/entrypoints/
# http_server.py health_generate, HEALTH_CHECK_TIMEOUT an int); the double writes the same words.
HEALTH_CHECK_FAILED = ("Health check failed. Server couldn't get a response from detokenizer for last "
                       f"{HEALTH_CHECK_TIMEOUT_S} seconds")


def _health_after_a_stuck_generation(base_url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(base_url + "/health", timeout=HEALTH_CHECK_TIMEOUT_S + 30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _logged_once_more(read_log, text: str, before: int, timeout_s: float = 30) -> bool:
    """Whether the log holds `text` more than `before` times (it is written as the 503 is answered; timeout_s is a
    safety limit for the write to reach the file, not a bound)."""
    deadline = time.monotonic() + timeout_s
    while read_log().count(text) <= before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_sglang_deadlocked_after_ready_answers_health_503_logging_its_health_check_timeout(sglang_deadlocked) -> None:
    logged = sglang_deadlocked.log_text().count(HEALTH_CHECK_FAILED)
    assert _health_after_a_stuck_generation(sglang_deadlocked.base_url) == 503
    assert _logged_once_more(sglang_deadlocked.log_text, HEALTH_CHECK_FAILED, logged), sglang_deadlocked.log_tail()


def test_sglang_deadlocked_blocks_server_info(sglang_deadlocked) -> None:
    """/server_info waits on the scheduler (srt/entrypoints/http_server.py get_server_info): a request before the
    smoke that asks for it waits its whole timeout on a stuck engine (issue 27)."""
    import socket

    _health_after_a_stuck_generation(sglang_deadlocked.base_url)  # the scheduler is stuck in a generation now
    with pytest.raises((TimeoutError, socket.timeout)):
        sglang_deadlocked.request("/server_info", timeout=5)


def test_the_deadlocked_double_reacts_as_the_deadlocked_sglang(sglang_deadlocked, tmp_path) -> None:
    """Parity: 503 from /health with the health-check timeout's error logged, and /server_info blocking, in the double
    too."""
    import socket

    double = EngineDouble(tmp_path, "double-deadlock", "sglang", api_key=API_KEY, env={
        "ENGINE_DOUBLE_FAULT": "deadlock-on-generate", "SGLANG_HEALTH_CHECK_TIMEOUT": str(HEALTH_CHECK_TIMEOUT_S)})
    try:
        double.wait_listening()
        time.sleep(0.5)  # ENGINE_DOUBLE_START_S: loaded
        real_status = _health_after_a_stuck_generation(sglang_deadlocked.base_url)

        def double_log() -> str:
            return double.log.read_text(errors="replace") if double.log.exists() else ""

        logged = double_log().count(HEALTH_CHECK_FAILED)
        double_status = _health_after_a_stuck_generation(double.base_url)
        assert double_status == real_status == 503
        assert _logged_once_more(double_log, HEALTH_CHECK_FAILED, logged), double_log()[-3000:]
        with pytest.raises((TimeoutError, socket.timeout)):
            double.get_json("/server_info", API_KEY)
    finally:
        double.stop()


def test_vllm_engine_core_crashing_at_start_ends_the_server_with_its_own_error(tmp_path) -> None:
    front_end = RealFrontEnd(engine_python("vllm"), tmp_path, "crashing", "vllm",
                             env={"SCRIPTED_ENGINE_FAULT": "crash-at-start"})
    try:
        assert front_end.process.wait(timeout=240) != 0
        # vllm/v1/engine/utils.py wait_for_engine_startup, raised by the real front end
        assert "Engine core initialization failed" in front_end.log_text(), front_end.log_tail()
    finally:
        front_end.stop()


def test_vllm_worker_hang_at_start_logs_the_shared_memory_warning_and_never_serves(tmp_path) -> None:
    """What vLLM logs while a worker hangs at start (imitated below the scripted layer, quoting
    distributed/device_communicators/shm_broadcast.py): readiness must not take it for progress (issue 27)."""
    front_end = RealFrontEnd(engine_python("vllm"), tmp_path, "hanging", "vllm",
                             env={"SCRIPTED_ENGINE_FAULT": "startup-hang", "SCRIPTED_ENGINE_WARN_S": "1"})
    try:
        _wait_for_log(front_end, "No available shared memory broadcast block found in 1 seconds")
        with pytest.raises(OSError):
            front_end.request("/health", key=None, timeout=5)  # not listening: the API server waits on the core
        # Readiness's stall detection does not take the warning, as the engine writes it, for progress.
        ignore = load_library_module("engine_wait").DEFAULT_PROGRESS_IGNORE
        warnings = [line for line in front_end.log_text().splitlines() if "shared memory broadcast" in line]
        assert warnings and all(any(re.search(p, line) for p in ignore) for line in warnings), warnings
    finally:
        front_end.stop()


# --- SGLang's drain on SIGTERM and its abort: what the sglang role's drain (tasks/drain.yml) relies on ---------
def _observe_drain_and_abort(base_url: str, process, served_name: str, admin_key: str) -> dict:
    """A long stream in flight, SIGTERM to the main process, /health, then POST /abort_request abort_all with the
    admin key (roles/sglang/files/bws_sglang_abort.py sends the config's admin-api-key)."""
    import threading
    import urllib.request

    from front_end import signal_main_process

    lines: list[bytes] = []
    failures: list[BaseException] = []
    first_chunk = threading.Event()

    def stream() -> None:
        # About 7 s of output at the scripted speed (within the 8192-token context): time to signal and abort.
        request = urllib.request.Request(base_url + "/v1/completions", data=json.dumps({
            "model": served_name, "prompt": "Hello", "max_tokens": 6000, "ignore_eos": True, "stream": True,
            "temperature": 0}).encode(), headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {API_KEY}"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                for line in response:
                    lines.append(line)
                    first_chunk.set()
        except BaseException as failed:  # reported by the assertion below
            failures.append(failed)
            first_chunk.set()

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    assert first_chunk.wait(60) and not failures, f"the stream never started: {failures}"
    signal_main_process(process, signal.SIGTERM)
    time.sleep(1)
    health = _get_status(base_url + "/health")
    still_streaming = reader.is_alive()
    abort = _post(base_url, "/abort_request", {"abort_all": True}, admin_key)[0]
    reader.join(30)
    chunks = [json.loads(line[len(b"data: "):]) for line in lines
              if line.startswith(b"data: ") and line.strip() != b"data: [DONE]"]
    finish = [choice.get("finish_reason") for chunk in chunks for choice in chunk.get("choices", [])
              if choice.get("finish_reason")]
    try:
        exit_code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:  # a process that does not end is the observation
        exit_code = None
    return {"in flight after SIGTERM": still_streaming, "health while draining": health, "abort": abort,
            "stream ended by": finish[-1:] if finish else [], "exited after the abort": exit_code is not None}


def _get_status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_sglang_drains_on_sigterm_and_its_abort_ends_the_drain_as_the_double_does(sglang, tmp_path) -> None:
    """Last in this file: it ends the module's SGLang. SGLang 0.5.23 keeps serving what is in flight after SIGTERM
    (tokenizer_manager.py sigterm_watchdog), answers /health 503 while draining, and POST /abort_request ends the
    requests with finish_reason abort, after which the drain ends and the process exits."""
    real = _observe_drain_and_abort(sglang.base_url, sglang.process, sglang.served_name, ADMIN_KEY)
    double = EngineDouble(tmp_path, "double-drain", "sglang", api_key=API_KEY, options={"admin-api-key": ADMIN_KEY},
                          env={"ENGINE_DOUBLE_TOKENS_PER_S": "400"})
    try:
        double.wait_listening()
        time.sleep(0.5)
        mirrored = _observe_drain_and_abort(double.base_url, double.process, double.served_name, ADMIN_KEY)
    finally:
        double.stop()
    assert real == {"in flight after SIGTERM": True, "health while draining": 503, "abort": 200,
                    "stream ended by": ["abort"], "exited after the abort": True}, real
    assert mirrored == real


@pytest.fixture(scope="module")
def sglang_two_running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealFrontEnd]:
    yield from _started("sglang", tmp_path_factory.mktemp("sglang-two"), options={"max-running-requests": 2})


def test_sglang_reports_the_configured_max_running_requests(sglang_two_running: RealFrontEnd) -> None:
    """/server_info's internal state is the scheduler's max_running_requests as configured
    (srt/managers/scheduler_components/internal_state.py effective_max_running_requests_per_dp), not a constant; and
    four requests at once all finish while two run at a time (the rest wait in the queue, srt/managers/
    schedule_policy.py PrefillAdder)."""
    status, body = sglang_two_running.request("/server_info")
    assert status == 200, body[:500]
    states = json.loads(body)["internal_states"]
    assert [state["effective_max_running_requests_per_dp"] for state in states] == [2], states
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda n: _post(sglang_two_running.base_url, "/v1/chat/completions", _chat_body(
            sglang_two_running.served_name, f"What is {n} + 1? Reply with the number only.", False),
            API_KEY), range(4)))
    assert [status for status, _ in replies] == [200] * 4, replies
