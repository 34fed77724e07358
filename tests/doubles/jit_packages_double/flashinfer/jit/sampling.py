"""FLASHINFER TEST DOUBLE: flashinfer.jit.sampling.gen_sampling_module."""

from __future__ import annotations

from flashinfer.jit.core import JitSpec, gen_jit_spec


def gen_sampling_module() -> JitSpec:
    return gen_jit_spec("sampling")
