"""The interconnect proof script (roles/engine_service/files/interconnect_proof.py) on localhost with gloo.

The ranks are real processes running torch.distributed (CPU torch of the SGLang contract venv), spawned by the
script itself. The script kills ranks that miss its deadline, so every run happens in new PID and mount
namespaces (unshare, private /dev/shm): it can reach only processes the test started. The script is copied
with plugins/module_utils/host/pcie.py beside it, as a deploy ships it.

Shown here: a healthy proof passes with right sums and reports uid, the NCCL/CUDA/SGLANG environment (no secret)
and SGLang's in-process NCCL settings as each rank set them, and reports the bfloat16, CUDA-graph and peer-write
steps skipped with the reason (gloo runs on the CPU; the GPU run is tests/gpu/interconnect_proof_smoke.py);
vLLM's FlashInfer PCIe IPC switch is a peer-to-peer all-reduce of its own; a rank made to hang fails the proof
within timeout + 10 %, naming the rank and its step, with the IOMMU/ACS
diagnostics and the README fix; MIG on one of the profile's GPUs (nvidia-smi double) refuses before any rank
starts; a hung nvidia-smi ends at its timeout with a message.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sglang_helpers import REPO_ROOT, contract_python, unavailable
from torch_shm_helpers import private_namespace_argv, private_namespace_unavailable

pytestmark = pytest.mark.contract

SCRIPT = REPO_ROOT / "roles" / "engine_service" / "files" / "interconnect_proof.py"
PCIE = REPO_ROOT / "plugins" / "module_utils" / "host" / "pcie.py"
DOUBLE = REPO_ROOT / "tests" / "doubles" / "nvidia_smi_double.py"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The script and its parser in one directory, as the deploy puts them on the host."""
    directory = tmp_path_factory.mktemp("libexec")
    shutil.copy(SCRIPT, directory / SCRIPT.name)
    shutil.copy(PCIE, directory / PCIE.name)
    return directory / SCRIPT.name


def run_proof(script: Path, *args: str, python: str | None = None, env: dict[str, str] | None = None,
              timeout: float = 180) -> tuple[subprocess.CompletedProcess[str], float]:
    reason = private_namespace_unavailable()
    if reason:
        unavailable(f"the proof tests need a private PID namespace: {reason}")
    argv = private_namespace_argv([python or str(contract_python()), str(script), *args])
    full_env = {**os.environ, "NCCL_DEBUG": "WARN", "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=timeout, check=False)
    return proc, time.monotonic() - start


def nvidia_smi_double(tmp_path: Path, mig: list[str]) -> Path:
    gpus = [{"index": i, "minor": i, "uuid": f"GPU-{i:08d}-0000-0000-0000-000000000000",
             "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "pci_bus_id": f"00000000:{i + 3:02X}:00.0",
             "memory_total_mib": 97887, "mig_mode": mode} for i, mode in enumerate(mig)]
    (tmp_path / "dev").mkdir()
    config = tmp_path / "sim.json"
    config.write_text(json.dumps({"dev_dir": str(tmp_path / "dev"), "driver_version": "580.95.05",
                                  "default_app_mib": 0, "mode": "ok", "gpus": gpus}))
    wrapper = tmp_path / "nvidia-smi"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {DOUBLE} --config {config} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_healthy_proof_passes_with_right_sums_and_reports_who_ran_it(shipped: Path):
    proc, _ = run_proof(shipped, "--world-size", "3", "--backend", "gloo", "--sizes-mib", "1,4",
                        "--timeout-s", "90", "--skip-mig-check", "--engine", "sglang", "--engine-model",
                        str(REPO_ROOT / "roles" / "sglang" / "files" / "interconnect_engine.py"),
                        "--env-prefixes", "SGLANG_,VLLM_",
                        env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1", "NCCL_NVLS_ENABLE": "1",
                             "VLLM_API_KEY": "s3cr3t"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["unfinished_ranks"] == [] and report["timed_out"] is False
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2]
    for rank in report["ranks"]:
        assert rank["finished"] and rank["step"] == "finished" and rank["returncode"] == 0
        assert [(r["mib"], r["wrong_elements"]) for r in rank["results"]] == [(1.0, 0), (4.0, 0)]
        # SGLang's settings, set in the rank before torch: NVLS kept as the unit set it, the others added; with three
        # ranks and CUDA graphs on, graph buffer registration off (srt/arg_groups/parallel_hook.py).
        assert rank["engine_environment"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "8", "NCCL_CUMEM_ENABLE": "0",
                                              "NCCL_GRAPH_REGISTER": "0"}
        assert [(s["step"], s["status"]) for s in rank["steps"]] == [
            ("bf16 small messages", "skipped"), ("cuda graph all_reduce", "skipped"),
            ("ipc peer-write all_reduce", "skipped")]
        assert all(s["reason"] == "skipped: needs the nccl backend on CUDA GPUs (gloo runs on the CPU)"
                   for s in rank["steps"])
    assert report["engine_environment"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "8", "NCCL_CUMEM_ENABLE": "0",
                                            "NCCL_GRAPH_REGISTER": "0"}
    assert report["peer_to_peer_all_reduce"] == "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE (FlashInfer PCIe IPC all-reduce)"
    assert report["environment"]["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    assert "VLLM_API_KEY" not in report["environment"] and "s3cr3t" not in proc.stdout
    assert report["uid"] == os.getuid()
    assert report["environment"]["NCCL_DEBUG"] == "WARN"
    assert report["environment"]["CUDA_VISIBLE_DEVICES"] == ""
    assert len(report["environment_hash"]) == 16
    assert "interconnect proof PASSED: all_reduce over 3 ranks (gloo)" in proc.stderr


def test_vllms_pcie_ipc_switch_is_a_peer_to_peer_all_reduce_without_the_custom_one(shipped: Path):
    """VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1 in the unit turns on vLLM's FlashInfer PCIe IPC all-reduce whatever
    --disable-custom-all-reduce says (no --custom-all-reduce here): the proof names it, keys it, and plans its
    peer-write step for it (on GPUs; gloo skips it, tests/unit/plugins/modules/test_interconnect_proof_module.py
    shows the plan with nccl)."""
    proc, _ = run_proof(shipped, "--world-size", "2", "--backend", "gloo", "--sizes-mib", "1", "--timeout-s", "90",
                        "--skip-mig-check", "--engine", "vllm", "--engine-model",
                        str(REPO_ROOT / "roles" / "vllm" / "files" / "interconnect_engine.py"),
                        "--env-prefixes", "VLLM_", env={"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["custom_all_reduce"] is False and report["engine_environment"] == {}
    switch = "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC"
    assert report["peer_to_peer_all_reduce"] == f"{switch} (FlashInfer PCIe IPC all-reduce)"
    assert report["environment"]["VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC"] == "1"


def test_hung_rank_times_out_is_killed_and_named(shipped: Path):
    timeout_s = 20.0  # room for three torch imports on a busy two-core machine before rank 2 hangs
    proc, _ = run_proof(shipped, "--world-size", "3", "--backend", "gloo", "--sizes-mib", "1",
                        "--timeout-s", str(timeout_s), "--skip-mig-check",
                        env={"BWS_PROOF_TEST_HANG_RANK": "2"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] is False and report["timed_out"] is True
    assert 2 in report["unfinished_ranks"]
    hung = report["ranks"][2]
    assert hung["step"] == "hanging (test hook)" and hung["killed"] is True
    # The others never finished: they waited for it (in the collective, or still joining on a busy machine).
    assert all(not r["finished"] for r in report["ranks"][:2])
    assert "rank 2: hanging (test hook) (killed)" in report["reason"]
    assert f"did not finish within {timeout_s:g} s" in report["reason"]
    pcie = report["diagnostics"]["pcie"]
    assert pcie["iommu"]["mode"] in ("off", "passthrough", "translated")
    assert "Interconnect: IOMMU and ACS" in pcie["fix"]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("interconnect proof FAILED (gloo, 3 ranks): rank(s) ")
    assert "IOMMU mode: " in line and "ACS redirection on: " in line
    assert "fix: docs/provisioning.md, section 'Interconnect: IOMMU and ACS'" in line


def test_mig_on_a_profile_gpu_refuses_before_any_rank_starts(shipped: Path, tmp_path: Path):
    smi = nvidia_smi_double(tmp_path, ["Disabled", "Enabled", "Disabled"])
    proc, _ = run_proof(shipped, "--world-size", "2", "--backend", "gloo", "--gpus", "0,1",
                        "--nvidia-smi", str(smi), python=sys.executable)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["mig"] == {"checked": True, "enabled": ["1"], "error": None}
    assert "MIG is on for GPU(s) 1" in report["reason"] and "ranks" not in report
    assert "nvidia-smi -i <index> -mig 0" in proc.stderr


def test_mig_check_takes_gpus_named_by_uuid(shipped: Path, tmp_path: Path):
    smi = nvidia_smi_double(tmp_path, ["Disabled", "Disabled", "Enabled"])
    proc, _ = run_proof(shipped, "--world-size", "1", "--backend", "gloo", "--nvidia-smi", str(smi),
                        python=sys.executable, env={"CUDA_VISIBLE_DEVICES": "GPU-00000002-0000-0000-0000-000000000000"})
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads(proc.stdout)["mig"]["enabled"] == ["2"]


def test_mig_on_a_gpu_outside_the_profile_is_not_a_reason_to_refuse(shipped: Path, tmp_path: Path):
    smi = nvidia_smi_double(tmp_path, ["Disabled", "Disabled", "Enabled"])
    proc, _ = run_proof(shipped, "--world-size", "1", "--backend", "gloo", "--gpus", "0,1", "--sizes-mib", "1",
                        "--nvidia-smi", str(smi))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["mig"] == {"checked": True, "enabled": [], "error": None}


def test_hung_nvidia_smi_ends_at_its_timeout_with_a_message(shipped: Path, tmp_path: Path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexec sleep 60\n")
    smi.chmod(0o755)
    proc, _ = run_proof(shipped, "--world-size", "2", "--backend", "nccl", "--nvidia-smi", str(smi),
                        "--tool-timeout-s", "1", python=sys.executable)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["reason"] == "cannot tell whether MIG is off: did not finish within 1 s (timeout)"
