"""Shared by the JIT package TEST DOUBLES: the compiler double's build and the toolchain's versions."""

from __future__ import annotations

import os
import re
import subprocess

import compiler_double


def seconds() -> float:
    return float(os.environ.get("BWS_JIT_DOUBLE_SECONDS", "2"))


def stall_after() -> float | None:
    value = os.environ.get("BWS_JIT_DOUBLE_STALL_AFTER", "")
    return float(value) if value else None


def build(module_file: str) -> float:
    return compiler_double.build(module_file, seconds(), stall_after=stall_after())


def version_text(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def nvcc() -> str:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    return os.path.join(cuda_home, "bin", "nvcc")


def cuda_version() -> tuple[int, ...]:
    match = re.search(r"release (\d+)\.(\d+)", version_text([nvcc(), "--version"]))
    return (int(match.group(1)), int(match.group(2))) if match else (0,)
