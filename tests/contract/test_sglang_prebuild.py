"""The sglang role's JIT pre-build (roles/sglang/files/prebuild_kernels.py) against the pinned SGLang 0.5.23, on CPU.

The script resolves (--resolve: builds nothing) where SGLang's own code puts the speculative_sampling module for
compute capability 12.0 with the unit's environment: SGLang reads the target from the GPU (none here; the script
overrides it through SGLang's override_jit_cuda_arch) and derives the suffix from the nvcc in CUDA_HOME. With CUDA 13
that must be 12.0f, the target FLASHINFER_CUDA_ARCH_LIST names in the unit; with nvcc 12.8 SGLang resolves 12.0a and
the pre-build refuses instead of filling a directory the engine never reads (the 12.0a/12.0f trap, without a GPU).
nvcc is the TOOLCHAIN TEST DOUBLE (tests/doubles/toolchain_double.py), which answers --version only.

FlashInfer 0.7.2 (with tvm-ffi and nvidia-ml-py) comes from an overlay of its own (the lock's `contract_prebuild`,
tests/contract/sglang_resolve.py): its workspace for 12.0f is the one flashinfer.jit.env computes from the unit's
FLASHINFER_WORKSPACE_BASE and FLASHINFER_CUDA_ARCH_LIST. The sandbox's JIT PACKAGE TEST DOUBLES
(tests/doubles/jit_packages_double) mirror that naming; tests/gpu/prebuild_kernels_smoke.py builds and loads for real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from sglang_helpers import REPO_ROOT, contract_python
from sglang_resolve import prebuild_path

pytestmark = pytest.mark.contract

SCRIPT = REPO_ROOT / "roles" / "sglang" / "files" / "prebuild_kernels.py"
TOOLCHAIN_DOUBLE = REPO_ROOT / "tests" / "doubles" / "toolchain_double.py"
DEFAULTS = yaml.safe_load((REPO_ROOT / "roles" / "sglang" / "defaults" / "main.yml").read_text())
# torch.compiler.disable imports torch._dynamo, which needs a real triton (the contract venv has a stub): the
# decorator on load_jit is made a no-op, nothing else is touched.
RUN = """
import os, runpy, sys, torch, torch.compiler
torch.compiler.disable = lambda fn=None, *args, **kwargs: fn
sys.argv = [os.environ["PREBUILD_SCRIPT"], *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def resolve(tmp_path: Path, nvcc_release: str, *modules: str, path: tuple[Path, ...] = ()
            ) -> subprocess.CompletedProcess[str]:
    """The script's --resolve with the unit's JIT environment (roles/sglang), an nvcc of that release and the
    overlays in path first on the interpreter's path."""
    cuda_home = tmp_path / f"cuda-{nvcc_release}"
    (cuda_home / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(TOOLCHAIN_DOUBLE, cuda_home / "bin" / "nvcc")
    (cuda_home / "bin" / "nvcc").chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CUDA_HOME": str(cuda_home),
           "BWS_TOOLCHAIN_DOUBLE_NVCC_VERSION": nvcc_release, "PREBUILD_SCRIPT": str(SCRIPT),
           "FLASHINFER_CUDA_ARCH_LIST": "12.0f", "FLASHINFER_WORKSPACE_BASE": "/opt/sglang/envs/sglang-x/jit-cache",
           "SGLANG_JIT_CACHE_DIR": DEFAULTS["sglang_jit_cache_dir"]}
    if path:
        env["PYTHONPATH"] = os.pathsep.join(str(entry) for entry in path)
    argv = [str(contract_python()), "-c", RUN, "--arch", "12.0f", "--resolve"]
    argv += [f"--module={module}" for module in modules]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)


def test_sglang_puts_the_speculative_sampling_module_where_the_unit_looks_for_12_0_with_cuda_13(tmp_path):
    proc = resolve(tmp_path, "13.0", "sglang-speculative-sampling")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (module,) = json.loads(proc.stdout.splitlines()[-1])["modules"]
    assert module["path"] == f"{DEFAULTS['sglang_jit_cache_dir']}/sm120f/speculative_sampling"


def test_an_nvcc_older_than_12_9_resolves_12_0a_and_the_prebuild_refuses(tmp_path):
    proc = resolve(tmp_path, "12.8", "sglang-speculative-sampling")
    assert proc.returncode == 2, (proc.stdout, proc.stderr[-3000:])
    assert "SGLang resolves compute capability 12.0 to 12.0a" in proc.stderr
    assert proc.stdout == ""


def flashinfer_workspace(path: list[Path], base: str, arch_list: str) -> str:
    """Where FlashInfer's own flashinfer.jit.env puts its JIT workspace for that environment, asked in the venv."""
    code = ("import torch, torch.compiler\ntorch.compiler.disable = lambda fn=None, *a, **k: fn\n"
            "import flashinfer.jit.env as env\nprint(env.FLASHINFER_WORKSPACE_DIR)")
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "FLASHINFER_WORKSPACE_BASE": base,
           "FLASHINFER_CUDA_ARCH_LIST": arch_list, "PYTHONPATH": os.pathsep.join(str(entry) for entry in path)}
    proc = subprocess.run([str(contract_python()), "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_flashinfer_puts_its_workspace_where_the_unit_looks(tmp_path):
    path = prebuild_path()
    proc = resolve(tmp_path, "13.0", "flashinfer-sampling", path=tuple(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (module,) = json.loads(proc.stdout.splitlines()[-1])["modules"]
    base = "/opt/sglang/envs/sglang-x/jit-cache"
    # FlashInfer names the workspace after the target without its dot: 12.0f -> 120f; the pre-build's is that one.
    assert module["workspace"] == f"{base}/.cache/flashinfer/0.7.2/120f"
    assert module["workspace"] == flashinfer_workspace(path, base, "12.0f")
    assert module["path"] == f"{module['workspace']}/cached_ops/sampling"
    # The trap: a list naming 12.0a resolves another directory, which the engine (12.0f with CUDA 13) never reads.
    assert flashinfer_workspace(path, base, "12.0a") != module["workspace"]
