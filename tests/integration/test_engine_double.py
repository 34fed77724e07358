"""The engine test double's unkind behaviours, on real sockets: SGLang's generating /health, the faults,
and a listen backlog that holds the benchmark's concurrency (the protocol shapes are checked against the
engines' own models in tests/contract/test_double_protocol.py)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from verify_helpers import EngineDouble

pytestmark = pytest.mark.integration


def health(double: EngineDouble, timeout: float = 30) -> int:
    try:
        with urllib.request.urlopen(f"{double.base_url}/health", timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def wait_loaded(double: EngineDouble) -> None:
    """Until the double has left its start phase (its /health stops answering 503 at once)."""
    double.wait_listening()
    time.sleep(0.5)


def chat(double: EngineDouble, content: str, timeout: float = 10, **extra: object) -> dict:
    body = {"model": double.served_name, "messages": [{"role": "user", "content": content}], "max_tokens": 64,
            **extra}
    request = urllib.request.Request(f"{double.base_url}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@pytest.fixture
def doubles(tmp_path):
    started: list[EngineDouble] = []

    def start(name: str, flavour: str = "sglang", **kwargs) -> EngineDouble:
        double = EngineDouble(tmp_path, name, flavour, **kwargs)
        started.append(double)
        return double

    yield start
    for double in started:
        double.stop()


def test_sglang_health_generates_and_answers_503_logging_its_health_check_timeout_when_stuck(doubles):
    stuck = doubles("stuck", env={"ENGINE_DOUBLE_FAULT": "deadlock-on-generate", "SGLANG_HEALTH_CHECK_TIMEOUT": "2"})
    wait_loaded(stuck)
    assert health(stuck) == 503
    assert "Health check failed. Server couldn't get a response from detokenizer for last 2 seconds" in (
        stuck.log.read_text())


def test_sglang_health_generates_and_answers_200_when_healthy(doubles):
    healthy = doubles("healthy")
    wait_loaded(healthy)
    assert health(healthy) == 200


def test_vllm_health_does_not_generate_so_a_deadlock_passes_it_and_hangs_the_request(doubles):
    stuck = doubles("vstuck", "vllm", env={"ENGINE_DOUBLE_FAULT": "deadlock-on-generate"})
    wait_loaded(stuck)
    assert health(stuck) == 200
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        chat(stuck, "What is 1 + 2?", timeout=2)


def test_slow_first_request_is_overtaken_by_the_next_one(doubles, tmp_path):
    """Only the first generation is slow (ENGINE_DOUBLE_FIRST_REQUEST_S, its default 10 s): a second request sent
    while the first is held answers first, then the first answers too, both correctly."""
    requests = tmp_path / "requests.jsonl"
    slow = doubles("slow", "vllm", env={"ENGINE_DOUBLE_FAULT": "slow-first-request",
                                        "ENGINE_DOUBLE_REQUEST_LOG": str(requests)})
    wait_loaded(slow)
    answered: list[tuple[str, str]] = []

    def first() -> None:
        answered.append(("first", chat(slow, "What is 2 + 3?", timeout=120)["choices"][0]["message"]["content"]))

    client = threading.Thread(target=first)
    client.start()
    deadline = time.monotonic() + 60  # a safety limit: the double logs the first request as it takes it
    while not (requests.exists() and requests.read_text().count("\n") >= 1):
        assert client.is_alive() and time.monotonic() < deadline, answered
        time.sleep(0.05)
    time.sleep(0.2)  # the first request goes from its log line to its (slow) generation
    answered.append(("second", chat(slow, "What is 2 + 3?", timeout=120)["choices"][0]["message"]["content"]))
    client.join(timeout=120)
    assert not client.is_alive()
    assert answered == [("second", "5"), ("first", "5")], answered
    assert requests.read_text().count("\n") == 2


def test_garbage_output_never_reaches_eos(doubles):
    garbage = doubles("garbage", env={"ENGINE_DOUBLE_FAULT": "garbage-output"})
    wait_loaded(garbage)
    reply = chat(garbage, "What is 2 + 3?", chat_template_kwargs={"thinking": False})
    assert reply["choices"][0]["message"]["content"] == " ".join(["foss"] * 64)
    assert reply["choices"][0]["finish_reason"] == "length"


def test_concurrency_64_streams_get_no_connection_reset(doubles):
    """Both benchmark clients open `concurrency` connections at once; the default backlog of 5 reset some."""
    busy = doubles("busy", env={"ENGINE_DOUBLE_TOKENS_PER_S": "200"})
    wait_loaded(busy)
    body = json.dumps({"model": busy.served_name, "prompt": "hi", "max_tokens": 16, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()

    def stream(_: int) -> bytes:
        request = urllib.request.Request(f"{busy.base_url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.read()

    with ThreadPoolExecutor(max_workers=64) as pool:
        replies = list(pool.map(stream, range(64)))
    assert all(reply.endswith(b"data: [DONE]\n\n") for reply in replies)


def test_sglang_drains_on_sigterm_without_a_limit_until_abort_request_ends_what_is_in_flight(doubles):
    """SGLang 0.5.23 on SIGTERM: /health 503, requests in flight run on (no limit), exit when none is left;
    POST /abort_request {"abort_all": true} ends them with finish_reason "abort" (what the sglang role's drain relies
    on)."""
    import os
    import signal

    double = doubles("drain", env={"ENGINE_DOUBLE_TOKENS_PER_S": "5"})
    wait_loaded(double)
    lines: list[str] = []

    def stream() -> None:
        body = {"model": double.served_name, "messages": [{"role": "user", "content": "write"}], "max_tokens": 400,
                "stream": True}
        request = urllib.request.Request(f"{double.base_url}/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            lines.extend(line.decode() for line in response if line.strip())

    client = threading.Thread(target=stream)
    client.start()
    time.sleep(1.0)
    pid = double.process.pid  # unshare; the double is its only child
    engine_pid = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
    os.kill(engine_pid, signal.SIGTERM)
    time.sleep(1.5)
    assert health(double) == 503 and double.process.poll() is None, "draining: not ready, still running"
    abort = urllib.request.Request(f"{double.base_url}/abort_request", data=b'{"abort_all": true}', method="POST",
                                   headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(abort, timeout=60) as response:  # safety limits, not bounds
        assert response.status == 200
    client.join(timeout=60)
    assert not client.is_alive(), "the aborted stream did not end"
    assert double.process.wait(timeout=60) == 0
    finishes = [json.loads(line[6:])["choices"][0]["finish_reason"] for line in lines if line.startswith("data: {")]
    assert finishes[-1] == "abort" and lines[-1].strip() == "data: [DONE]"
    assert "Gracefully exiting... Remaining number of requests 1" in double.log.read_text()


def metric_names(double: EngineDouble) -> set[str]:
    with urllib.request.urlopen(f"{double.base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_sglang_speculative_series_appear_with_the_first_verify_step_and_vllms_at_start(doubles):
    """SGLang's speculative metrics are labelled series with no sample before their first observation; vLLM binds
    its spec-decode counters at start (0.0), as its real core showed (docs/tests.md, the real-core engine)."""
    sglang = doubles("spec-sglang", "sglang", speculative=True)
    vllm = doubles("spec-vllm", "vllm", speculative=True)
    for double in (sglang, vllm):
        wait_loaded(double)
    assert "sglang:spec_verify_calls_total" not in metric_names(sglang)
    assert "vllm:spec_decode_num_drafts_total" in metric_names(vllm)
    chat(sglang, "What is 1 + 2?", chat_template_kwargs={"thinking": False})
    assert {"sglang:spec_verify_calls_total", "sglang:spec_accept_length"} <= metric_names(sglang)
