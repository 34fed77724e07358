"""The interconnect proof and the bounded drain through the deploy path, on a booted systemd host of its own:
MIG refused in preflight; the proof run as the unit in the switch window, recorded, not re-run by a no-op deploy,
re-run when the NCCL environment changes, and a failing proof rolled back. The engine is the ENGINE TEST DOUBLE.
The tests share the host and run in file order.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.integration.engine_host import REPO, EngineHost, podman
from tests.integration.lifecycle_helpers import (
    API_KEY,
    CONTAINER_MARKS,
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
    yield from booted_engine_host("bws-it-proof", tmp_path_factory.mktemp("proof-host"))


@pytest.fixture(scope="module")
def runs() -> list:
    return []


def test_vllm_serves_so_its_gpus_are_busy(host, runs):
    """The host the proof cases start from: vLLM serves, nothing was proven."""
    run = deploy(host, runs, "deploy_vllm.yml")
    assert run.status == "successful", run.stdout[-3000:]
    assert host.health() == 200 and host.sh("ls /var/lib/llm-serving/interconnect 2>/dev/null || true") == ""


# The interconnect proof through the deploy path. The sandbox has no engine venv: the engine's python is the
# INTERCONNECT PROOF INTERPRETER TEST DOUBLE (tests/doubles/proof_python_double.py), which runs the real proof
# script with stand-in ranks and can be made to hang a rank. GPU facts come from the NVIDIA-SMI TEST DOUBLE, outside
# /tmp (the unit's PrivateTmp= hides /tmp from the proof, as from the engine).
PROOF_GPU_DOUBLE = "/usr/local/lib/bws-gpu-double"
PROOF_PYTHON = "/usr/local/bin/interconnect-proof-python-double"


def proof_vars(host: EngineHost, tmp_path: Path, **environment: str) -> dict:
    """Deploy variables that turn the proof on with the doubles (installed once, MIG off) and set the environment."""
    if host.sh(f"test -x {PROOF_PYTHON} && echo yes || true") != "yes":
        install_gpu_double(host, tmp_path, root=PROOF_GPU_DOUBLE)
        subprocess.run(["podman", "cp", str(REPO / "tests/doubles/proof_python_double.py"),
                        f"{host.name}:{PROOF_PYTHON}"], check=True)
        host.sh(f"chmod 0755 {PROOF_PYTHON}")
    set_mig(host, ())
    return {"gpu_release_nvidia_smi": f"{PROOF_GPU_DOUBLE}/nvidia-smi",
            "gpu_release_driver_proc_dir": f"{PROOF_GPU_DOUBLE}/proc-driver-nvidia",
            "gpu_release_dev_dir": f"{PROOF_GPU_DOUBLE}/dev",
            "sglang_interconnect_proof": True, "sglang_python": PROOF_PYTHON,
            "engine_service_preflight_gpus": True, "engine_service_nvidia_smi": f"{PROOF_GPU_DOUBLE}/nvidia-smi",
            "engine_service_nvidia_driver_proc_dir": f"{PROOF_GPU_DOUBLE}/proc-driver-nvidia",
            "engine_service_proof_timeout_s": 5, "sglang_extra_environment": environment,
            "sglang_gate": "none"}  # the gate is shown elsewhere; these deploys are about the proof


def set_mig(host: EngineHost, mig_on: tuple[int, ...]) -> None:
    """MIG on for these GPU indices (off for the others) in the NVIDIA-SMI TEST DOUBLE's configuration."""
    script = ("import json, sys; p = sys.argv[1]; c = json.load(open(p)); on = json.loads(sys.argv[2]); "
              "[g.update(mig_mode='Enabled' if g['index'] in on else 'Disabled') for g in c['gpus']]; "
              "json.dump(c, open(p, 'w'))")
    podman("exec", host.name, "python3", "-c", script, f"{PROOF_GPU_DOUBLE}/sim.json", json.dumps(list(mig_on)))


def journal_times(host: EngineHost, unit: str, event: str) -> list[float]:
    """Times (host clock, epoch seconds) of systemd's `event` lines ("Started", "Stopped") for `unit`."""
    lines = host.sh(f"journalctl -u {unit} -o short-unix --no-pager | grep -E ' systemd\\[1\\]: {event} ' || true")
    return [float(line.split()[0]) for line in lines.splitlines()]


def proof_runs(host: EngineHost) -> list[float]:
    """Start times of the proof's transient unit (sglang-interconnect-proof.service)."""
    return journal_times(host, "sglang-interconnect-proof", "Started")


def test_mig_on_a_needed_gpu_fails_the_deploy_preflight_before_anything_changes(host, runs, tmp_path):
    pid = main_pid(host, "vllm.service")
    mig_vars = proof_vars(host, tmp_path, NCCL_DEBUG="INFO")
    set_mig(host, (0,))
    run = deploy(host, runs, "deploy_sglang.yml", engine_profile="sandbox-tiny", **mig_vars)
    assert run.status == "failed"
    flat = " ".join(run.stdout.split())
    assert "MIG is on for GPU(s) 0 of the 1 the profile needs on this host" in flat, flat[-3000:]
    assert "Activate |" not in run.stdout and not proof_runs(host)
    assert main_pid(host, "vllm.service") == pid and host.health() == 200


LONG_REQUEST = """
import json, os, urllib.request
body = {"model": "tiny-sandbox", "messages": [{"role": "user", "content": "write"}], "max_tokens": 4000, "stream": True}
request = urllib.request.Request("http://127.0.0.1:30000/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + os.environ["KEY"]})
with urllib.request.urlopen(request) as reply, open("/root/long-request.txt", "w") as out:
    for line in reply:
        out.write(line.decode())
        out.flush()
"""


def start_long_request(host: EngineHost) -> None:
    """A streamed request of 4000 tokens at the double's 10 tokens/s (about 400 s, past TimeoutStopSec=180)."""
    host.sh("rm -f /root/long-request.txt")
    podman("exec", "-d", "-e", f"KEY={API_KEY}", host.name, "python3", "-c", LONG_REQUEST)
    host.sh("for i in $(seq 50); do grep -q chat.completion.chunk /root/long-request.txt 2>/dev/null && exit 0; "
            "sleep 0.2; done; exit 1")


def test_interconnect_proof_runs_as_the_unit_in_the_switch_window_once_and_a_failing_one_rolls_back(
        host, runs, tmp_path):
    """vLLM serves (its GPUs are busy): the SGLang deploy proves the interconnect after vLLM stopped and before SGLang
    starts, through systemd-run as the unit's user with the unit's NCCL environment, and records it. The same deploy
    again is a no-op and does not run it. A changed NCCL environment runs it again, in the switch window; a rank
    that hangs fails it at its timeout, naming the rank, and the deploy rolls back to the release that served.
    That switch also stops an SGLang with a long request in flight: the drain is bounded, the request aborted."""
    unit_env = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "lo", "CUDA_HOME": "/usr/local/cuda"}
    good = proof_vars(host, tmp_path, NCCL_DEBUG="INFO", NCCL_SOCKET_IFNAME="lo", ENGINE_DOUBLE_TOKENS_PER_S="10")
    run = deploy(host, runs, "deploy_sglang.yml", engine_profile="sandbox-tiny", **good)
    assert run.status == "successful", run.stdout[-3000:]
    uid = host.sh("id -u sglang")
    flat = " ".join(run.stdout.split())
    assert "no interconnect proof is recorded on this host; it runs in the switch window" in flat, flat[-3000:]
    assert re.search(rf"interconnect PROVEN: 1 ranks as uid {uid} \(sglang\)", flat), flat[-3000:]
    (record_file,) = host.sh("ls /var/lib/llm-serving/interconnect/").split()
    record = json.loads(host.sh(f"cat /var/lib/llm-serving/interconnect/{record_file}"))
    assert record["uid"] == int(uid) and record["user"] == "sglang"
    assert {k: v for k, v in record["environment"].items() if k.startswith(("NCCL_", "CUDA_"))} == unit_env, \
        "the proof saw the unit's NCCL/CUDA environment (checked by the module)"
    assert record["environment"]["SGLANG_CACHE_DIR"] == "/var/cache/sglang", "SGLANG_* variables are keyed too"
    assert record["engine_settings"]["engine"] == "sglang"
    assert record["engine_environment"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "8", "NCCL_CUMEM_ENABLE": "0",
                                            "NCCL_NVLS_ENABLE": "0"}, "SGLang's in-process NCCL settings"
    assert record["release"] == host.state()["current"] and record["test_double"].startswith("INTERCONNECT PROOF")
    assert record["identity"]["driver_version"] == "580.105.08" and len(record["identity"]["gpus"]) == 1
    (started,) = proof_runs(host)
    vllm_stopped = journal_times(host, "vllm.service", "Stopped")[-1]
    sglang_started = journal_times(host, "sglang.service", "Started")[-1]
    assert vllm_stopped < started < sglang_started, "the proof ran in the switch window"
    proven_release = host.state()["current"]

    again = deploy(host, runs, "deploy_sglang.yml", engine_profile="sandbox-tiny", **good)
    assert again.status == "successful" and again.count("changed", host.name) == 0, again.stdout[-3000:]
    assert "Proof | interconnect proof as" not in again.stdout, "a no-op deploy never runs it"
    assert len(proof_runs(host)) == 1

    hang = proof_vars(host, tmp_path, NCCL_DEBUG="WARN", NCCL_SOCKET_IFNAME="lo", BWS_PROOF_DOUBLE_FAULT="hang:0")
    start_long_request(host)
    since = float(host.sh("date +%s")) - 1
    failed = deploy(host, runs, "deploy_sglang.yml", engine_profile="sandbox-tiny", engine_service_drain_timeout_s=2,
                    **hang)
    assert failed.status == "failed"
    flat = " ".join(failed.stdout.split())
    assert "sglang.service still had requests in flight 2 s after SIGTERM (engine_service_drain_timeout_s): aborted " \
           "them (POST /abort_request abort_all: HTTP 200)" in flat, flat[-3000:]
    assert '"finish_reason":"abort"' in host.sh("cat /root/long-request.txt"), "the request in flight was aborted"
    log = host.sh(f"journalctl -u sglang.service --since @{since:.0f} --no-pager -o cat")
    assert "Gracefully exiting... Remaining number of requests 1" in log and "Deactivated successfully" in log, log
    assert "SIGKILL" not in log and "Killing process" not in log and "timed out" not in log, log
    assert "changed: NCCL_DEBUG: INFO -> WARN" in flat and "it runs in the switch window" in flat, flat[-3000:]
    assert "interconnect proof FAILED (nccl, 1 ranks, uid " + uid + " sglang)" in flat, flat[-3000:]
    assert "rank(s) 0 did not finish within 5 s [rank 0: all_reduce 1 MiB (killed)]" in flat
    assert "ranks that did not finish: 0" in flat and "IOMMU mode: " in flat
    assert "Fix: docs/provisioning.md, section 'Interconnect: IOMMU and ACS'" in flat
    assert_rolled_back(flat, proven_release)
    assert len(proof_runs(host)) == 2 and len(host.sh("ls /var/lib/llm-serving/interconnect/").split()) == 1
    assert host.state()["current"] == proven_release and host.health() == 200


FABRIC = "/usr/local/lib/bws-fabric"  # fixture files of the fabric facts the proof is keyed by


def set_fabric(host: EngineHost, boot_id: str) -> dict:
    """Fixture fabric facts (a boot id, IOMMU pass-through, no ACS redirection) and the variable naming them."""
    host.sh(f"mkdir -p {FABRIC}/iommu_groups/0/devices && echo identity > {FABRIC}/iommu_groups/0/type"
            f" && echo {boot_id} > {FABRIC}/boot_id && echo 'ro quiet iommu=pt' > {FABRIC}/cmdline"
            f" && printf '#!/bin/sh\\nexit 0\\n' > {FABRIC}/lspci && chmod 0755 {FABRIC}/lspci")
    return {"engine_service_proof_fabric_sources": {"boot_id": f"{FABRIC}/boot_id", "cmdline": f"{FABRIC}/cmdline",
                                                    "iommu_groups": f"{FABRIC}/iommu_groups",
                                                    "lspci": f"{FABRIC}/lspci"}}


def test_a_reboot_proves_again_and_an_unchanged_fabric_reuses_the_record(host, runs, tmp_path):
    """The record is keyed by the fabric too: the same unit environment after a reboot (another boot id) is proven
    again before the switch; a switch on the fabric already proven reuses the record. (A changed release that
    leaves the key alone: the double's token rate.)"""
    proven_runs = len(proof_runs(host))

    def switch(tokens_per_s: str, boot_id: str):
        run = deploy(host, runs, "deploy_sglang.yml", engine_profile="sandbox-tiny", **set_fabric(host, boot_id),
                     **proof_vars(host, tmp_path, NCCL_DEBUG="INFO", NCCL_SOCKET_IFNAME="lo",
                                  ENGINE_DOUBLE_TOKENS_PER_S=tokens_per_s))
        assert run.status == "successful", run.stdout[-3000:]
        return " ".join(run.stdout.split())

    first = switch("20", "boot-1")
    assert "boot id: " in first and "-> boot-1" in first and "interconnect PROVEN" in first, first[-3000:]
    assert len(proof_runs(host)) == proven_runs + 1
    same = switch("30", "boot-1")
    assert "not run again" in same and len(proof_runs(host)) == proven_runs + 1, same[-3000:]
    rebooted = switch("40", "boot-2")
    assert "changed: boot id: boot-1 -> boot-2" in rebooted and "interconnect PROVEN" in rebooted, rebooted[-3000:]
    assert len(proof_runs(host)) == proven_runs + 2 and host.health() == 200


def test_the_api_key_is_in_no_argv_unit_journal_or_runner_artifact_of_the_proof_deploys(host, runs):
    assert_api_key_nowhere(host, runs)
