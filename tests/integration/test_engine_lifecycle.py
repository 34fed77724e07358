"""Engine lifecycle on one booted systemd host: check mode, deploys, engine switches, idempotence,
fault cases with rollback, secrets, teardown. The engine is the ENGINE TEST DOUBLE.

The tests share the host and run in file order; each states the host it leaves behind.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.engine_host import REPO, EngineHost, podman, podman_available

pytestmark = [
    pytest.mark.container,
    pytest.mark.skipif(not podman_available(), reason="needs podman and the test-host image (scripts/build-image.sh)"),
]

API_KEY = "k3y-%s3cr3t$HOME-\"q'"  # quotes, % and $ must survive every layer unexpanded
SANDBOX_PROFILES = yaml.safe_load((REPO / "inventory/sandbox/group_vars/all/models.yml").read_text())


def build_profiles() -> dict:
    profiles = copy.deepcopy(SANDBOX_PROFILES["engine_profiles"])
    missing = copy.deepcopy(profiles["sandbox-tiny-eagle3"])
    missing["model"]["path"] = "/srv/models/sandbox/not-downloaded"
    stranger_port = copy.deepcopy(profiles["sandbox-tiny"])
    stranger_port["port"] = 31000
    pcie_ipc = {**copy.deepcopy(profiles["sandbox-tiny"]), "sglang_pcie_ipc_allreduce": True}
    pcie_ipc_tp1 = copy.deepcopy(pcie_ipc)
    pcie_ipc["tensor_parallel_size"] = 2
    profiles.update({"sandbox-missing-model": missing, "sandbox-port-31000": stranger_port,
                     "sandbox-pcie-ipc-tp2": pcie_ipc, "sandbox-pcie-ipc-tp1": pcie_ipc_tp1})
    return profiles


# A small benchmark, so verify.yml and site.yml run with nothing on the command line in seconds.
SMALL_VERIFY = {"verify_concurrency": [1], "verify_gate_concurrency": [1], "verify_bench_input_len": 16,
                "verify_bench_output_len": 32, "verify_bench_min_prompts": 4, "verify_bench_prompts_per_concurrency": 2,
                "verify_bench_warmup_requests": 0,
                # No run without speculation was verified on this host: passing without a baseline is chosen here.
                "verify_allow_missing_baseline": True}


def inventory_vars(host: EngineHost, **more) -> dict:
    return {"engine_profiles": build_profiles(), "sglang_api_key": API_KEY, "vllm_api_key": API_KEY,
            **SMALL_VERIFY, "verify_report_dir": str(host.workdir / "reports"), **more}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    engine_host = EngineHost("bws-it-engine", tmp_path_factory.mktemp("engine-host"))
    engine_host.write_inventory(inventory_vars(engine_host))
    engine_host.boot()
    prepared = engine_host.run_playbook("tests/sandbox/prepare_host.yml")
    assert prepared.status == "successful", prepared.stdout[-2000:]
    yield engine_host
    engine_host.destroy()


@pytest.fixture(scope="module")
def runs() -> list:
    return []


def deploy(host: EngineHost, runs: list, playbook: str, **extravars):
    run = host.run_playbook(f"playbooks/{playbook}", extravars=extravars)
    runs.append(run)
    return run


def main_pid(host: EngineHost, unit: str = "sglang.service") -> str:
    return host.unit(unit)["MainPID"]


def release(host: EngineHost, release_id: str) -> dict:
    return json.loads(host.sh(f"cat /var/lib/llm-serving/releases/{release_id}/release.json"))


def assert_check_mode_changes_nothing(run) -> None:
    assert run.rc == 0, run.stdout[-3000:]
    assert run.count("changed", "bws-it-engine") == 0, run.stdout[-3000:]
    assert "--- before" not in run.stdout, run.stdout[-3000:]


def test_check_diff_on_a_fresh_host_shows_the_unit_and_skips_start_and_wait(host, runs):
    run = host.run_playbook("playbooks/deploy_sglang.yml", check=True)
    runs.append(run)
    assert run.rc == 0, run.stdout[-3000:]
    assert "ExecStart=/opt/sglang/venv/bin/sglang serve --config /var/lib/llm-serving/releases/sglang-" in run.stdout
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in run.stdout, "the PCIe all-reduce is off unless the profile says so"
    for task in (
        "Activate | stop what serves now and start the release",
        "Activate | wait for readiness and run the post-start gate",
    ):
        header = f"TASK [engine_service : {task}]"
        assert header in run.stdout
        assert run.stdout.split(header, 1)[1].split("TASK [", 1)[0].count("skipping: [bws-it-engine]") == 1
    assert host.sh("test -e /etc/systemd/system/sglang.service && echo yes || echo no") == "no"


def test_pcie_ipc_allreduce_setting_reaches_the_unit_environment_and_refuses_a_tp_it_cannot_serve(host, runs):
    """Check mode: the profile switch puts SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 into the unit (the default profile
    leaves it out: previous test); TP 1 is refused."""
    on = host.run_playbook("playbooks/deploy_sglang.yml", check=True,
                           extravars={"engine_profile": "sandbox-pcie-ipc-tp2"})
    runs.append(on)
    assert on.rc == 0, on.stdout[-3000:]
    assert 'Environment="SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1"' in on.stdout
    refused = host.run_playbook("playbooks/deploy_sglang.yml", check=True,
                                extravars={"engine_profile": "sandbox-pcie-ipc-tp1"})
    runs.append(refused)
    assert refused.rc != 0
    assert "serves only a single-node tensor-parallel group of 2, 4 or 8 GPUs" in " ".join(refused.stdout.split())
    assert host.sh("test -e /etc/systemd/system/sglang.service && echo yes || echo no") == "no"


def test_deploy_sglang_serves(host, runs):
    run = host.run_playbook("deploy_sglang.yml")  # the root-level entry point users type
    runs.append(run)
    assert run.status == "successful", run.stdout[-3000:]
    assert host.unit("sglang.service")["ActiveState"] == "active"
    assert host.unit("sglang.service")["UnitFileState"] == "enabled"
    assert host.health() == 200
    assert "ENGINE TEST DOUBLE" in run.stdout
    state = host.state()
    assert state["status"] == "serving" and state["previous"] is None
    serving = release(host, state["current"])
    assert serving["engine"] == "sglang" and serving["base_url"] == "http://127.0.0.1:30000"
    assert serving["served_model_name"] == "tiny-sandbox" and serving["tokenizer"] == "/srv/models/sandbox/tiny-model"
    assert serving["trust_remote_code"] is False and serving["speculative"] is True
    assert serving["speculative_num_steps"] == 3
    assert serving["speculative_settings"]["speculative-algorithm"] == "EAGLE3"
    config = host.sh(f"cat /var/lib/llm-serving/releases/{state['current']}/config.yaml")
    assert "NOT checked by SGLang's parser: sglang_argcheck was false" in config
    assert "checked it with the installed SGLang's own parser" not in config


def test_second_deploy_changes_nothing(host, runs):
    pid = main_pid(host)
    run = deploy(host, runs, "deploy_sglang.yml")
    assert run.status == "successful", run.stdout[-3000:]
    assert run.count("changed", host.name) == 0, run.stdout[-3000:]
    assert main_pid(host) == pid


def _profiles_with(name: str, **changes) -> dict:
    profiles = build_profiles()
    profiles[name].update(changes)
    return profiles


ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "meta" / "argument_specs.yml").is_file())
# Each is refused by the input check (action_plugins/input_check.py) that every play runs first. Every
# root-level playbook refuses the same inputs on localhost in tests/integration/test_input_check_playbooks.py.
REFUSED_INPUTS = {
    "misspelled api key": (
        {"sglang_api_kye": "x"},
        ["unknown variable sglang_api_kye: not an option of role sglang (did you mean sglang_api_key?)"],
    ),
    "misspelled profile key": (
        {"engine_profiles": _profiles_with("sandbox-tiny-eagle3", trust_remote_cod=True)},
        ["profile sandbox-tiny-eagle3: unknown key trust_remote_cod (did you mean trust_remote_code?)"],
    ),
    "tensor parallel size as a word": (
        {"engine_profiles": _profiles_with("sandbox-tiny-eagle3", tensor_parallel_size="eight")},
        ["profile sandbox-tiny-eagle3: argument 'tensor_parallel_size' is of type str"],
    ),
    "a bogus variable of every role": (
        {f"{role}_bogus": 1 for role in ROLES},
        [f"unknown variable {role}_bogus: not an option of role {role}" for role in ROLES],
    ),
}


@pytest.mark.parametrize("case", REFUSED_INPUTS)
def test_refused_input_fails_before_any_change_and_the_engine_keeps_serving(host, runs, case):
    extravars, messages = REFUSED_INPUTS[case]
    pid = main_pid(host)
    run = host.run_playbook("deploy_sglang.yml", extravars=extravars)  # the root-level entry point
    runs.append(run)
    text = " ".join(run.stdout.split())
    assert run.rc != 0
    for message in messages:
        assert message in text, text[-3000:]
    assert run.count("changed", host.name) == 0
    assert "TASK [sglang :" not in run.stdout, "no task of the deploy may run"
    assert main_pid(host) == pid
    assert host.health() == 200


def test_check_diff_on_the_serving_sglang_host_changes_nothing(host, runs):
    pid = main_pid(host)
    run = host.run_playbook("playbooks/deploy_sglang.yml", check=True)
    runs.append(run)
    assert_check_mode_changes_nothing(run)
    assert main_pid(host) == pid


def test_deploy_vllm_replaces_sglang(host, runs):
    run = deploy(host, runs, "deploy_vllm.yml")
    assert run.status == "successful", run.stdout[-3000:]
    assert host.unit("vllm.service")["ActiveState"] == "active"
    assert host.unit("vllm.service")["UnitFileState"] == "enabled"
    assert host.unit("sglang.service")["ActiveState"] == "inactive"
    assert host.unit("sglang.service")["UnitFileState"] == "disabled"
    assert host.health() == 200


def test_check_diff_on_the_serving_vllm_host_changes_nothing(host, runs):
    pid = main_pid(host, "vllm.service")
    run = host.run_playbook("playbooks/deploy_vllm.yml", check=True)
    runs.append(run)
    assert_check_mode_changes_nothing(run)
    assert main_pid(host, "vllm.service") == pid


def test_verify_without_extra_vars_verifies_the_vllm_that_serves(host, runs):
    run = host.run_playbook("playbooks/verify.yml")
    runs.append(run)
    assert run.status == "successful", run.stdout[-3000:]
    current = host.state()["current"]
    assert current.startswith("vllm-")
    assert re.search(rf"bws-it-engine serves vllm \S+ release {current} \(profile sandbox-tiny-eagle3\)",
                     " ".join(run.stdout.split())), run.stdout[-3000:]
    reports = sorted((host.workdir / "reports" / "bws-it-engine").glob("*/report.json"))
    report = json.loads(reports[-1].read_text())
    assert report["engine"] == "vllm" and report["speculative"] is True, report
    assert "speculation is not running" not in run.stdout


def test_check_diff_of_verify_changes_nothing(host, runs):
    run = host.run_playbook("playbooks/verify.yml", check=True)
    runs.append(run)
    assert_check_mode_changes_nothing(run)


def test_check_diff_where_sglang_would_replace_vllm_shows_it_and_vllm_keeps_serving(host, runs):
    pid = main_pid(host, "vllm.service")
    run = host.run_playbook("playbooks/deploy_sglang.yml", check=True)
    runs.append(run)
    assert run.rc == 0, run.stdout[-3000:]
    assert run.count("changed", host.name) > 0
    # The SGLang release is already on the host (deployed before vLLM): the diff is state.json's switch.
    assert "--- before: /var/lib/llm-serving/state.json" in run.stdout, run.stdout[-3000:]
    assert '-    "current": "vllm-' in run.stdout and '+    "current": "sglang-' in run.stdout, run.stdout[-3000:]
    assert main_pid(host, "vllm.service") == pid and host.unit("sglang.service")["ActiveState"] == "inactive"


def test_deploy_sglang_again_leaves_exactly_one_engine(host, runs):
    run = deploy(host, runs, "deploy_sglang.yml")
    assert run.status == "successful", run.stdout[-3000:]
    assert host.unit("sglang.service")["ActiveState"] == "active"
    assert host.unit("vllm.service")["ActiveState"] == "inactive"
    assert host.unit("vllm.service")["UnitFileState"] == "disabled"
    state = host.state()
    assert state["current"].startswith("sglang-") and state["previous"].startswith("vllm-")


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


GPU_DOUBLE = "/tmp/bws-gpu-double"  # the NVIDIA-SMI TEST DOUBLE and stand-in device files on the test host


def install_gpu_double(host: EngineHost, tmp_path: Path) -> dict:
    """The 8-GPU simulator on the host (stand-in /dev/nvidia*, driver /proc fixture); the gpu_release_* vars."""
    from tests.integration.gpu_helpers import DOUBLES, RTX8, Sim

    gpus = Sim(tmp_path / "sim").gpus
    config = tmp_path / "sim.json"
    config.write_text(json.dumps({"dev_dir": f"{GPU_DOUBLE}/dev", "driver_version": "580.105.08", "gpus": gpus}))
    wrapper = tmp_path / "nvidia-smi"
    double = f"{GPU_DOUBLE}/nvidia_smi_double.py --config {GPU_DOUBLE}/sim.json"
    wrapper.write_text(f'#!/bin/sh\nexec python3 {double} "$@"\n')
    wrapper.chmod(0o755)
    host.sh(f"rm -rf {GPU_DOUBLE}; mkdir -p {GPU_DOUBLE}/dev && cd {GPU_DOUBLE}/dev && "
            "touch nvidia0 nvidia1 nvidia2 nvidia3 nvidia4 nvidia5 nvidia6 nvidia7 nvidiactl nvidia-uvm")  # fmt: skip
    for source, dest in [(DOUBLES / "nvidia_smi_double.py", "nvidia_smi_double.py"), (config, "sim.json"),
                         (wrapper, "nvidia-smi"), (RTX8 / "proc-driver-nvidia", "proc-driver-nvidia")]:  # fmt: skip
        subprocess.run(["podman", "cp", str(source), f"{host.name}:{GPU_DOUBLE}/{dest}"], check=True)
    return {
        "gpu_release_nvidia_smi": f"{GPU_DOUBLE}/nvidia-smi",
        "gpu_release_driver_proc_dir": f"{GPU_DOUBLE}/proc-driver-nvidia",
        "gpu_release_dev_dir": f"{GPU_DOUBLE}/dev",
    }


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
        assert f"foreign processes use the GPUs (not signalled): PID {stranger} (python3 -c import time" in run.stdout
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
    # The double made slower with speculation than the recorded baseline: 0.66x at concurrency 1.
    run = deploy(host, runs, "deploy_sglang.yml", sglang_gate="full",
                 sglang_extra_environment={"ENGINE_DOUBLE_TOKENS_PER_S": "50", "ENGINE_DOUBLE_ACCEPT_RATE": "0.15",
                                           "ENGINE_DOUBLE_SPEC_COST": "1.78"},
                 verify_baselines={"sandbox-tiny-eagle3": {"1": 49.0}}, verify_concurrency=[1],
                 verify_gate_concurrency=[1], verify_bench_input_len=16, verify_bench_output_len=32,
                 verify_bench_min_prompts=4, verify_bench_prompts_per_concurrency=2, verify_bench_warmup_requests=0,
                 verify_report_dir=str(tmp_path / "reports"))
    assert run.status == "failed"
    flat = " ".join(run.stdout.split())
    assert re.search(r"speed-up 0\.[5-7]\dx at concurrency 1 is below the 1\.00x minimum", flat), flat[-3000:]
    assert f"Rolled back: {before} is serving again" in flat
    assert host.state()["current"] == before and host.health() == 200
    assert list((tmp_path / "reports").rglob("report.md")), "the failing gate still wrote its report"


def test_after_a_rollback_the_state_names_current_and_previous_as_before(host, runs):
    before = host.state()
    run = deploy(host, runs, "deploy_sglang.yml", sglang_extra_environment={"ENGINE_DOUBLE_FAULT": "crash-at-start"})
    assert run.status == "failed"
    assert "auto-restart" in run.stdout or "unit is failed" in run.stdout, run.stdout[-3000:]
    assert f"Rolled back: {before['current']} is serving again" in " ".join(run.stdout.split())
    after = host.state()
    assert after["previous"] is not None and after["previous"].startswith("vllm-")
    assert {k: after[k] for k in ("current", "previous", "status")} == {
        "current": before["current"], "previous": before["previous"], "status": "serving"}
    assert after["failed"].startswith("sglang-") and after["failed"] != before["current"]
    assert host.unit("sglang.service")["ActiveState"] == "active" and host.health() == 200


def test_garbage_output_rolls_back_naming_the_reply(host, runs):
    before = host.state()["current"]
    run = deploy(host, runs, "deploy_sglang.yml", sglang_extra_environment={"ENGINE_DOUBLE_FAULT": "garbage-output"})
    assert run.status == "failed"
    flat = " ".join(run.stdout.split())
    assert re.search(r"the smoke answer is wrong: asked 'What is \d{3} \+ \d{3}\? Reply with the number only\.', "
                     r"expected \d+; got HTTP 200 .* content 'foss foss foss", flat), flat[-3000:]
    assert f"Rolled back: {before} is serving again" in flat
    assert host.state()["current"] == before and host.health() == 200


def started_at(host: EngineHost, since: float, unit: str = "sglang.service") -> list[float]:
    """Times (host clock, epoch seconds) at which systemd started `unit` since `since`."""
    lines = host.sh(f"journalctl -u {unit} -o short-unix --no-pager --since @{since:.0f} | grep -E 'Started '")
    return [float(line.split()[0]) for line in lines.splitlines()]


def test_deadlock_on_generate_with_default_timeouts_rolls_back_within_stall_plus_smoke_timeout(host, runs):
    """The reference host's failure: the engine loads, then no generation ever finishes. SGLang's /health
    generates, so it answers 503 after the health-check timeout (20 s, the double's default as SGLang's),
    exactly as while loading. No timeout is set here: the sandbox inventory's stall timeout and the verify
    role's smoke timeout apply; the previous release must serve again within their sum + 10 %."""
    sandbox = yaml.safe_load((REPO / "inventory/sandbox/group_vars/all/sandbox.yml").read_text())
    verify_defaults = yaml.safe_load((REPO / "roles/verify/defaults/main.yml").read_text())
    bound_s = 1.1 * (sandbox["sglang_stall_timeout_s"] + verify_defaults["verify_smoke_timeout_s"])
    before = host.state()["current"]
    since = float(host.sh("date +%s")) - 1
    run = deploy(host, runs, "deploy_sglang.yml",
                 sglang_extra_environment={"ENGINE_DOUBLE_FAULT": "deadlock-on-generate"})
    serving_again = float(host.sh("date +%s.%N"))
    assert run.status == "failed"
    assert host.health() == 200 and host.state()["current"] == before
    flat = " ".join(run.stdout.split())
    assert f"Rolled back: {before} is serving again" in flat
    stall = re.search(r"stalled: sglang\.service wrote no journal line and was not ready for (\d+\.\d) s "
                      r"\(stall timeout (\d+) s; last answer: ", flat)
    assert stall, flat[-3000:]
    assert int(stall.group(2)) == sandbox["sglang_stall_timeout_s"]
    assert "Health check failed" in flat  # the journal tail: /health generated and answered 503 after 20 s
    failed_start, rollback_start = started_at(host, since)[-2:]
    assert rollback_start > failed_start
    took = serving_again - failed_start
    assert took <= bound_s, f"the previous release served again {took:.1f} s after the deadlocked one started"
    print(f"deadlock-on-generate: previous release serves again {took:.1f} s after the failed start "
          f"(stall fired after {stall.group(1)} s; bound {bound_s:.0f} s)")


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
    assert re.search(r"not ready after 4\.\d s \(timeout 4 s; last answer: ", flat), flat[-3000:]
    assert "fault=hang" in flat  # the journal tail of the hung release
    assert host.state()["current"] == before and host.health() == 200


def test_failed_vllm_deploy_rolls_back_to_the_sglang_release(host, runs):
    before = host.state()["current"]
    run = deploy(host, runs, "deploy_vllm.yml", vllm_extra_environment={"ENGINE_DOUBLE_FAULT": "crash-at-start"})
    assert run.status == "failed"
    assert host.unit("vllm.service")["UnitFileState"] == "disabled"
    assert host.unit("sglang.service")["ActiveState"] == "active" and host.health() == 200
    assert host.state()["current"] == before


def interrupted_deploy(host: EngineHost, playbook: str, extravars: dict, interrupt_when) -> None:
    """Run a deploy and kill its controller (SIGKILL, as a lost terminal or CI runner) once interrupt_when()
    holds. The controller starts a session of its own and the kill goes to that session's process group only,
    so it reaches nothing this test did not start. (Not a private PID namespace: podman judges whether a
    container's conmon lives by its host PID, which a PID namespace would hide.)"""
    command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(host.inventory),
               str(REPO / playbook), "-e", json.dumps(extravars)]
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    controller = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not interrupt_when():
            assert controller.poll() is None, "the deploy ended before it could be interrupted"
            assert time.monotonic() < deadline, "the deploy never reached the point to interrupt"
            time.sleep(0.5)
    finally:
        if controller.poll() is None:
            os.killpg(controller.pid, signal.SIGKILL)
        controller.wait()


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


def test_the_api_key_is_in_no_argv_unit_journal_or_runner_artifact(host, runs):
    assert API_KEY not in host.sh("ps -eo args")
    assert API_KEY not in host.sh("cat /etc/systemd/system/*.service")
    assert API_KEY not in host.sh("journalctl --no-pager -o cat")
    for run in runs:
        for artifact in Path(run.artifact_dir).rglob("*"):
            if artifact.is_file():
                assert API_KEY not in artifact.read_text(errors="replace"), artifact
    config = host.sh("ls /var/lib/llm-serving/releases/sglang-*/config.yaml | head -1")
    assert host.sh(f"stat -c '%U:%G %a' {config}") == "root:sglang 640"
    unauthenticated = host.sh(
        "python3 -c \"import urllib.request as u, urllib.error as e\ntry: u.urlopen('http://127.0.0.1:30000/v1/models')"
        '\nexcept e.HTTPError as x: print(x.code)"'
    )
    assert unauthenticated == "401"


def test_check_diff_of_teardown_on_a_serving_host_shows_the_state_change_and_stops_nothing(host, runs):
    pid = main_pid(host)
    run = host.run_playbook("playbooks/teardown.yml", check=True)
    assert run.rc == 0, run.stdout[-3000:]
    assert '+    "status": "stopped"' in run.stdout and '-    "status": "serving"' in run.stdout, run.stdout[-3000:]
    assert main_pid(host) == pid and host.health() == 200


HANDMADE_SESSION = "user.slice/user-1000.slice/session-99.scope"


def start_in_handmade_session(host: EngineHost, title: str) -> str:
    """An engine-titled process of the sglang user in a hand-made login-session cgroup; its PID."""
    script = (
        "P=$(sed -n 's/^[0-9]*:name=systemd://p' /proc/self/cgroup); B=/sys/fs/cgroup/systemd; "
        '[ -d "$B$P" ] && B="$B$P"; '
        f'D="$B/{HANDMADE_SESSION}"; mkdir -p "$D" && echo $$ > "$D/cgroup.procs" && '
        "exec setpriv --reuid=sglang --regid=sglang --init-groups python3 -c "
        f"\"import os; os.execv('/usr/bin/python3', ['{title}', '-c', 'import time; time.sleep(600)'])\""
    )
    podman("exec", "-d", host.name, "sh", "-c", script)
    return host.sh(f"for i in $(seq 50); do pgrep -f '^{title}' && exit 0; sleep 0.1; done")


def test_teardown_stops_everything_and_a_second_teardown_changes_nothing(host, runs):
    engine_pids = host.sh("pgrep -u sglang -d ' ' .")
    assert engine_pids, "the engine serves before the teardown"
    session = start_in_handmade_session(host, "sglang::handmade_TP0")
    current = host.state()["current"]
    run = host.run_playbook("playbooks/teardown.yml")
    assert run.status == "successful", run.stdout[-3000:]
    for unit in ("sglang.service", "vllm.service"):
        assert host.unit(unit)["ActiveState"] == "inactive"
        assert host.unit(unit)["UnitFileState"] == "disabled"
    # the unit's processes are gone; the hand-made session's engine look-alike lives and is named
    assert host.sh(f"pgrep -u sglang -d ' ' . | tr ' ' '\\n' | grep -vx {session} || true") == ""
    assert host.sh(f"kill -0 {session} && echo alive") == "alive"
    assert f"foreign, not signalled: {session} sglang::handmade_TP0" in run.stdout
    assert "in a user session (" in run.stdout and HANDMADE_SESSION in run.stdout
    host.sh(f"kill {session}")
    assert host.state()["status"] == "stopped" and host.state()["current"] == current
    # One summary per host: the role's own is off, the teardown summary names the release it stopped.
    gpu_summary = run.stdout.split("TASK [gpu_release : Summary of the GPU release]", 1)[1].split("TASK [", 1)[0]
    assert "skipping: [bws-it-engine]" in gpu_summary and "ok: [bws-it-engine]" not in gpu_summary
    summary = run.stdout.split("TASK [Teardown | summary]", 1)[1].split("PLAY RECAP", 1)[0]
    flat = " ".join(summary.split())
    assert f"release {current} (sglang, profile sandbox-tiny-eagle3) is recorded as stopped" in flat, flat
    check = host.run_playbook("playbooks/teardown.yml", check=True)
    assert_check_mode_changes_nothing(check)
    again = host.run_playbook("playbooks/teardown.yml")
    assert again.status == "successful"
    assert again.count("changed", host.name) == 0, again.stdout[-3000:]


def test_site_with_engine_vllm_in_the_inventory_deploys_and_verifies_vllm_and_ci_reports_it(host, tmp_path):
    host.write_inventory(inventory_vars(host, engine="vllm"))
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/ci_playbook.py"), "playbooks/site.yml", "-i", str(host.inventory),
         "--artifacts", str(tmp_path), "--ident", "site", "--skip-tags", "provision"],
        capture_output=True, text=True, check=False, cwd=REPO,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    assert host.unit("vllm.service")["ActiveState"] == "active"
    assert host.unit("sglang.service")["ActiveState"] == "inactive"
    assert host.state()["current"].startswith("vllm-") and host.state()["status"] == "serving"
    summary = json.loads((tmp_path / "site" / "summary.json").read_text())
    report_dir = Path(summary["hosts"]["bws-it-engine"]["verify_report"])
    assert report_dir.parent == host.workdir / "reports" / "bws-it-engine", summary
    assert json.loads((report_dir / "report.json").read_text())["engine"] == "vllm"
