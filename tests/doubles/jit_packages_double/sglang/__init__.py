"""SGLANG TEST DOUBLE (tests/doubles/jit_packages_double): the pre-build's entry points only."""
