"""Shared pieces of the model store tests: a tiny generated model repository, the mirror double, and a
runner for playbooks/fetch_models.yml against localhost with a throw-away inventory."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.playbook_run import PlaybookRun, run_playbook

REPO_ROOT = Path(__file__).resolve().parents[2]
DOUBLE = REPO_ROOT / "tests" / "doubles" / "model_mirror_double.py"
PLAYBOOK = REPO_ROOT / "playbooks" / "fetch_models.yml"
# The model store's tools venv (huggingface_hub from roles/model_store/files/hf-client.lock): the role builds
# it on first use and keeps it, like any host would.
TOOLS_VENV = Path.home() / ".cache" / "blackwell-serving" / "model-store-tools"


def safetensors_bytes(tensors: dict[str, int], seed: int) -> bytes:
    """A real safetensors file: u64 header length, JSON header with data_offsets, then the data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, count in tensors.items():
        header[name] = {"dtype": "F32", "shape": [count], "data_offsets": [offset, offset + 4 * count]}
        offset += 4 * count
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    data = random.Random(seed).randbytes(offset)
    return struct.pack("<Q", len(raw)) + raw + data


def make_tiny_model(root: Path, shards: int = 3, floats_per_tensor: int = 6000, seed: int = 1) -> Path:
    """Write a tiny sharded model (config, tokenizer, index, shards in safetensors format) under root."""
    root.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for number in range(1, shards + 1):
        name = f"model-{number:05d}-of-{shards:05d}.safetensors"
        tensors = {f"layers.{number}.w{i}": floats_per_tensor + i for i in range(2)}
        (root / name).write_bytes(safetensors_bytes(tensors, seed * 100 + number))
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(4 * count for count in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (root / "config.json").write_text(json.dumps({"architectures": ["TinyForCausalLM"], "hidden_size": 8}))
    (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    return root


def tree_bytes(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file() and ".model_store" not in path.parts)


@dataclass
class Mirror:
    """A running mirror double."""

    process: subprocess.Popen
    url: str
    log: Path

    def requests(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@contextmanager
def mirror_double(root: Path, log: Path, *args: str) -> Iterator[Mirror]:
    process = subprocess.Popen(
        [sys.executable, str(DOUBLE), "--root", str(root), "--log", str(log), *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline() if process.stdout else ""
        if not line.startswith("listening on "):
            raise RuntimeError(f"the mirror double did not start: {line!r}")
        yield Mirror(process, "http://" + line.split()[-1], log)
    finally:
        process.terminate()
        process.wait(timeout=10)


@dataclass
class WrappedRun:
    """A run of ansible-playbook under a wrapper program (a private mount namespace): exit status and output."""

    rc: int
    stdout: str


def run_fetch_playbook(
    workdir: Path,
    profiles: dict,
    extra_vars: dict | None = None,
    wrap: list[str] | None = None,
    check: bool = False,
    *,
    tree: Path = REPO_ROOT,
) -> PlaybookRun | WrappedRun:
    """Run playbooks/fetch_models.yml on localhost with a temporary inventory holding profiles.

    Through tests/playbook_run.py; with ``wrap`` (a program that sets up a private mount namespace and then runs
    the rest of its arguments) ansible-playbook runs directly under it and only its exit status and output return.

    `tree`: the checkout whose playbook, roles and ansible.cfg run (another one for before/after benchmarks).
    """
    inventory = workdir / "inventory.yml"
    # Every profile passes the one profile schema (roles/input_check), which also asks for the serving keys.
    serving = {"tensor_parallel_size": 1, "port": 30000}
    group_vars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "engine_profiles": {name: {"served_model_name": name, **serving, **p} for name, p in profiles.items()},
        "model_store_reserve_bytes": 0,
        "model_store_retry_delay_s": 0.0,
        "model_store_install_tools": False,
        "model_store_batch_bytes": 40000,  # each tiny shard on its own output line
        "model_store_tools_venv": str(TOOLS_VENV),
        "model_store_hf_xet": False,  # Xet storage cannot be reached from the tests
        "model_store_hf_workers": 4,
        "model_store_http_piece_mib": 1,  # ranges of 1 MiB so that small test files move in parallel ranges
        **(extra_vars or {}),
    }
    inventory.write_text(
        yaml.safe_dump({"all": {"children": {"gpu_servers": {"hosts": {"localhost": None}, "vars": group_vars}}}})
    )
    envvars = {"ANSIBLE_CONFIG": str(tree / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(workdir / "ansible-tmp")}
    playbook = tree / PLAYBOOK.relative_to(REPO_ROOT)
    if not wrap:
        return run_playbook(playbook, inventory, check=check, diff=check, project_dir=tree, envvars=envvars,
                            workdir=workdir, timeout=180)
    command = ["ansible-playbook", "-i", str(inventory), str(playbook), *(["--check", "--diff"] if check else [])]
    result = subprocess.run([*wrap, *command], cwd=tree, env={**os.environ, "ANSIBLE_NOCOLOR": "1", **envvars},
                            capture_output=True, text=True, timeout=180, check=False)
    return WrappedRun(result.returncode, result.stdout + result.stderr)


def hf_profile(name: str, dest: Path, repo: str, endpoint: str, drafter: dict | None = None) -> dict:
    return {
        name: {
            "model": {
                "path": str(dest),
                "source": {"type": "hf", "repo": repo, "revision": "main", "endpoint": endpoint},
            },
            "drafter": drafter,
        }
    }


@contextmanager
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="model-store-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
