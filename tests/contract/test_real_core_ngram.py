"""The REAL-CORE TEST ENGINE (vLLM 0.32.0 CPU build, tests/real_core/) drafting with n-gram speculation on a
repetitive prompt: the drafter that needs no weights, so that drafts are accepted even with the random-weights model
(its EAGLE-3 drafter, never trained, rarely is). verify's own reading of /metrics (plugins/module_utils/engine/
metrics.py, with the engine roster's counters and formulas) turns the engine's counters over the window into the
acceptance the gate judges: here above zero, computed from exactly those counters."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_collections.blackwell.serving.plugins.module_utils.engine import metrics
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import load_roster

pytestmark = pytest.mark.contract

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "real_core"))
import real_core_venv  # noqa: E402

K = 3  # num_speculative_tokens
READY_BOUND_S = 600  # a bound on a hung start, not a measurement
PROMPT = "the answer is 42 . the answer is 42 . the answer is 42 . the answer is 42 . the answer is"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""
    except OSError:
        return 0, ""


@pytest.fixture(scope="module")
def ngram_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        venv = real_core_venv.build()
    except SystemExit as failed:
        pytest.fail(f"the {real_core_venv.LABEL} venv cannot be built: {failed}")
    workdir = tmp_path_factory.mktemp("real-core-ngram")
    python = str(venv / "bin" / "python")
    subprocess.run([python, str(REPO / "tests" / "real_core" / "make_model.py"), str(workdir / "target"),
                    str(workdir / "drafter")], check=True, capture_output=True, timeout=300)
    port = free_port()
    speculative = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    log = workdir / "serve.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    with open(log, "wb") as out:
        # its own PID namespace: every process of the engine ends with it
        process = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--", python, "-m",
             "vllm.entrypoints.cli.main", "serve", str(workdir / "target"), "--served-model-name", "tiny-real-core",
             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
             "--max-model-len", "512", "--gpu-memory-utilization", "0.1",
             "--speculative-config", json.dumps(speculative)],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_BOUND_S
        while get(f"{base}/health")[0] != 200:
            assert process.poll() is None, f"vllm serve exited {process.returncode}: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"not ready within {READY_BOUND_S} s: {log.read_text()[-3000:]}"
            time.sleep(1)
        yield base
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # its session: unshare --kill-child takes the namespace with it
        process.wait(timeout=60)


def scrape(base: str) -> dict[str, float]:
    status, text = get(f"{base}/metrics")
    assert status == 200, status
    return metrics.select_metrics(metrics.parse_prometheus_text(text), ["vllm:"])


def test_ngram_drafts_are_accepted_and_verifys_acceptance_is_the_counters(ngram_engine: str) -> None:
    roster = load_roster()["vllm"]["metrics"]
    counters = roster["counters"]
    before = scrape(ngram_engine)
    body = {"model": "tiny-real-core", "prompt": PROMPT, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(f"{ngram_engine}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        reply = json.loads(response.read())
    assert reply["usage"]["completion_tokens"] == 48, reply
    after = scrape(ngram_engine)
    delta = metrics.counter_deltas(before, after, tuple(counters[name] for name in
                                                       ("drafts", "draft_tokens", "accepted_tokens")))
    drafts, drafted, accepted = (delta[counters[name]] for name in ("drafts", "draft_tokens", "accepted_tokens"))
    # n-gram proposes up to k tokens where the prompt lookup matches: fewer where it matches less
    assert drafts > 0 and drafts <= drafted <= K * drafts, delta
    assert 0 < accepted <= drafted, delta
    acceptance = metrics.window_acceptance("vllm", roster, before, after, num_steps=K)
    assert acceptance.problem is None, acceptance
    assert acceptance.rate == pytest.approx(accepted / drafted) and acceptance.rate > 0
    assert acceptance.length == pytest.approx(1 + accepted / drafts)
