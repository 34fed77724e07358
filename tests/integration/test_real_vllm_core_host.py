"""The REAL-CORE TEST ENGINE, vLLM 0.32.0 CPU build (tests/real_core/real_core_venv.py; not the pinned vLLM 0.33.0
GPU engine), on a systemd test host: its own scheduler, KV cache, model loader, sampler and EAGLE-3 drafting and
verification, computing on the CPU with the REAL-CORE TEST MODEL (tests/real_core/make_model.py: random weights, its
own drafter). The production deploy_vllm.yml -> readiness -> the gate (greedy and sampled smoke, the chat-templated
benchmark with vLLM's own client, the acceptance from the engine's own /metrics counters) -> a deploy whose
readiness times out while the real core loads, which rolls back -> teardown, which finds and stops the real
processes. The GPUs the preflight and teardown read are the sandbox's simulated ones: the engine computes on the
CPU and holds none of them, and teardown says so (real_engine_host.py)."""

from __future__ import annotations

import json
import re

import pytest

from tests.integration.lifecycle_helpers import CONTAINER_MARKS, assert_rolled_back, deploy, main_pid, play_failure
from tests.integration.real_engine_host import booted_real_core_host
from tests.integration.real_engine_scenario import unit

pytestmark = CONTAINER_MARKS
ENGINE = "vllm"
NUM_STEPS = 3  # the profile's speculative.num_steps: vLLM's num_speculative_tokens
# The real core's own start-up lines, which neither the light double nor the scripted core writes (vLLM 0.32.0
# v1/engine/core.py, v1/worker/cpu_model_runner's loader, v1/spec_decode/eagle.py).
REAL_CORE_LINES = ("Starting vLLM server on", "Loading weights took", "Loading drafter model")


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    # CAP_SYS_PTRACE: engine_wait reads /proc/<pid>/io of the engine's processes (real_engine_host.py).
    yield from booted_real_core_host("bws-it-real-core", tmp_path_factory.mktemp("real-core"), caps=["SYS_PTRACE"])


@pytest.fixture(scope="module")
def runs() -> list:
    return []


def latest_report(host) -> dict:
    reports = sorted((host.workdir / "reports").rglob("report.json"), key=lambda path: path.stat().st_mtime)
    assert reports, "no verify report was written"
    return json.loads(reports[-1].read_text())


def test_deploy_serves_from_the_real_core_and_its_gate_reads_the_real_counters(host, runs):
    run = deploy(host, runs, "deploy_vllm.yml")
    assert run.status == "successful", play_failure(run.stdout, 12000)
    assert host.unit(unit(ENGINE))["ActiveState"] == "active" and host.health() == 200
    journal = host.sh(f"journalctl -u {unit(ENGINE)} --no-pager -o cat")
    for line in REAL_CORE_LINES:
        assert line in journal, (line, journal[-3000:])
    assert "ENGINE TEST DOUBLE" not in run.stdout and "scripted" not in journal.lower()
    flat = " ".join(run.stdout.split())
    # the smoke ran both requests through the real sampler; the random model's text is not read for the sum
    assert re.search(r"greedy \(temperature 0\): generated, the answer not checked \(verify_smoke_check: generates",
                     flat), flat[-3000:]
    assert "sampled (temperature 0.6, top_p 0.95): generated, the answer not checked" in flat, flat[-3000:]
    # verify.yml in full on what serves: vLLM's own benchmark client, the acceptance over its window, the gate
    verified = host.run_playbook("playbooks/verify.yml")
    runs.append(verified)
    assert verified.status == "successful", play_failure(verified.stdout, 12000)
    report = latest_report(host)
    assert report["engine_is_test_double"] is False and report["engine"] == ENGINE
    assert report["smoke"]["check"] == "generates" and int(report["smoke"]["completion_tokens"]) > 0
    level = report["levels"][0]
    counted = level["acceptance"]["detail"]
    # EAGLE-3 drafts num_steps tokens at every step: the engine's own counters, over the benchmark window
    assert counted["drafts"] > 0 and counted["draft_tokens"] == NUM_STEPS * counted["drafts"], level["acceptance"]
    assert 0 <= counted["accepted_tokens"] <= counted["draft_tokens"], counted
    # ... and the gate's acceptance is computed from exactly those numbers
    assert level["acceptance"]["problem"] is None, level["acceptance"]
    assert level["acceptance"]["rate"] == pytest.approx(counted["accepted_tokens"] / counted["draft_tokens"])
    assert level["acceptance"]["length"] == pytest.approx(1 + counted["accepted_tokens"] / counted["drafts"])
    assert report["gate"]["passed"] is True, report["gate"]


def test_a_readiness_timeout_while_the_real_core_loads_rolls_back(host, runs):
    """The real core takes tens of seconds to import, load and size its cache: a readiness bound shorter than that
    fails the deploy while it loads, naming the bound, and the release before it serves again."""
    before, pid = host.state()["current"], main_pid(host, unit(ENGINE))
    run = deploy(host, runs, "deploy_vllm.yml", vllm_ready_timeout_s=3, engine_service_ready_timeout_s=3,
                 vllm_extra_environment={"VLLM_CPU_KVCACHE_SPACE": "1", "BWS_REAL_CORE_RUN": "2"})
    assert run.status == "failed", run.stdout[-4000:]
    flat = " ".join(run.stdout.split())
    assert re.search(r"not ready after [0-9.]+ s \(timeout 3 s", flat), play_failure(run.stdout)
    assert_rolled_back(flat, before)
    assert host.state()["current"] == before and host.state()["status"] == "serving"
    assert host.health() == 200 and main_pid(host, unit(ENGINE)) not in (pid, "0")


def test_teardown_finds_and_stops_the_real_core_processes(host, runs):
    assert host.sh("pgrep -f '[v]llm.entrypoints.cli.main' || true").strip(), "no real-core process before teardown"
    run = host.run_playbook("playbooks/teardown.yml", {"teardown_confirm": "yes"})
    runs.append(run)
    assert run.status == "successful", run.stdout[-4000:]
    assert host.unit(unit(ENGINE))["ActiveState"] in ("inactive", "failed")
    assert host.sh("pgrep -f '[v]llm.entrypoints.cli.main' || true") == ""
    assert host.sh("pgrep -f 'VLLM::[E]ngineCore' || true") == ""
    assert host.health() is None
    flat = " ".join(run.stdout.split())
    assert "SIMULATED GPUs" in flat, flat[-3000:]
