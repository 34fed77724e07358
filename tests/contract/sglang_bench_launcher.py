"""`python -m MODULE ARGS` for SGLang's benchmark client in the CPU contract venv:
    <contract python> sglang_bench_launcher.py PATHS MODULE ARGS...
PATHS (os.pathsep-separated) go first on sys.path: the test stubs (tests/contract/bench_stubs: `datasets`;
tests/contract/stubs/resolve: the triton/torchvision shim) and the resolution overlay, whose transformers the
client imports. Then MODULE runs as __main__ with ARGS, exactly as `python -m` would run it on a GPU host.
"""

import os
import runpy
import sys

if __name__ == "__main__":
    paths, module, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    sys.path[:0] = paths.split(os.pathsep)
    import bws_resolve_shim  # noqa: F401  (must come before sglang)

    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
