"""FLASHINFER TEST DOUBLE: flashinfer.sampling.get_sampling_module, the engine's entry point at its first request."""

from __future__ import annotations

from flashinfer.jit.sampling import gen_sampling_module


def get_sampling_module() -> object:
    return gen_sampling_module().build_and_load()
