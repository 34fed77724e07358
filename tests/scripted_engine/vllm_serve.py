#!/usr/bin/env python3
"""`vllm serve` of vLLM 0.33.0, for real, on a CPU, with only the engine core scripted.

    python tests/scripted_engine/vllm_serve.py serve MODEL --port N --served-model-name X ...

takes exactly the argv of `vllm serve` (the first argument is the subcommand, as for the `vllm` console
script) and runs vLLM's own console-script entry point, `vllm.entrypoints.cli.main:main`: its parser
(`make_arg_parser`), `validate_parsed_serve_args`, `ServeSubcommand.cmd` -> `run_server`
(vllm/entrypoints/launchers/api_server/entry.py) -> `AsyncEngineArgs.create_engine_config()` -> `AsyncLLM`
-> `build_app` / `init_app_state` -> uvicorn. The one substitution is the engine-core client that `AsyncLLM`
builds (vllm_backend.py says what it imitates). Every other override is listed here and kept minimal.

Route table: with SCRIPTED_ENGINE_ROUTES_FILE=FILE the server runs as usual and writes the built app's routes
(path, methods, kind, endpoint) to FILE once `build_app` returns (tests/contract/test_real_front_ends.py probes
each of them without the key).

Run it with the test-engine venv (engine_venv.py: the contract venv plus the lock's `test_engine` packages).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# CPU override 1 (the only platform one): vllm/platforms/__init__.py `cpu_platform_plugin` selects the CPU
# platform when VLLM_TARGET_DEVICE=cpu. The contract venv's vLLM is the sdist built with
# VLLM_TARGET_DEVICE=empty, which otherwise resolves to UnspecifiedPlatform (no device type:
# create_engine_config fails). Nothing runs on the device anyway: the engine core is scripted.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

# No test stubs: vLLM 0.33.0's server needs none (tests/scripted_engine/stubs/ holds SGLang's; its triton stub
# would make vLLM believe Triton is installed: vllm/triton_utils/importing.py).
sys.path.insert(0, HERE)

import vllm_backend  # noqa: E402
from script import write_route_table  # noqa: E402

vllm_backend.install()


def write_routes_when_built(path: str) -> None:
    """SCRIPTED_ENGINE_ROUTES_FILE (tests/scripted_engine/front_end.py): serve as usual, and write the route table
    of the app `build_and_serve` builds (entry.py calls `build_app` by that module-level name)."""
    from vllm.entrypoints.launchers.api_server import entry

    real_build_app = entry.build_app

    def build_app(*args, **kwargs):
        app = real_build_app(*args, **kwargs)
        write_route_table(app, path)
        return app

    entry.build_app = build_app


def main() -> int | None:
    if os.environ.get("SCRIPTED_ENGINE_ROUTES_FILE"):
        write_routes_when_built(os.environ["SCRIPTED_ENGINE_ROUTES_FILE"])
    from vllm.entrypoints.cli.main import main as vllm_main  # the `vllm` console script

    sys.argv[0] = "vllm"
    return vllm_main()


if __name__ == "__main__":
    sys.exit(main())
