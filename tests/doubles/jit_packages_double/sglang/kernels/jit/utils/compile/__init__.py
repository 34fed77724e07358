"""SGLANG TEST DOUBLE: sglang.kernels.jit.utils.compile."""
