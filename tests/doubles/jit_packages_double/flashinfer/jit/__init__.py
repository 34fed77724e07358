"""FLASHINFER TEST DOUBLE: flashinfer.jit."""
