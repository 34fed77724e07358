"""SGLANG TEST DOUBLE: the content-keyed JIT cache's layout (sglang/kernels/jit/utils/compile/cache.py 0.5.23)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import jit_double_common

from sglang.kernels.jit.utils.arch import get_jit_cuda_arch


def cache_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get("SGLANG_JIT_CACHE_DIR") or "~/.cache/sglang/jit").expanduser()


def _target_tag() -> str:
    arch = get_jit_cuda_arch()
    return f"sm{arch.major}{arch.minor}{arch.suffix}"


def compute_build_key(module_args: tuple[str, ...]) -> str:
    compilers = [jit_double_common.version_text([path, "--version"])
                 for path in (jit_double_common.nvcc(), os.environ.get("CXX", "c++"))]
    parts = [list(module_args), f"cuda:{get_jit_cuda_arch().target_name}", compilers]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def build_key_dir(*, module_name: str, build_key: str) -> pathlib.Path:
    return cache_root() / _target_tag() / module_name / f"build-{build_key}"


def find_prebuilt(*, scope: pathlib.Path, module_name: str) -> pathlib.Path | None:
    for leaf in sorted(scope.glob("deps-*")) if scope.is_dir() else []:
        if (leaf / f"{module_name}.so").is_file():
            return leaf / f"{module_name}.so"
    return None
