"""SGLang 0.5.23's real HTTP server on a CPU, with a scripted scheduler in place of the GPU one.

    python sglang_serve.py serve --config FILE [more sglang serve flags]

takes what `sglang serve` takes and parses it with the same code: sglang/cli/serve.py `serve` (the
`--model-type` selector and a positional model path, then `_run_llm`) -> sglang/srt/server_args.py
`prepare_server_args` (ServerArgs.add_cli_args, the `--config` YAML merger of
srt/utils/server_args_config_parser.py ConfigArgumentMerger, ServerArgs.from_cli_args) -> sglang/launch_server.py
`run_server` (resolve_once, the HTTP branch) -> sglang/srt/entrypoints/http_server.py `launch_server`. The one
difference: `launch_server(server_args, run_scheduler_process_func=run_scripted_scheduler_process)`, the
parameter upstream gives for exactly this (and its `launch_callback`, to write the route table for the tests);
everything else (FastAPI app, API-key middleware, TokenizerManager,
detokenizer subprocess, warm-up request, /health, /metrics, OpenAI routes, reasoning and tool parsers) is
SGLang's own. sglang_scheduler.py says what the scheduler imitates.

CPU overrides, kept minimal: `--device cpu` when neither the command line nor the config file names a device
(without it, resolution stops at srt/arg_groups/serving_hook.py handle_missing_default_values -> srt/utils/common.py
get_device(): "No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available"; on a GPU host
SGLang detects cuda there itself); and the process environment of `_cpu_environment`. Everything else in the
config is served as given (EAGLE3 included: the scripted scheduler never builds a drafter).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _cpu_environment() -> None:
    # Nothing here may reach a GPU or the network. HF_HUB_OFFLINE: the model is a local directory; transformers
    # must not ask the Hub for anything (srt/utils/hf_transformers/* call it otherwise for remote paths).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # No CUDA device is visible on the test host; say so explicitly so torch never probes a driver.
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def _names_device(argv: list[str]) -> bool:
    if any(a == "--device" or a.startswith("--device=") for a in argv):
        return True
    if "--config" in argv:
        import yaml  # what srt/utils/server_args_config_parser.py reads the file with

        with open(argv[argv.index("--config") + 1], encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        return any(str(k).replace("_", "-") == "device" for k in data)
    return False


def main(argv: list[str]) -> None:
    if not argv or argv[0] != "serve":
        print("usage: sglang_serve.py serve [--config FILE] [sglang serve flags]", file=sys.stderr)
        raise SystemExit(2)
    _cpu_environment()

    from sglang.cli.serve import _extract_model_type_override, _normalize_positional_model_path
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree
    from sglang.srt.utils.common import suppress_noisy_warnings

    suppress_noisy_warnings()
    # sglang/cli/serve.py serve(): the backend selector and `sglang serve <model>`; only the LLM backend here.
    backend_name, dispatch_argv = _extract_model_type_override(list(argv[1:]))
    if backend_name not in ("auto", "llm"):
        raise SystemExit(f"sglang_serve.py serves LLMs only, not --model-type {backend_name}")
    dispatch_argv, _ = _normalize_positional_model_path(dispatch_argv)
    if not _names_device(dispatch_argv):
        dispatch_argv = [*dispatch_argv, "--device", "cpu"]  # see the module docstring: CPU overrides
    load_plugins()

    from sglang_scheduler import run_scripted_scheduler_process

    try:
        # sglang/cli/serve.py _run_llm
        server_args = prepare_server_args(list(dispatch_argv))
        # sglang/launch_server.py run_server, HTTP branch
        if (server_args.smg_grpc_mode or server_args.grpc_mode) and server_args.tokenizer_path is None:
            server_args.tokenizer_path = server_args.model_path
        server_args.resolve_once()
        from sglang.srt.arg_groups.overrides import resolving_view

        cfg = resolving_view(server_args)
        if cfg.encoder_only or cfg.smg_grpc_mode or cfg.use_ray:
            raise SystemExit("sglang_serve.py runs the default HTTP mode only")
        from script import write_route_table
        from sglang.srt.entrypoints.http_server import app, launch_server

        # launch_callback: upstream's hook, called once the warm-up passed (the app has every route by then).
        launch_server(server_args, run_scheduler_process_func=run_scripted_scheduler_process,
                      launch_callback=lambda: write_route_table(app))
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
