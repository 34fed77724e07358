"""The sglang role's JIT pre-build (roles/sglang/files/prebuild_kernels.py) against the pinned SGLang 0.5.23, on CPU.

The script resolves (--resolve: builds nothing) where SGLang's own code puts the speculative_sampling module for
compute capability 12.0 with the unit's environment: SGLang reads the target from the GPU (none here; the script
overrides it through SGLang's override_jit_cuda_arch) and derives the suffix from the nvcc in CUDA_HOME. With CUDA 13
that must be 12.0f, the target FLASHINFER_CUDA_ARCH_LIST names in the unit; with nvcc 12.8 SGLang resolves 12.0a and
the pre-build refuses instead of filling a directory the engine never reads (the 12.0a/12.0f trap, without a GPU).
nvcc is the TOOLCHAIN TEST DOUBLE (tests/doubles/toolchain_double.py), which answers --version only.

FlashInfer is not in the contract venv (its wheel and tvm-ffi are not part of the SGLang contract recipe): its
workspace is checked when the venv has it, else that test skips saying so; the sandbox's JIT PACKAGE TEST DOUBLES
(tests/doubles/jit_packages_double) mirror its naming, and tests/gpu/prebuild_kernels_smoke.py checks it for real.
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


def resolve(tmp_path: Path, nvcc_release: str, *modules: str) -> subprocess.CompletedProcess[str]:
    """The script's --resolve with the unit's JIT environment (roles/sglang) and an nvcc of that release."""
    cuda_home = tmp_path / f"cuda-{nvcc_release}"
    (cuda_home / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(TOOLCHAIN_DOUBLE, cuda_home / "bin" / "nvcc")
    (cuda_home / "bin" / "nvcc").chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CUDA_HOME": str(cuda_home),
           "BWS_TOOLCHAIN_DOUBLE_NVCC_VERSION": nvcc_release, "PREBUILD_SCRIPT": str(SCRIPT),
           "FLASHINFER_CUDA_ARCH_LIST": "12.0f", "FLASHINFER_WORKSPACE_BASE": "/opt/sglang/envs/sglang-x/jit-cache",
           "SGLANG_JIT_CACHE_DIR": DEFAULTS["sglang_jit_cache_dir"]}
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


def test_flashinfer_puts_its_workspace_where_the_unit_looks(tmp_path):
    probe = "import importlib.util as u; print(bool(u.find_spec('flashinfer')))"
    has = subprocess.run([str(contract_python()), "-c", probe], capture_output=True, text=True, check=True).stdout
    if has.strip() != "True":
        pytest.skip("flashinfer-python is not in the SGLang contract venv: tests/gpu/prebuild_kernels_smoke.py checks "
                    "its workspace on a GPU host")
    proc = resolve(tmp_path, "13.0", "flashinfer-sampling")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (module,) = json.loads(proc.stdout.splitlines()[-1])["modules"]
    assert module["workspace"].endswith("/jit-cache/.cache/flashinfer/0.7.2/120f")
