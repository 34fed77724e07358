"""Helpers for the real-GPU test and benchmark: CUDA holders, nvidia-smi snapshots, preconditions.

A ``Backend`` hides where the GPU comes from. ``RealGpu`` uses ``nvidia-smi`` and ``/dev/nvidia*`` and makes
holders allocate memory with PyTorch. ``SimGpu`` (``BWS_GPU_DRYRUN=1``) runs the same scripts on a machine
without a GPU, over the nvidia-smi test double, so the scripts themselves can be rehearsed; its numbers are
not GPU results and are labelled ``"backend": "simulated"``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO))  # the tests package, also when this runs as a script
from tests.module_utils_loader import use_repository_module_utils  # noqa: E402

use_repository_module_utils()

from ansible_collections.blackwell.serving.plugins.module_utils.nvidia import smi as nv  # noqa: E402
from gpu_helpers import (  # noqa: E402
    INSIDE,
    Sim,
    alive,
    changed_count,
    in_new_pid_namespace,
    release_result,
    run_playbook,
    start_holder,
    wait_ready,
)

DRYRUN = os.environ.get("BWS_GPU_DRYRUN") == "1"


def gpu_unavailable_reason() -> str | None:
    """Why this host cannot run the real-GPU scripts (None when it can)."""
    if DRYRUN:
        return None
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found"
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    if probe.returncode != 0:
        return f"PyTorch cannot use CUDA here: {probe.stderr.strip()[-300:]}"
    return None


class Backend:
    name = "real"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.shm = root / "shm"
        self.shm.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        self.nvidia_smi = shutil.which("nvidia-smi") or "nvidia-smi"
        self.dev_dir = Path("/dev")

    def compute(self, mib: int) -> tuple[dict, dict]:
        return {"cuda_mib": mib}, {}

    def nvml(self) -> tuple[dict, dict]:
        return {"nvml": True}, {}

    def extravars(self, **more: Any) -> dict[str, Any]:
        # the holders run as root here: root stands for the engines' service user
        # teardown_confirm: nobody is at ansible-runner's terminal, and teardown.yml refuses unless told ahead
        return {"gpu_release_shm_dir": str(self.shm), "gpu_release_service_users": ["root"], "teardown_confirm": "yes",
                **more}

    def snapshot(self) -> dict[str, Any]:
        gpus, apps = nv.query(self.nvidia_smi)
        return {"time": time.time(), "gpus": gpus, "apps": apps}

    def start(self, holders: dict[str, tuple[list[str], dict, dict]]) -> dict[str, list[int]]:
        """Start holders in parallel (CUDA start-up is slow), then wait until each holds what it should."""
        started = {
            name: start_holder(argv, spec, env, self.procs, self.root) for name, (argv, spec, env) in holders.items()
        }
        return {name: wait_ready(proc) for name, proc in started.items()}

    def start_bystanders(self, foreign_mib: int = 256) -> list[int]:
        """An NVML-only monitor and a foreign CUDA process, which no release may signal: [monitor, foreign]."""
        started = self.start(
            {
                "monitor": (["python3", "gpu_monitor.py"], *self.nvml()),
                "foreign": (["python3", "train.py"], *self.compute(foreign_mib)),
            }
        )
        return [started["monitor"][0], started["foreign"][0]]

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def reap(self) -> None:
        """Collect exit statuses of holders that ended (they are our children: zombies until reaped)."""
        for proc in self.procs:
            proc.poll()


class SimGpu(Backend):
    name = "simulated"

    def __init__(self, root: Path) -> None:
        self.sim = Sim(root / "sim")
        super().__init__(root)
        self.nvidia_smi = str(self.sim.nvidia_smi)
        self.dev_dir = self.sim.dev

    def compute(self, mib: int) -> tuple[dict, dict]:
        return {"open": self.sim.compute_files(0)}, self.sim.mem(g0=mib)

    def nvml(self) -> tuple[dict, dict]:
        return {"open": [str(self.sim.dev / "nvidiactl"), self.sim.gpu_file(0)]}, {}

    def extravars(self, **more: Any) -> dict[str, Any]:
        return self.sim.extravars(gpu_release_shm_dir=str(self.shm), **more)


def backend(root: Path) -> Backend:
    return SimGpu(root) if DRYRUN else Backend(root)


def device_files(pid: int) -> list[str]:
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return []
    return sorted({link for link in links if "/nvidia" in link})


def fuser_sees(pid: int, dev_dir: Path) -> bool | None:
    """Whether ``fuser <dev_dir>/nvidia*`` lists the PID (None when fuser is not installed)."""
    if shutil.which("fuser") is None:
        return None
    files = [str(p) for p in dev_dir.glob("nvidia*") if not p.is_dir()]
    out = subprocess.run(["fuser", *files], capture_output=True, text=True, check=False)
    return str(pid) in out.stdout.split()


def pid_mapping(apps: list[dict[str, Any]], cuda_pids: list[int]) -> str:
    """How nvidia-smi names the PIDs of processes in this PID namespace."""
    listed = {a["pid"] for a in apps}
    if set(cuda_pids) <= listed:
        return "same PID namespace (listed by their PIDs here)"
    if len(apps) >= len(cuda_pids):
        return "listed under PIDs of another namespace"
    return "not listed"


def check_preconditions(
    be: Backend, baseline: dict, before: dict, cuda: dict[str, tuple[list[int], int]], nvml_pids: list[int]
) -> dict[str, Any]:
    """Memory visible per holder (or in total when PIDs are not ours), NVML bystanders seen as holders."""
    checks: dict[str, Any] = {}
    apps = before["apps"]
    all_cuda = [pid for pids, _ in cuda.values() for pid in pids]
    checks["pid_mapping"] = pid_mapping(apps, all_cuda)
    by_pid = {a["pid"]: a["used_mib"] or 0 for a in apps}
    per_holder = {}
    for name, (pids, mib) in cuda.items():
        for pid in pids:
            files = device_files(pid)
            assert any(f.endswith("nvidia-uvm") for f in files), f"{name} {pid} has no nvidia-uvm open: {files}"
            per_holder[f"{name}:{pid}"] = {
                "device_files": files,
                "nvidia_smi_mib": by_pid.get(pid),
                "allocated": mib,
            }
            if checks["pid_mapping"].startswith("same"):
                assert by_pid[pid] >= mib, f"{name} {pid}: nvidia-smi shows {by_pid[pid]} MiB < {mib} MiB"
    want = sum(mib * len(pids) for pids, mib in cuda.values())
    grew = before["gpus"][0]["memory_used_mib"] - baseline["gpus"][0]["memory_used_mib"]
    assert grew >= want, f"memory.used grew by {grew} MiB, holders allocated {want} MiB"
    if not checks["pid_mapping"].startswith("same"):
        assert len(apps) >= len(all_cuda), f"nvidia-smi lists {len(apps)} apps for {len(all_cuda)} CUDA holders"
    checks["per_holder"] = per_holder
    checks["memory_grew_mib"] = grew
    for pid in nvml_pids:
        files = device_files(pid)
        assert files, f"NVML bystander {pid} holds no device file"
        assert pid not in by_pid, f"NVML bystander {pid} is listed as a compute app"
        seen = fuser_sees(pid, be.dev_dir)
        assert seen is not False, f"fuser does not list NVML bystander {pid}"
        checks[f"nvml_bystander:{pid}"] = {
            "device_files": files,
            "holds_nvidia_uvm": any(f.endswith("nvidia-uvm") for f in files),
            "fuser_lists_it": seen,
        }
    return checks


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


def results_dir(default: Path) -> Path:
    return Path(os.environ.get("BWS_GPU_RESULTS_DIR") or default)


__all__ = [
    "INSIDE",
    "Backend",
    "alive",
    "backend",
    "changed_count",
    "check_preconditions",
    "gpu_unavailable_reason",
    "in_new_pid_namespace",
    "release_result",
    "results_dir",
    "run_playbook",
    "write_json",
]
