"""Shared by the engine lifecycle scenarios (test_engine_lifecycle.py, test_engine_faults*.py): the test
inventory, a booted host per scenario file, deploys and the checks the files share. Each scenario file has
a host of its own, so that they run side by side (pytest-xdist, one file per worker)."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.engine_host import REPO, EngineHost, podman_available

# Every scenario file's pytestmark: they boot systemd hosts.
CONTAINER_MARKS = [
    pytest.mark.container,
    pytest.mark.skipif(not podman_available(), reason="needs podman and the test-host image (scripts/build-image.sh)"),
]
API_KEY = "k3y-%s3cr3t$HOME-\"q'"  # quotes, % and $ must survive every layer unexpanded
SANDBOX_PROFILES = yaml.safe_load((REPO / "inventory/sandbox/group_vars/all/models.yml").read_text())

# A small benchmark, so verify.yml and site.yml run with nothing on the command line in seconds.
SMALL_VERIFY = {"verify_concurrency": [1], "verify_gate_concurrency": [1], "verify_bench_input_len": 16,
                "verify_bench_output_len": 32, "verify_bench_min_prompts": 4, "verify_bench_prompts_per_concurrency": 2,
                "verify_bench_warmup_requests": 0,
                # No run without speculation was verified on these hosts: passing without a baseline is chosen here.
                "verify_allow_missing_baseline": True}


def build_profiles() -> dict:
    profiles = copy.deepcopy(SANDBOX_PROFILES["engine_profiles"])
    missing = copy.deepcopy(profiles["sandbox-tiny-eagle3"])
    missing["model"]["path"] = "/srv/models/sandbox/not-downloaded"
    stranger_port = copy.deepcopy(profiles["sandbox-tiny"])
    stranger_port["port"] = 31000
    pcie_ipc = {**copy.deepcopy(profiles["sandbox-tiny"]), "sglang_pcie_ipc_allreduce": True}
    pcie_ipc_tp1 = copy.deepcopy(pcie_ipc)
    pcie_ipc["tensor_parallel_size"] = 2
    # Layouts beyond tensor parallelism (docs/layouts.md): their GPUs are tensor x data, on 8 simulated GPUs.
    expert = {**copy.deepcopy(profiles["sandbox-tiny"]), "tensor_parallel_size": 2, "expert_parallel_size": 2,
              "attention_data_parallel_size": 2}
    replicas = {**copy.deepcopy(profiles["sandbox-tiny"]), "tensor_parallel_size": 2, "data_parallel_size": 2,
                "expert_parallel_size": 4}
    too_wide = {**copy.deepcopy(profiles["sandbox-tiny"]), "tensor_parallel_size": 4, "data_parallel_size": 4}
    profiles.update({"sandbox-missing-model": missing, "sandbox-port-31000": stranger_port,
                     "sandbox-pcie-ipc-tp2": pcie_ipc, "sandbox-pcie-ipc-tp1": pcie_ipc_tp1,
                     "sandbox-attn2-ep2": expert, "sandbox-dp2-ep4": replicas, "sandbox-tp4-dp4": too_wide})
    return profiles


def inventory_vars(host: EngineHost, **more) -> dict:
    return {"engine_profiles": build_profiles(), "sglang_api_key": API_KEY, "vllm_api_key": API_KEY,
            **SMALL_VERIFY, "verify_report_dir": str(host.workdir / "reports"), **more}


def booted_engine_host(name: str, workdir: Path) -> Iterator[EngineHost]:
    """A prepared sandbox-image host named `name` (a module fixture's body); destroyed afterwards."""
    engine_host = EngineHost(name, workdir)
    engine_host.write_inventory(inventory_vars(engine_host))
    engine_host.boot_prepared()
    yield engine_host
    engine_host.destroy()


# How a failed deploy's rollback ended (roles/engine_service/tasks/rollback.yml): the play's last message.
ROLLBACK_VERDICT = re.compile(r"(Rolled back: \S+ is serving again \([^)]*\))|(Rolling back to \S+ ALSO failed at .*?"
                              r"Nothing serves on this host now\.)|(There is no previous release on this host to roll "
                              r"back to; \S+ is stopped\.)")


def play_failure(stdout: str, chars: int = 4000) -> str:
    """A failed play's output for an assertion message: from its first failed task on (ansible's `fatal:` or
    `failed:` line), else its end; a play's closing task-time table would otherwise push the failure out of a tail."""
    found = re.search(r"^(fatal|failed): \[", stdout, flags=re.MULTILINE)
    return stdout[found.start():found.start() + chars] if found else stdout[-chars:]

def assert_rolled_back(flat: str, release: str) -> None:
    """The failed deploy's rollback left `release` serving; where it did not, the failure leads with the rollback's own
    verdict (why it failed too), which a log kept only from its end would otherwise lose in the play's output."""
    if f"Rolled back: {release} is serving again" in flat:
        return
    verdicts = [match.group(0) for match in ROLLBACK_VERDICT.finditer(flat)]
    raise AssertionError(f"the rollback did not leave {release} serving: "
                         f"{verdicts[-1] if verdicts else 'the play printed no rollback verdict'} ... {flat[-3000:]}")


def deploy(host: EngineHost, runs: list, playbook: str, **extravars):
    run = host.run_playbook(f"playbooks/{playbook}", extravars=extravars)
    runs.append(run)
    return run


def interrupted_deploy(host: EngineHost, playbook: str, extravars: dict, interrupt_when,
                       interrupt: Callable[[], object] | None = None) -> None:
    """Run a deploy and, once interrupt_when() holds, call interrupt() (a power cut, say) and kill its controller
    (SIGKILL, as a lost terminal or CI runner). The controller is frozen (SIGSTOP) before interrupt(): a controller
    left running through a fast test-host restart would reach the rebooted host and act on it (its rescue rolling
    back, say), which a real power cut's minutes-long boot never lets it do. The controller starts a session of its
    own and both signals go to that session's process group only, so they reach nothing this test did not start.
    (Not a private PID namespace: podman judges whether a container's conmon lives by its host PID, which a PID
    namespace would hide.)"""
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
            time.sleep(0.3)
        if interrupt is not None:
            os.killpg(controller.pid, signal.SIGSTOP)
            interrupt()
    finally:
        if controller.poll() is None:
            os.killpg(controller.pid, signal.SIGKILL)
        controller.wait()


def main_pid(host: EngineHost, unit: str = "sglang.service") -> str:
    return host.unit(unit)["MainPID"]


def release(host: EngineHost, release_id: str) -> dict:
    return json.loads(host.sh(f"cat /var/lib/llm-serving/releases/{release_id}/release.json"))


ENGINE_UNITS = ("sglang.service", "vllm.service")
BOOT_UNIT = "llm-serving-boot.service"


def what_boots(host: EngineHost) -> dict:
    """What a reboot of the host would start: the boot unit's choice (its own program, --dry-run), whether the boot
    unit is enabled, and every engine unit enabled besides (a second thing that would start at boot)."""
    units = " ".join(f"--unit {unit}" for unit in ENGINE_UNITS)
    choice = json.loads(host.sh(f"/usr/bin/python3 -I /usr/local/libexec/llm-serving/engine_boot.py --dry-run {units}"))
    each = 'do echo "$u=$(systemctl show -p UnitFileState --value "$u")"; done'
    shown = host.sh(f"for u in {' '.join(ENGINE_UNITS)} {BOOT_UNIT}; {each}")
    states = dict(line.split("=", 1) for line in shown.splitlines())
    return {**choice, "boot_unit_enabled": states[BOOT_UNIT] == "enabled",
            "engine_units_enabled": [u for u in ENGINE_UNITS if states[u] in ("enabled", "enabled-runtime")]}


def assert_boots(host: EngineHost, unit: str, release_id: str | None = None) -> None:
    """A reboot starts exactly `unit` (of `release_id`, where given): the boot unit's choice, nothing else enabled."""
    boots = what_boots(host)
    assert boots["boot_unit_enabled"] and boots["engine_units_enabled"] == [], boots
    assert boots["unit"] == unit, boots
    assert release_id is None or boots["release"] == release_id, boots


def assert_api_key_nowhere(host: EngineHost, runs: list) -> None:
    """The API key is in no process argument, unit file, journal line or runner artifact of `runs`."""
    assert API_KEY not in host.sh("ps -eo args")
    assert API_KEY not in host.sh("cat /etc/systemd/system/*.service")
    assert API_KEY not in host.sh("journalctl --no-pager -o cat")
    for run in runs:
        for artifact in Path(run.artifact_dir).rglob("*"):
            if artifact.is_file():
                assert API_KEY not in artifact.read_text(errors="replace"), artifact


GPU_DOUBLE = "/tmp/bws-gpu-double"  # the NVIDIA-SMI TEST DOUBLE and stand-in device files on the test host


def install_gpu_double(host: EngineHost, tmp_path: Path, root: str = GPU_DOUBLE) -> dict:
    """The 8-GPU simulator on the host (stand-in /dev/nvidia*, driver /proc fixture) under `root`, installed as the
    sandbox set-up installs it (tests/doubles/nvidia_smi_double_config.py's bundle); gpu_release vars."""
    from tests.doubles.nvidia_smi_double_config import bundle
    from tests.integration.gpu_helpers import DOUBLES, RTX8

    (tmp_path / "gpu-double-bundle.json").write_text(json.dumps(bundle(RTX8, root)))
    host.sh(f"rm -rf {root}")
    with (tmp_path / "gpu-double-bundle.json").open() as stdin:
        subprocess.run(["podman", "exec", "-i", host.name, "python3", "-c",
                        (DOUBLES / "nvidia_smi_double_config.py").read_text(), "--install"],
                       stdin=stdin, capture_output=True, check=True)
    return {
        "gpu_release_nvidia_smi": f"{root}/nvidia-smi",
        "gpu_release_driver_proc_dir": f"{root}/proc-driver-nvidia",
        "gpu_release_dev_dir": f"{root}/dev",
    }
