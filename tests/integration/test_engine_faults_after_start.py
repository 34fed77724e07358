"""Faults once the new release has started, on one booted systemd host of their own: a generation deadlock
and a hang that roll back at the stall and readiness timeouts, a crash at start, and a deploy whose controller
is killed mid-switch. (test_engine_faults.py has the refusals and failed gates, beside this file.) The engine
is the ENGINE TEST DOUBLE. The tests share the host and run in file order; each states the host it leaves behind.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.integration.engine_host import REPO, EngineHost, podman
from tests.integration.lifecycle_helpers import (
    CONTAINER_MARKS,
    assert_api_key_nowhere,
    assert_boots,
    assert_rolled_back,
    booted_engine_host,
    deploy,
    interrupted_deploy,
    main_pid,
)

pytestmark = CONTAINER_MARKS


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    yield from booted_engine_host("bws-it-stalls", tmp_path_factory.mktemp("stalls-host"))


@pytest.fixture(scope="module")
def runs() -> list:
    return []


def test_sglang_serves(host, runs):
    """The host every case here starts from: SGLang serves (the release each failed deploy rolls back to)."""
    run = deploy(host, runs, "deploy_sglang.yml")
    assert run.status == "successful", run.stdout[-3000:]
    assert host.state()["current"].startswith("sglang-") and host.health() == 200


def started_at(host: EngineHost, since: float, unit: str = "sglang.service") -> list[float]:
    """Times (host clock, epoch seconds) at which systemd started `unit` since `since`."""
    lines = host.sh(f"journalctl -u {unit} -o short-unix --no-pager --since @{since:.0f} | grep -E 'Started '")
    return [float(line.split()[0]) for line in lines.splitlines()]


def test_deadlock_on_generate_with_default_timeouts_is_declared_a_stall_and_rolls_back(host, runs):
    """The reference host's failure: the engine loads, then no generation ever finishes. SGLang's /health
    generates, so it answers 503 after the health-check timeout (20 s, the double's default as SGLang's),
    exactly as while loading. No timeout is set here: the sandbox inventory's stall timeout applies; the stall
    is declared with it, and the previous release is started again after the deadlocked one and serves."""
    sandbox = yaml.safe_load((REPO / "inventory/sandbox/group_vars/all/sandbox.yml").read_text())
    before = host.state()["current"]
    since = float(host.sh("date +%s")) - 1
    run = deploy(host, runs, "deploy_sglang.yml",
                 sglang_extra_environment={"ENGINE_DOUBLE_FAULT": "deadlock-on-generate"})
    assert run.status == "failed"
    assert host.health() == 200 and host.state()["current"] == before
    flat = " ".join(run.stdout.split())
    assert_rolled_back(flat, before)
    stall = re.search(r"stalled: sglang\.service wrote no journal line and was not ready for (\d+\.\d) s "
                      r"\(stall timeout (\d+) s; last answer: ", flat)
    assert stall, flat[-3000:]
    assert int(stall.group(2)) == sandbox["sglang_stall_timeout_s"]
    assert "Health check failed" in flat  # the journal tail: /health generated and answered 503 after 20 s
    failed_start, rollback_start = started_at(host, since)[-2:]
    assert rollback_start > failed_start  # the rollback's start (journal order) follows the deadlocked one's
    print(f"deadlock-on-generate: stall declared after {stall.group(1)} s; the previous release started again "
          f"{rollback_start - failed_start:.1f} s after the failed start")


def test_hang_ends_at_the_readiness_timeout_with_the_journal_and_rolls_back(host, runs):
    before = host.state()["current"]
    run = deploy(
        host,
        runs,
        "deploy_sglang.yml",
        sglang_ready_timeout_s=4,
        sglang_extra_environment={"ENGINE_DOUBLE_FAULT": "hang"},
    )
    assert run.status == "failed"
    flat = run.stdout.replace("\n", " ")
    assert re.search(r"not ready after \d+\.\d s \(timeout 4 s; last answer: ", flat), flat[-3000:]
    assert "fault=hang" in flat  # the journal tail of the hung release
    assert host.state()["current"] == before and host.health() == 200


def test_failed_vllm_deploy_rolls_back_to_the_sglang_release(host, runs):
    before = host.state()["current"]
    run = deploy(host, runs, "deploy_vllm.yml", vllm_extra_environment={"ENGINE_DOUBLE_FAULT": "crash-at-start"})
    assert run.status == "failed"
    # The failed release ran on trial only: nothing of it is left where the host boots from, SGLang's unit is.
    assert host.sh("ls /run/systemd/system.control/ 2>/dev/null || true") == ""
    assert_boots(host, "sglang.service", before)
    assert host.unit("sglang.service")["ActiveState"] == "active" and host.health() == 200
    assert host.state()["current"] == before


def test_an_interrupted_deploy_claims_nothing_serves_and_its_rerun_finishes_it_and_prunes(host, runs):
    before = host.state()
    releases_before = host.sh("ls /var/lib/llm-serving/releases").split()
    old_pid = main_pid(host)
    # The double takes 25 s to answer /health: the controller is killed while it waits.
    slow = {"sglang_extra_environment": {"ENGINE_DOUBLE_START_S": "25"}}

    def started() -> bool:
        state = json.loads(host.sh("cat /var/lib/llm-serving/state.json"))
        return state.get("status") == "switching" and main_pid(host) not in ("0", old_pid)

    interrupted_deploy(host, "playbooks/deploy_sglang.yml", slow, started)
    state = host.state()
    assert state["status"] == "switching", state
    assert state["current"] != before["current"] and state["previous"] == before["current"]
    started_pid = main_pid(host)

    run = deploy(host, runs, "deploy_sglang.yml", engine_service_keep_releases=1, **slow)
    assert run.status == "successful", run.stdout[-3000:]
    assert main_pid(host) == started_pid, "the re-run finished the deploy without restarting the engine"
    assert host.state() == {"current": state["current"], "previous": before["current"], "status": "serving"}
    assert host.health() == 200
    # keep_releases=1: current, previous and the newest other release stay; older ones are removed.
    releases = host.sh("ls /var/lib/llm-serving/releases").split()
    assert len(releases_before) + 1 > 3 and len(releases) == 3, (releases_before, releases)
    assert state["current"] in releases and before["current"] in releases



# ---------------------------------------------------------------- kernels built on first use
# The engine double builds with the compiler TEST DOUBLE (tests/doubles/compiler_double.py, copied onto the host: the
# double is installed alone), into a kernel cache of the unit's own (its CacheDirectory, a fresh folder per case, so
# each starts cold). Small numbers: a 5 s smoke timeout, 6 s stall timeout, builds of 8 to 10 s.
COMPILER_ON_HOST = "/usr/local/lib/bws-compiler-double.py"
SMOKE_S, STALL_S = 5, 6


def compiling(host: EngineHost, case: str, **env: str) -> dict:
    """sglang_extra_environment of a deploy whose double builds kernels (ENGINE_DOUBLE_COMPILE_* as given)."""
    podman("cp", str(REPO / "tests" / "doubles" / "compiler_double.py"), f"{host.name}:{COMPILER_ON_HOST}")
    host.sh(f"chmod 0644 {COMPILER_ON_HOST}")
    return {"ENGINE_DOUBLE_COMPILER": COMPILER_ON_HOST, "ENGINE_DOUBLE_KERNEL_CACHE": f"/var/cache/sglang/jit-{case}",
            **env}


def test_a_build_at_the_first_sampled_request_longer_than_the_smoke_timeout_passes_the_gate(host, runs):
    """(a) A module outside any pre-build list, built at the first sampled request for 8 s against a 5 s smoke
    timeout: the smoke's bound runs from the compiler's last progress, so the gate passes."""
    before = host.state()["current"]
    run = deploy(host, runs, "deploy_sglang.yml", verify_smoke_timeout_s=SMOKE_S,
                 sglang_extra_environment=compiling(host, "sampled-ok", ENGINE_DOUBLE_COMPILE_SAMPLED_S="8"))
    assert run.status == "successful", run.stdout[-3000:]
    flat = " ".join(run.stdout.split())
    waited = re.search(r"The sampled request waited (\d+\.\d+) s on kernel builds \((\d+\.?\d*) CPU seconds", flat)
    assert waited, flat[-3000:]
    assert float(waited.group(2)) > 0, waited.group(0)  # the compiler double burns CPU while it builds
    assert host.state()["current"] != before and host.health() == 200
    assert host.sh("ls /var/cache/sglang/jit-sampled-ok") == "sampling.so"
    print(f"sampled build: the request waited {waited.group(1)} s on the compiler ({waited.group(2)} CPU s); "
          f"smoke timeout {SMOKE_S} s")


def test_a_sampler_that_hangs_after_its_build_fails_the_gate_on_the_smoke_timeout_and_rolls_back(host, runs):
    """(b) The sampler hangs once its 8 s build is done: the smoke times out, its 5 s counted from the compiler's
    last progress, and the deploy rolls back."""
    before = host.state()["current"]
    run = deploy(host, runs, "deploy_sglang.yml", verify_smoke_timeout_s=SMOKE_S,
                 sglang_extra_environment=compiling(host, "sampled-hang", ENGINE_DOUBLE_COMPILE_SAMPLED_S="8",
                                                    ENGINE_DOUBLE_FAULT="hang-after-compile"))
    assert run.status == "failed"
    flat = " ".join(run.stdout.split())
    failed = re.search(r"timed out \(5 s after the last compiler progress\), after (\d+\.\d+) s\)", flat)
    compiled = re.search(r"It compiled kernels for (\d+\.\d+) s during the request", flat)
    assert failed and compiled, flat[-4000:]
    assert_rolled_back(flat, before)
    assert host.state()["current"] == before and host.health() == 200
    print(f"sampler hang after an 8 s build: failed after {failed.group(1)} s; it compiled {compiled.group(1)} s")


def test_a_build_that_stops_working_at_start_is_a_stall_and_rolls_back(host, runs):
    """(c) The start-up build wedges after 2 s (its compiler lives, idle): declared a stall at the stall timeout,
    with what the compilers did, and rolled back."""
    before = host.state()["current"]
    since = float(host.sh("date +%s")) - 1
    run = deploy(host, runs, "deploy_sglang.yml", sglang_stall_timeout_s=STALL_S,
                 sglang_extra_environment=compiling(host, "start-stall", ENGINE_DOUBLE_COMPILE_START_S="60",
                                                    ENGINE_DOUBLE_FAULT="compile-stall",
                                                    ENGINE_DOUBLE_COMPILE_STALL_AFTER_S="2"))
    assert run.status == "failed"
    flat = " ".join(run.stdout.split())
    stall = re.search(r"stalled: sglang\.service wrote no journal line and was not ready for (\d+\.\d) s "
                      r"\(stall timeout (\d+) s;", flat)
    assert stall, flat[-4000:]
    assert int(stall.group(2)) == STALL_S, stall.group(0)
    assert re.search(r"compilers: \d+(\.\d+)? CPU seconds, last worked \d+\.\d s ago \(0 working now\)", flat), \
        flat[-4000:]
    assert_rolled_back(flat, before)
    assert host.state()["current"] == before and host.health() == 200
    failed_start = started_at(host, since)[-2]
    print(f"start-up build wedged after 2 s: stalled {stall.group(1)} s after the last progress; the failed release "
          f"started at {failed_start:.0f}")


def test_a_working_build_longer_than_the_stall_timeout_passes_readiness(host, runs):
    """(d) A 10 s start-up build against a 6 s stall timeout, the compiler at work throughout: ready, and the
    summary says how long the start compiled."""
    run = deploy(host, runs, "deploy_sglang.yml", sglang_stall_timeout_s=STALL_S,
                 sglang_extra_environment=compiling(host, "start-ok", ENGINE_DOUBLE_COMPILE_START_S="10"))
    assert run.status == "successful", run.stdout[-3000:]
    flat = " ".join(run.stdout.split())
    summary = re.search(r"ready after (\d+\.\d+) s, at most (\d+\.\d+) s without progress \(stall timeout "
                        r"\d+ s\), compiling kernels for (\d+\.\d+) s \((\d+\.?\d*) CPU seconds of cicc\)", flat)
    assert summary, flat[-3000:]
    ready_s, silent_s, compile_s = (float(summary.group(i)) for i in (1, 2, 3))
    # What matters here: the build went on past the stall timeout and readiness passed, because the compiler's
    # progress counted (never STALL_S without it: the gate's own rule), and the summary tells of the compiling.
    assert silent_s < STALL_S, summary.group(0)
    assert float(summary.group(4)) > 0, summary.group(0)  # CPU seconds of the compiler, which burns CPU
    assert host.health() == 200
    print(f"start-up build of 10 s: ready after {ready_s} s, at most {silent_s} s without progress, compiled "
          f"{compile_s} s ({summary.group(4)} CPU s)")


def test_the_api_key_is_in_no_argv_unit_journal_or_runner_artifact_of_the_failed_deploys(host, runs):
    assert_api_key_nowhere(host, runs)
