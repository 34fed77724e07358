"""FLASHINFER TEST DOUBLE: the workspace as flashinfer/jit/env.py 0.7.2 names it, from the same environment."""

from __future__ import annotations

import os
import pathlib

import jit_double_common

from flashinfer import __version__


def _normalize(arch: str) -> str:
    major, minor = arch.split(".")
    if minor[-1].isalpha():
        return f"{major}{minor}"
    # compilation_context.py _normalize_cuda_arch: 12.0 -> 0f with CUDA >= 12.9, else 0a; 9.x and >= 10 -> a.
    if int(major) == 12 and int(minor) == 0:
        return f"{major}{minor}{'f' if jit_double_common.cuda_version() >= (12, 9) else 'a'}"
    return f"{major}{minor}{'a' if int(major) >= 9 else ''}"


FLASHINFER_BASE_DIR = pathlib.Path(os.getenv("FLASHINFER_WORKSPACE_BASE", pathlib.Path.home().as_posix()))
FLASHINFER_CACHE_DIR = FLASHINFER_BASE_DIR / ".cache" / "flashinfer"
# Without FLASHINFER_CUDA_ARCH_LIST the real one asks the GPU; the double has none and says so in the name.
_ARCHS = sorted(_normalize(a) for a in os.environ.get("FLASHINFER_CUDA_ARCH_LIST", "").split()) or ["nogpu"]
FLASHINFER_WORKSPACE_DIR = FLASHINFER_CACHE_DIR / __version__ / "_".join(_ARCHS)
FLASHINFER_JIT_DIR = FLASHINFER_WORKSPACE_DIR / "cached_ops"
