"""Fault cases on one booted systemd host of their own: refused deploys that leave the engine untouched,
failed gates that roll back (test_engine_faults_after_start.py has the hangs, deadlocks, crashes and the
interrupted deploy, on a host of its own beside this one). The engine is the ENGINE TEST DOUBLE. The tests
share the host and run in file order; each states the host it leaves behind.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.integration.engine_host import podman
from tests.integration.lifecycle_helpers import (
    CONTAINER_MARKS,
    GPU_DOUBLE,
    assert_api_key_nowhere,
    assert_rolled_back,
    booted_engine_host,
    deploy,
    install_gpu_double,
    main_pid,
)

pytestmark = CONTAINER_MARKS


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    yield from booted_engine_host("bws-it-faults", tmp_path_factory.mktemp("faults-host"))


@pytest.fixture(scope="module")
def runs() -> list:
    return []


def test_sglang_serves_with_a_vllm_release_before_it(host, runs):
    """The host every fault case starts from: SGLang serves, a vLLM release served before it."""
    for playbook in ("deploy_vllm.yml", "deploy_sglang.yml"):
        run = deploy(host, runs, playbook)
        assert run.status == "successful", run.stdout[-3000:]
    state = host.state()
    assert state["current"].startswith("sglang-") and state["previous"].startswith("vllm-")
    assert host.health() == 200


def test_missing_model_fails_preflight_and_leaves_the_engine_untouched(host, runs):
    pid = main_pid(host)
    run = deploy(host, runs, "deploy_sglang.yml", engine_profile="sandbox-missing-model")
    assert run.status == "failed"
    assert "/srv/models/sandbox/not-downloaded" in run.stdout
    assert "Activate |" not in run.stdout
    assert main_pid(host) == pid and host.health() == 200


def test_port_taken_by_a_stranger_is_named_and_the_stranger_lives(host, runs):
    stranger = subprocess.Popen(
        ["podman", "exec", host.name, "python3", "-m", "http.server", "31000", "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        host.sh("for i in $(seq 50); do ss -ltn | grep -q :31000 && exit 0; sleep 0.1; done; exit 1")
        pid = main_pid(host)
        run = deploy(host, runs, "deploy_sglang.yml", engine_profile="sandbox-port-31000")
        assert run.status == "failed"
        assert "port 31000 is taken by a process this deploy does not own" in run.stdout
        assert "http.server" in run.stdout
        assert host.sh("ss -ltn | grep -c :31000") == "1"
        assert main_pid(host) == pid and host.health() == 200
    finally:
        stranger.terminate()
        host.sh("pkill -f 'http.server 31000' || true", check=False)


def test_a_foreign_gpu_holder_on_a_needed_gpu_fails_the_deploy_before_the_switch(host, runs, tmp_path):
    gpu_vars = install_gpu_double(host, tmp_path)
    # A stranger's CUDA process on GPU 0 (device minor 2 on the constructed host), 4 GiB, as root.
    holder = f"import time; f=[open('{GPU_DOUBLE}/dev/nvidia2'), open('{GPU_DOUBLE}/dev/nvidia-uvm')]; time.sleep(600)"
    podman("exec", "-d", "-e", "NVSIM_MEM_MIB=2:4096", host.name, "python3", "-c", holder)
    try:
        find = "pgrep -f '[/]tmp/bws-gpu-double/dev/nvidia2'"  # [/]: never matches the shell running pgrep
        stranger = host.sh(f"for i in $(seq 50); do {find} && exit 0; sleep 0.1; done")
        assert host.sh(f"{GPU_DOUBLE}/nvidia-smi --query-compute-apps=pid --format=csv,noheader,nounits") == stranger
        pid = main_pid(host)
        run = deploy(host, runs, "deploy_sglang.yml", engine_profile="sandbox-tiny", **gpu_vars)
        assert run.status == "failed"
        # Named by pid, title and user: never its arguments (which may hold a key).
        assert f"foreign processes use the GPUs (not signalled): PID {stranger} python3 (root (uid 0))" in run.stdout
        assert "import time" not in run.stdout
        assert "on GPUs [0]" in run.stdout and "nothing was stopped, signalled or removed" in run.stdout
        assert "Activate |" not in run.stdout
        assert main_pid(host) == pid and host.health() == 200
        assert host.sh(f"kill -0 {stranger} && echo alive") == "alive"
    finally:
        host.sh(f"pkill -f '{GPU_DOUBLE}/dev/nvidia2' || true", check=False)


def test_missing_engine_binary_is_caught_before_the_switch(host, runs):
    pid = main_pid(host)
    run = deploy(host, runs, "deploy_sglang.yml", sglang_executable="/opt/sglang/venv/bin/sglang-missing")
    assert run.status == "failed"
    assert "sglang-missing" in run.stdout and "is not executable" in run.stdout
    assert main_pid(host) == pid and host.health() == 200


def test_an_argument_check_that_cannot_run_stops_the_deploy_before_the_switch(host, runs):
    # The checker is the role's real one; the sandbox host has no SGLang for it to import, so it fails for
    # real (exit 1). The rejection of a misspelled flag (exit 2) is proven with the real parsers in tests/contract.
    pid = main_pid(host)
    releases = host.sh("ls /var/lib/llm-serving/releases")
    run = deploy(host, runs, "deploy_sglang.yml", sglang_argcheck=True, sglang_python="/usr/bin/python3",
                 sglang_extra_options={"log-level": "debug"})
    assert run.status == "failed"
    flat = " ".join(run.stdout.split())
    assert "the argument check of sglang 0.5.23 could not run (exit 1)" in flat
    assert "as user sglang (HF_HUB_OFFLINE=1)" in flat, "the check runs as the service user, Hub offline"
    assert "Nothing that serves now was touched" in flat
    assert host.sh("ls /var/lib/llm-serving/releases") == releases, "the rejected release directory is removed"
    assert main_pid(host) == pid and host.health() == 200


def test_a_deploy_whose_verify_gate_fails_rolls_back_and_the_previous_release_serves(host, runs, tmp_path):
    before = host.state()["current"]
    # The double made slower with speculation than the recorded baseline (about 0.66x at concurrency 1): the gate
    # fails on the speed-up minimum and the deploy rolls back.
    run = deploy(host, runs, "deploy_sglang.yml", sglang_gate="full",
                 sglang_extra_environment={"ENGINE_DOUBLE_TOKENS_PER_S": "50", "ENGINE_DOUBLE_ACCEPT_RATE": "0.15",
                                           "ENGINE_DOUBLE_SPEC_COST": "1.78"},
                 verify_baselines={"sandbox-tiny-eagle3": {"1": 49.0}}, verify_concurrency=[1],
                 verify_gate_concurrency=[1], verify_bench_input_len=16, verify_bench_output_len=32,
                 verify_bench_min_prompts=4, verify_bench_prompts_per_concurrency=2, verify_bench_warmup_requests=0,
                 verify_report_dir=str(tmp_path / "reports"))
    assert run.status == "failed"
    flat = " ".join(run.stdout.split())
    assert re.search(r"speed-up \d+\.\d\dx at concurrency 1 is below the 1\.00x minimum", flat), flat[-3000:]
    assert_rolled_back(flat, before)
    assert host.state()["current"] == before and host.health() == 200
    assert list((tmp_path / "reports").rglob("report.md")), "the failing gate still wrote its report"


def test_after_a_rollback_the_state_names_current_and_previous_as_before(host, runs):
    before = host.state()
    run = deploy(host, runs, "deploy_sglang.yml", sglang_extra_environment={"ENGINE_DOUBLE_FAULT": "crash-at-start"})
    assert run.status == "failed"
    assert "auto-restart" in run.stdout or "unit is failed" in run.stdout, run.stdout[-3000:]
    assert f"Rolled back: {before['current']} is serving again" in " ".join(run.stdout.split())
    # The play's last message holds the journal's end, where the reason is.
    final = run.stdout[run.stdout.rindex("Rolled back:"):]
    assert "The journal of the failed release ended with:" in final, final[:3000]
    assert "engine-double: simulated crash during model load" in final, final[:3000]
    after = host.state()
    assert after["previous"] is not None and after["previous"].startswith("vllm-")
    assert {k: after[k] for k in ("current", "previous", "status")} == {
        "current": before["current"], "previous": before["previous"], "status": "serving"}
    assert after["failed"].startswith("sglang-") and after["failed"] != before["current"]
    assert host.unit("sglang.service")["ActiveState"] == "active" and host.health() == 200


def test_a_rollback_that_fails_too_names_both_failures_and_both_journals_and_the_state_says_switching(host, runs):
    """The release before no longer starts (here its kept unit is made to crash, as a host change would: a deleted
    model, a driver update): the deploy's rollback fails too. The play's last message names both failures and ends
    with both releases' journals, where the reasons are; state.json does not claim anything serves.
    Leaves: nothing serving, state.json switching to the failed release."""
    before = host.state()
    kept_unit = f"/var/lib/llm-serving/releases/{before['current']}/sglang.service"
    host.sh(f"sed -i '/^\\[Service\\]$/a Environment=ENGINE_DOUBLE_FAULT=crash-at-start' {kept_unit}")
    run = deploy(host, runs, "deploy_sglang.yml", sglang_extra_environment={"ENGINE_DOUBLE_FAULT": "crash-at-start"})
    assert run.status == "failed", run.stdout[-3000:]
    final = run.stdout[run.stdout.rindex("Rolling back to"):]
    flat = " ".join(final.split())
    assert flat.startswith(f"Rolling back to {before['current']} ALSO failed at Rollback | wait for the previous "
                           "release with its own timeout: "), flat[:3000]
    assert "Nothing serves on this host now." in flat, flat[:3000]
    failed_journal = final.index("The journal of the failed release ended with:")
    previous_journal = final.index(f"The journal of {before['current']}, which did not come up again, ended with:")
    assert failed_journal < previous_journal, final[:3000]
    # Each journal holds its own release's reason.
    assert "engine-double: simulated crash during model load" in final[failed_journal:previous_journal], final[:3000]
    assert "engine-double: simulated crash during model load" in final[previous_journal:], final[:3000]
    after = host.state()
    assert after["status"] == "switching" and after["current"] not in (before["current"], before["previous"]), after
    assert host.health() is None and host.unit("sglang.service")["ActiveState"] != "active"


def test_the_api_key_is_in_no_argv_unit_journal_or_runner_artifact_of_the_failed_deploys(host, runs):
    assert_api_key_nowhere(host, runs)
