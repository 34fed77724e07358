"""Helpers for the GPU release tests: a PID-namespace re-exec, the GPU simulator, holders, ansible-runner.

Everything that signals processes runs inside ``unshare --pid --fork --mount-proc``: the decorated test
re-runs itself there, so the module under test can only see and reach processes the test started.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import playbook_run
from tests.doubles.nvidia_smi_double_config import fixture_gpus, sim_config
from tests.playbook_run import local_inventory

REPO = Path(__file__).resolve().parents[2]
DOUBLES = REPO / "tests" / "doubles"
RTX8 = REPO / "tests" / "fixtures" / "nvidia-smi" / "rtxpro6000-8gpu-constructed"
INSIDE = "BWS_GPU_TEST_IN_PIDNS"
# index -> device minor of the constructed 8-GPU host (proc-driver-nvidia/gpus/*/information): 2, 3, 0, 1, 6, 7, 4, 5
MINOR_OF_INDEX = [gpu["minor"] for gpu in fixture_gpus(RTX8)]


def in_new_pid_namespace(test, without: tuple[str, ...] = ()):
    """Run the test body in a new PID namespace (a fresh pytest process there); outside, assert it passed.
    `without`: capabilities dropped from the bounding set first (setpriv), so no process of the test has them."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        if os.environ.get(INSIDE) == "1":
            return test(*args, **kwargs)
        if os.geteuid() != 0 or shutil.which("unshare") is None or (without and shutil.which("setpriv") is None):
            pytest.skip("needs root, unshare(1) for a private PID namespace (and setpriv(1) to drop capabilities)")
        nodeid = f"{inspect.getfile(test)}::{test.__name__}"
        drop = ["setpriv", "--bounding-set=" + ",".join(f"-{cap}" for cap in without)] if without else []
        proc = subprocess.run(
            [
                *drop,
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
                nodeid,
            ],
            cwd=REPO,
            env={**os.environ, INSIDE: "1"},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        sys.stdout.write(proc.stdout[-4000:])
        assert proc.returncode == 0, f"in the PID namespace:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
        return None

    return wrapper


class Sim:
    """Stand-in device files, a driver /proc directory and an nvidia-smi double for an 8-GPU host."""

    def __init__(self, root: Path, mode: str = "ok") -> None:
        self.root = root
        self.dev = root / "dev"
        self.shm = root / "shm"
        self.dev.mkdir(parents=True)
        self.shm.mkdir()
        for name in [*(f"nvidia{m}" for m in range(8)), "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
            (self.dev / name).write_bytes(b"")
        self.gpus = fixture_gpus(RTX8)
        self.config = root / "sim.json"
        self.write_config(mode)
        self.nvidia_smi = root / "bin" / "nvidia-smi"
        self.nvidia_smi.parent.mkdir()
        self.nvidia_smi.write_text(
            f'#!/bin/sh\nexec "{sys.executable}" "{DOUBLES / "nvidia_smi_double.py"}" --config "{self.config}" "$@"\n'
        )
        self.nvidia_smi.chmod(0o755)
        self.children: list[subprocess.Popen] = []

    def write_config(self, mode: str) -> None:
        self.config.write_text(json.dumps(sim_config(RTX8, self.dev, mode, gpus=self.gpus)))

    def gpu_file(self, index: int) -> str:
        return str(self.dev / f"nvidia{MINOR_OF_INDEX[index]}")

    def compute_files(self, *indexes: int) -> list[str]:
        return [
            str(self.dev / "nvidiactl"),
            str(self.dev / "nvidia-uvm"),
            *(self.gpu_file(i) for i in indexes),
        ]

    def mem(self, **mib_by_index: int) -> dict[str, str]:
        spec = ",".join(f"{MINOR_OF_INDEX[int(i[1:])]}:{m}" for i, m in mib_by_index.items())
        return {"NVSIM_MEM_MIB": spec}

    def extravars(self, **more: Any) -> dict[str, Any]:
        return {
            "gpu_release_nvidia_smi": str(self.nvidia_smi),
            "gpu_release_driver_proc_dir": str(RTX8 / "proc-driver-nvidia"),
            "gpu_release_dev_dir": str(self.dev),
            "gpu_release_shm_dir": str(self.shm),
            # the test's engine processes run as root, the user this test runs as
            "gpu_release_service_users": ["root"],
            # nobody is at ansible-runner's terminal: teardown.yml refuses unless told ahead
            "teardown_confirm": "yes",
            **more,
        }

    def spawn(self, argv: list[str], spec: dict, env: dict[str, str] | None = None) -> list[int]:
        """Start the holder double with this argv; [pid] or [pid, child pid] once it holds everything."""
        return spawn_holder(argv, spec, env, self.children, self.root)

    def stop_all(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
            child.wait()


def start_holder(
    argv: list[str], spec: dict, env: dict[str, str] | None, keep: list[subprocess.Popen], root: Path
) -> subprocess.Popen:
    """Start the holder double with this argv (argv[0] may be a process title); see wait_ready()."""
    holder = DOUBLES / "gpu_holder_double.py"
    environment = {**os.environ, "HOLDER_SPEC": json.dumps(spec), **(env or {})}
    # With argv[0] set to a process title, Python cannot locate its own venv from argv[0]: hand it the
    # parent's site-packages (PyTorch lives there on GPU hosts).
    paths = [environment.get("PYTHONPATH", ""), *site.getsitepackages()]
    environment["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if len(argv) >= 3 and argv[1] == "-m":
        # ``python3 -m <module>``: a package of that name that runs the holder double.
        pkg = root / "pymods"
        mod = pkg.joinpath(*argv[2].split("."))
        mod.parent.mkdir(parents=True, exist_ok=True)
        for parent in [mod.parent, *mod.parent.parents]:
            if parent == pkg:
                break
            (parent / "__init__.py").touch()
        mod.with_suffix(".py").write_text(f"import runpy\nrunpy.run_path({str(holder)!r}, run_name='__main__')\n")
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pkg), environment.get("PYTHONPATH")]))
        args = argv
    else:
        args = [
            argv[0],
            "-c",
            f"import runpy; runpy.run_path({str(holder)!r}, run_name='__main__')",
            *argv[1:],
        ]
    proc = subprocess.Popen(args, executable=sys.executable, stdout=subprocess.PIPE, env=environment)
    keep.append(proc)
    return proc


def wait_ready(proc: subprocess.Popen) -> list[int]:
    """[pid] or [pid, child pid] once the holder holds everything it was told to."""
    line = proc.stdout.readline().decode()
    assert line.startswith("ready "), f"holder {proc.args[0]} did not start: {line!r}"
    return [int(x) for x in line.split()[1:]]


def spawn_holder(
    argv: list[str], spec: dict, env: dict[str, str] | None, keep: list[subprocess.Popen], root: Path
) -> list[int]:
    return wait_ready(start_holder(argv, spec, env, keep, root))


def alive(pid: int) -> bool:
    """Exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def run_playbook(tmp: Path, extravars: dict[str, Any], check: bool = False, playbook: str = "playbooks/teardown.yml"):
    """Run a playbook on localhost (local connection, tests/playbook_run.py); returns (run, first result by task)."""
    inventory = local_inventory(tmp / f"inventory-{len(list(tmp.glob('inventory-*')))}.json")
    run = playbook_run.run_playbook(playbook, inventory, extravars=extravars, check=check, workdir=tmp)
    return run, run.first_results()


def changed_count(run: playbook_run.PlaybookRun) -> int:
    return sum((run.stats or {}).get("changed", {}).values())


def release_result(results: dict[str, Any]) -> dict[str, Any]:
    return results["Signal engine processes, wait for the GPUs, clean /dev/shm"]
