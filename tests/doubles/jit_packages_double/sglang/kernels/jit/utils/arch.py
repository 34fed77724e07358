"""SGLANG TEST DOUBLE: the JIT target as sglang/kernels/jit/utils/arch.py 0.5.23 derives it (no GPU here)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import jit_double_common


@dataclass
class ArchInfo:
    major: int
    minor: int
    suffix: str

    @property
    def target_name(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"


def _cuda_arch_suffix(major: int, minor: int) -> str:
    if major == 9:
        return "a"
    if major == 12:
        return "f" if minor == 0 and jit_double_common.cuda_version() >= (12, 9) else "a"
    return "a" if major >= 10 else ""


_CUDA_ARCH = ArchInfo(0, 0, "")  # the real one asks the GPU; the double has none


def get_jit_cuda_arch() -> ArchInfo:
    return _CUDA_ARCH


@contextmanager
def override_jit_cuda_arch(major: int, minor: int, suffix: str | None = None) -> Iterator[None]:
    global _CUDA_ARCH  # noqa: PLW0603 - the real module keeps it global the same way
    old = _CUDA_ARCH
    _CUDA_ARCH = ArchInfo(major, minor, _cuda_arch_suffix(major, minor) if suffix is None else suffix)
    try:
        yield
    finally:
        _CUDA_ARCH = old
