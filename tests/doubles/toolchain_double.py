#!/usr/bin/env python3
"""TEST DOUBLE for the JIT toolchain's programs (nvcc, a C++ compiler, ninja): never install it on a real host.

Installed under those names on a sandbox host (tests/sandbox/prepare_host.yml), it answers ``--version`` as the
real program does (the pre-build keys its caches on these lines) and fails anything else: the builds themselves are
the JIT PACKAGE TEST DOUBLES' (tests/doubles/jit_packages_double), which run the COMPILER TEST DOUBLE. The version
it reports comes from BWS_TOOLCHAIN_DOUBLE_<NAME>_VERSION when set (a test changes the toolchain that way).
"""

from __future__ import annotations

import os
import sys

VERSIONS = {
    "nvcc": ("nvcc: NVIDIA (R) Cuda compiler driver (TEST DOUBLE)\n"
             "Cuda compilation tools, release {v}, V{v}.88\n", "13.0"),
    "c++": ("c++ (TEST DOUBLE) {v}\n", "12.2.0"),
    "ninja": ("{v}\n", "1.13.0"),
}


def main() -> int:
    name = os.path.basename(sys.argv[0])
    template, default = VERSIONS.get(name, ("{v}\n", "0"))
    if sys.argv[1:] == ["--version"]:
        env = f"BWS_TOOLCHAIN_DOUBLE_{name.upper().replace('+', 'X')}_VERSION"
        sys.stdout.write(template.format(v=os.environ.get(env, default)))
        return 0
    print(f"{name} (TEST DOUBLE): only --version is answered", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
