"""SGLANG TEST DOUBLE: sglang.kernels."""
