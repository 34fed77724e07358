"""The engine test double's unkind behaviours, on real sockets: SGLang's generating /health, the faults,
and a listen backlog that holds the benchmark's concurrency (the protocol shapes are checked against the
engines' own models in tests/contract/test_double_protocol.py)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from verify_helpers import EngineDouble

pytestmark = pytest.mark.integration


def health(double: EngineDouble, timeout: float = 30) -> tuple[int, float]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"{double.base_url}/health", timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    return status, time.monotonic() - started


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


def test_sglang_health_generates_and_answers_503_after_its_health_check_timeout_when_stuck(doubles):
    stuck = doubles("stuck", env={"ENGINE_DOUBLE_FAULT": "deadlock-on-generate", "SGLANG_HEALTH_CHECK_TIMEOUT": "2"})
    wait_loaded(stuck)
    status, took = health(stuck)
    assert status == 503 and 2.0 <= took < 4.0
    assert "Health check failed. Server couldn't get a response from detokenizer for last 2 seconds" in (
        stuck.log.read_text())


def test_sglang_health_takes_its_one_second_look_when_healthy(doubles):
    healthy = doubles("healthy")
    wait_loaded(healthy)
    status, took = health(healthy)
    assert status == 200 and 1.0 <= took < 2.0  # `await asyncio.sleep(1)` before the first look


def test_vllm_health_does_not_generate_so_a_deadlock_passes_it_and_hangs_the_request(doubles):
    stuck = doubles("vstuck", "vllm", env={"ENGINE_DOUBLE_FAULT": "deadlock-on-generate"})
    wait_loaded(stuck)
    assert health(stuck)[0] == 200
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        chat(stuck, "What is 1 + 2?", timeout=2)


def test_slow_first_request_then_fast(doubles):
    slow = doubles("slow", "vllm", env={"ENGINE_DOUBLE_FAULT": "slow-first-request",
                                        "ENGINE_DOUBLE_FIRST_REQUEST_S": "1.5"})
    wait_loaded(slow)
    for expected_min, expected_max in ((1.5, 3.0), (0.0, 0.5)):
        started = time.monotonic()
        assert chat(slow, "What is 2 + 3?")["choices"][0]["message"]["content"] == "5"
        assert expected_min <= time.monotonic() - started < expected_max


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
    import threading

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
    assert health(double)[0] == 503 and double.process.poll() is None, "draining: not ready, still running"
    abort = urllib.request.Request(f"{double.base_url}/abort_request", data=b'{"abort_all": true}', method="POST",
                                   headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(abort, timeout=5) as response:
        assert response.status == 200
    client.join(timeout=5)
    assert double.process.wait(timeout=5) == 0
    finishes = [json.loads(line[6:])["choices"][0]["finish_reason"] for line in lines if line.startswith("data: {")]
    assert finishes[-1] == "abort" and lines[-1].strip() == "data: [DONE]"
    assert "Gracefully exiting... Remaining number of requests 1" in double.log.read_text()
