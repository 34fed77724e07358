"""SGLANG TEST DOUBLE: the JIT module behind tree_speculative_sampling_target_only."""

from __future__ import annotations

import pathlib

from sglang.kernels.jit.utils.compile import loader


def _jit_sampling_module(vec_size: int, deterministic: bool) -> pathlib.Path:
    return loader.load_jit("speculative_sampling", vec_size, deterministic)
