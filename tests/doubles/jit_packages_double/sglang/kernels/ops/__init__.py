"""SGLANG TEST DOUBLE: sglang.kernels.ops."""
