#!/usr/bin/env python3
"""ENGINE TEST DOUBLE: stands in for `sglang serve` / `vllm serve` on hosts without GPUs.

It is not an engine. It speaks the HTTP surface the playbooks, verify and the engines' benchmark clients
use, with the response shapes of SGLang 0.5.23 and vLLM 0.33.0 (health, models, model/server info, chat and
text completions with and without SSE streaming, Prometheus metrics), and it can misbehave on purpose so
that fault handling is tested for real. Each imitated behaviour names the upstream file it follows; the
unkind parts are imitated too:
- a reasoning parser (`reasoning-parser: kimi_k2`) puts a thinking model's answer into
  `reasoning_content` (SGLang) or `reasoning` (vLLM) unless the request turns thinking off;
- SGLang's /health runs a generation and answers 503 after its health-check timeout when generation is stuck;
- streams end with a usage chunk only when `stream_options.include_usage` asks for it, then `[DONE]`;
- SGLang drains on SIGTERM without a limit: /health answers 503, requests in flight run to their end, and the
  process exits only when none is left; POST /abort_request {"abort_all": true} ends them at once (finish_reason
  "abort"). (SGLang's multi-node ranks > 0 wait on SIGTERM for rank 0's shutdown broadcast; the double's ranks
  cannot reach each other across test hosts and exit at once: the stop order is checked by unit timestamps.)

The "model" answers an arithmetic question (`what is 123 + 456`) with the number, thinking first when
thinking is on, and otherwise generates `ok` tokens until max_tokens (the benchmark workload).

Invocation mirrors the engines:
    engine_double.py serve --config /etc/sglang/x.yaml          (SGLang flavour)
    engine_double.py serve /models/x --port 8000 [...]           (vLLM flavour, argv[0] or --flavour)
    engine_double.py --version

Environment (all optional):
    ENGINE_DOUBLE_FLAVOUR     sglang | vllm (default: from the program name, else sglang)
    ENGINE_DOUBLE_FAULT       none | crash-at-start | hang | ignore-sigterm | crash-after-ready |
                              deadlock-on-generate (loads, then every generation blocks for ever) |
                              garbage-output (every token is "foss", as a broken MoE kernel path answers) |
                              slow-first-request (the first generation takes ENGINE_DOUBLE_FIRST_REQUEST_S) |
                              unguarded-route (vLLM flavour: /invocations answers without the key, as vLLM
                              0.33.0 alone does; the deploy's middleware is what refuses it) |
                              unguarded-server-info (SGLang flavour: /server_info returns api_key and
                              admin_api_key, as SGLang 0.5.23 alone does; the deploy's plugin is what blanks them) |
                              compile-stall (a kernel build stops working after ENGINE_DOUBLE_COMPILE_STALL_AFTER_S:
                              its compiler lives, idle, and the start or the request waits on it for ever) |
                              hang-after-compile (every sampled generation blocks for ever once its kernels are built:
                              a sampler that hangs after its compile)
    ENGINE_DOUBLE_START_S     seconds /health answers 503 before it is ready (default 0.5)
    ENGINE_DOUBLE_COMPILE_START_S    seconds of kernel build at start, before the HTTP server listens (default 0:
                              none), with an empty kernel cache: the compiler TEST DOUBLE runs silently (see
                              compile_on_first_use). SGLang 0.5.23 builds most kernels on first use (about 210
                              `load_jit(` call sites under sglang/kernels/ops), serially, inside the first forward
                              (warm-up, CUDA-graph capture), logged at debug level only
                              (sglang/kernels/jit/utils/compile/loader.py); vLLM's torch.compile, Triton and CUDA-graph
                              capture are as silent
    ENGINE_DOUBLE_COMPILE_SAMPLED_S  seconds of kernel build at the first SAMPLED generation (temperature > 0; a
                              greedy one never builds), with an empty cache (default 0: none). With EAGLE-3, SGLang's
                              first sampled request builds FlashInfer's `sampling` module (top_k/top_p_renorm_prob, a
                              lazy import in sglang/kernels/ops/sampling/renorm.py) and SGLang's
                              tree_speculative_sampling_target_only (sglang/kernels/ops/speculative/sampling.py);
                              /health and the warm-up are greedy
    ENGINE_DOUBLE_COMPILE_STALL_AFTER_S  with compile-stall: seconds of work before the build wedges (default 1)
    ENGINE_DOUBLE_KERNEL_CACHE  the kernel cache (default: the service user's, as the engine's: SGLang 0.5.23
                              ~/.cache/sglang/jit, sglang/kernels/jit/utils/compile/cache.py; vLLM 0.33.0
                              ~/.cache/vllm, VLLM_CACHE_ROOT in vllm/envs.py); a module found there is not built again
    ENGINE_DOUBLE_COMPILER    the compiler TEST DOUBLE (default: compiler_double.py beside this file)
    ENGINE_DOUBLE_FIRST_REQUEST_S  extra seconds of the first generation with slow-first-request (default 10)
    SGLANG_HEALTH_CHECK_TIMEOUT    SGLang flavour: seconds /health waits for its generation (default 20,
                              as SGLang 0.5.23 srt/entrypoints/http_server.py)
    ENGINE_DOUBLE_TOKENS_PER_S  decode speed of one sequence without speculation (default 400)
    ENGINE_DOUBLE_ACCEPT_RATE   fraction of drafted tokens accepted when speculation is on (default 0.6)
    ENGINE_DOUBLE_SPEC_COST     relative cost of one verify step vs a plain decode step (default 1.3)
    ENGINE_DOUBLE_REQUEST_LOG   a file to which each generation request appends one JSON line: its route and what
                              decides what is generated (stream, usage, ignore_eos, chat_template_kwargs, temperature,
                              top_p, messages)
    ENGINE_DOUBLE_GPU_DEV_DIR   a directory of stand-in device files watched by the NVIDIA-SMI TEST DOUBLE
                              (tests/doubles/nvidia_smi_double.py): the double holds its GPUs while it lives, as a CUDA
                              process does, with nvidiactl, nvidia-uvm and nvidia<minor> of each GPU open (tensor
                              parallel size x pipeline parallel size / nnodes GPUs, from index 0), so that nvidia-smi's
                              double lists it as a compute app there; the memory it shows is the double's
                              NVSIM_MEM_MIB ("minor:MiB,..."), read from this process's environment
    ENGINE_DOUBLE_GPU_DRIVER_PROC_DIR  the driver /proc directory of those GPUs (gpus/*/information): GPU index i is
                              the i-th by bus id, as nvidia-smi and CUDA in PCI bus order number them, and its device
                              minor is the file's; without it, GPU i is minor i
Stdlib only: it runs inside the systemd test hosts with the distribution's python3.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import signal
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DOUBLE_MARKER = "ENGINE TEST DOUBLE (not an engine)"
VERSIONS = {"sglang": "0.5.23", "vllm": "0.33.0"}
FAULTS = ("none", "crash-at-start", "hang", "ignore-sigterm", "crash-after-ready", "deadlock-on-generate",
          "garbage-output", "slow-first-request", "unguarded-route", "unguarded-server-info", "compile-stall",
          "hang-after-compile")
# Where the engines keep the kernels they build on first use, under the service user's home: SGLang 0.5.23
# sglang/kernels/jit/utils/compile/cache.py (SGLANG_JIT_CACHE_DIR or ~/.cache/sglang/jit), vLLM 0.33.0 vllm/envs.py
# (VLLM_CACHE_ROOT, ~/.cache/vllm, where its torch.compile cache lives).
KERNEL_CACHE = {"sglang": "~/.cache/sglang/jit", "vllm": "~/.cache/vllm"}
# The POST routes the double serves, in its /openapi.json (FastAPI's, as both engines serve it): a few of the real
# tables (the contract tests' parity check reads the real ones). vLLM 0.33.0 entrypoints/serve/sagemaker/
# api_router.py registers /invocations; SGLang 0.5.23 srt/entrypoints/http_server.py /abort_request.
POST_ROUTES = {"sglang": ("/v1/chat/completions", "/v1/completions", "/abort_request"),
               "vllm": ("/v1/chat/completions", "/v1/completions", "/invocations")}
# Reasoning parsers whose model thinks unless the request's chat_template_kwargs say `thinking: false`:
# SGLang 0.5.23 srt/parser/reasoning_parser.py (KimiK2Detector, reasoning_default="thinking", read by
# srt/entrypoints/openai/serving_chat.py `_get_reasoning_from_request`: thinking unless the kwarg is
# False); vLLM 0.33.0 vllm/parser/kimi_k2.py (KimiK2Parser: thinking unless `thinking`/`enable_thinking`
# say otherwise, initial state REASONING).
THINKING_BY_DEFAULT = {"kimi_k2", "kimi_k3"}
# uvicorn's listen backlog, which both engines serve with (SGLang 0.5.23 srt/entrypoints/http_server.py
# passes no backlog, so uvicorn.Config's 2048 applies; vLLM 0.33.0 entrypoints/openai/api_server.py the same).
LISTEN_BACKLOG = 2048
ARITHMETIC = re.compile(r"(-?\d+)\s*([-+*])\s*(-?\d+)")
# The admin routes the double serves: SGLang 0.5.23 marks /abort_request ADMIN_OPTIONAL (http_server.py).
ADMIN_ROUTES = {"sglang": ("/abort_request",), "vllm": ()}


def parse_flat_yaml(text: str) -> dict[str, object]:
    """Parse the flat `key: <JSON value>` YAML that the sglang role renders."""
    config: dict[str, object] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or line == "---":
            continue
        key, _, value = line.partition(":")
        value = value.strip()
        try:
            config[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            config[key.strip()] = value
    return config


def parse_cli(argv: list[str]) -> dict[str, object]:
    """Parse `--flag value` / `--flag` pairs (and one positional model) into a dict keyed like SGLang's YAML."""
    options: dict[str, object] = {}
    index = 0
    while index < len(argv):
        token = argv[index]
        if token.startswith("--"):
            key, eq, inline = token[2:].partition("=")
            if eq:
                options[key] = inline
            elif index + 1 < len(argv) and not argv[index + 1].startswith("--"):
                options[key] = argv[index + 1]
                index += 1
            else:
                options[key] = True
        elif "model-path" not in options:
            options["model-path"] = token
        index += 1
    return options


def credential_api_key() -> str:
    """The key a vllm release passes as the systemd credential `api-key` (LoadCredential=), read as the release's
    key guard reads it (roles/vllm/files/bws_vllm_auth.py, credential_key); empty without one."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY", "")
    try:
        return (Path(directory) / "api-key").read_text(encoding="utf-8").removesuffix("\n") if directory else ""
    except OSError:
        return ""


class Engine:
    """State shared by the HTTP handlers: configuration, counters, readiness."""

    def __init__(self, flavour: str, options: dict[str, object]) -> None:
        self.flavour = flavour
        self.options = options
        self.model_path = str(options.get("model-path") or options.get("model") or "/models/unknown")
        self.served_name = str(options.get("served-model-name") or self.model_path)
        self.api_key = options.get("api-key") or credential_api_key() or None
        self.admin_api_key = options.get("admin-api-key") or None
        self.fault = os.environ.get("ENGINE_DOUBLE_FAULT", "none")
        if self.fault not in FAULTS:
            raise SystemExit(f"engine-double: unknown ENGINE_DOUBLE_FAULT {self.fault!r} (known: {FAULTS})")
        self.reasoning_parser = str(options.get("reasoning-parser") or "")
        self.health_check_timeout_s = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        self.first_request_s = float(os.environ.get("ENGINE_DOUBLE_FIRST_REQUEST_S", "10"))
        self.generations_started = 0
        self.ready_at = time.monotonic() + float(os.environ.get("ENGINE_DOUBLE_START_S", "0.5"))
        self.tokens_per_s = float(os.environ.get("ENGINE_DOUBLE_TOKENS_PER_S", "400"))
        self.accept_rate = float(os.environ.get("ENGINE_DOUBLE_ACCEPT_RATE", "0.6"))
        self.spec_cost = float(os.environ.get("ENGINE_DOUBLE_SPEC_COST", "1.3"))
        self.spec_steps = self._speculative_steps()
        self.lock = threading.Lock()
        self.counters = {"prompt_tokens": 0, "generation_tokens": 0, "verify_calls": 0,
                         "drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "requests": 0}
        self.accepted_per_pos = [0] * self.spec_steps
        self.rng = random.Random(1234)
        self.in_flight = 0
        self.gracefully_exit = False
        self.unhealthy = False  # a /health generation timed out (SGLang's ServerStatus.UnHealthy)
        self.aborts: set[threading.Event] = set()  # one per request in flight; /abort_request sets them all
        self.request_log = os.environ.get("ENGINE_DOUBLE_REQUEST_LOG") or None
        self.gpu_files: list = []  # stand-in GPU device files held open while the double lives (hold_gpus)
        self.kernels = KernelBuilds(flavour, self.fault)

    def log_request(self, path: str, request: dict) -> None:
        """One line per generation request (ENGINE_DOUBLE_REQUEST_LOG): what the tests check a client sent."""
        if not self.request_log:
            return
        messages = request.get("messages")
        line = {"path": path, "stream": bool(request.get("stream")),
                "include_usage": bool((request.get("stream_options") or {}).get("include_usage")),
                "ignore_eos": request.get("ignore_eos"), "chat_template_kwargs": request.get("chat_template_kwargs"),
                "temperature": request.get("temperature"), "top_p": request.get("top_p"),
                "max_tokens": request.get("max_tokens") or request.get("max_completion_tokens"),
                "roles": [m.get("role") for m in messages] if isinstance(messages, list) else None}
        with self.lock, open(self.request_log, "a", encoding="utf-8") as log:
            log.write(json.dumps(line) + "\n")

    def _speculative_steps(self) -> int:
        if self.flavour == "sglang":
            if str(self.options.get("speculative-algorithm", "")).upper() in ("EAGLE3", "EAGLE"):
                return int(self.options.get("speculative-num-steps", 3))
            return 0
        raw = self.options.get("speculative-config")
        if not raw:
            return 0
        config = json.loads(raw) if isinstance(raw, str) else raw
        return int(config.get("num_speculative_tokens", 0))

    @property
    def ready(self) -> bool:
        return self.fault != "hang" and time.monotonic() >= self.ready_at

    def start_generation(self) -> None:
        """Block as the fault says before a generation: for ever when deadlocked, long the first time when slow."""
        with self.lock:
            self.generations_started += 1
            first = self.generations_started == 1
        if self.fault == "deadlock-on-generate":
            threading.Event().wait()
        if first and self.fault == "slow-first-request":
            time.sleep(self.first_request_s)

    def sampled_generation(self, request: dict) -> None:
        """A sampled request (temperature > 0) builds the sampling kernels on first use; with hang-after-compile it
        then never generates. Greedy requests skip the sampler (SGLang srt/layers/sampler.py is_all_greedy)."""
        temperature = request.get("temperature")
        if temperature is None or float(temperature) <= 0:
            return
        self.kernels.build("sampling", self.kernels.sampled_s)
        if self.fault == "hang-after-compile":
            threading.Event().wait()

    def thinks(self, request: dict) -> bool:
        """Whether the served model thinks for this chat request (see THINKING_BY_DEFAULT)."""
        if self.reasoning_parser not in THINKING_BY_DEFAULT:
            return False
        kwargs = request.get("chat_template_kwargs") or {}
        if self.flavour == "sglang":
            return kwargs.get("thinking") is not False
        if "thinking" not in kwargs and "enable_thinking" not in kwargs:
            return True
        return bool(kwargs.get("thinking")) or bool(kwargs.get("enable_thinking"))

    def output_words(self, prompt: str, max_tokens: int, thinking: bool) -> tuple[list[str], int]:
        """The tokens the model generates (one word each) and how many of them are thinking.

        An arithmetic question is answered with the number (after a few words of thinking when the model
        thinks); anything else yields `ok` tokens until max_tokens, as the benchmark's ignore-eos workload.
        """
        match = ARITHMETIC.search(prompt)
        if match:
            left, op, right = int(match.group(1)), match.group(2), int(match.group(3))
            value = {"+": left + right, "-": left - right, "*": left * right}[op]
            answer = [str(value)]
            reasoning = (f"The user asks for {left} {op} {right}. Let me compute it carefully, step by step, "
                         f"and check the result once more before answering. {left} {op} {right} is {value}."
                         ).split() * 4 if thinking else []
            words = reasoning + answer
        else:
            reasoning, words = [], ["ok"] * max_tokens
            if thinking:
                reasoning = words
        if self.fault == "garbage-output":
            # A broken kernel path never reaches EOS: the same token until max_tokens (sglang issue 23264).
            words = ["foss"] * max_tokens
            reasoning = words if thinking else []
        return words, len(reasoning)

    def generate(self, prompt_tokens: int, max_tokens: int) -> tuple[int, float]:
        """Account for one request and return (completion tokens, seconds it should take)."""
        produced, forwards = 0, 0
        with self.lock:
            while produced < max_tokens:
                forwards += 1
                if self.spec_steps:
                    accepted = 0
                    for position in range(self.spec_steps):
                        if self.rng.random() >= self.accept_rate:
                            break
                        accepted += 1
                        self.accepted_per_pos[position] += 1
                    self.counters["drafts"] += 1
                    self.counters["draft_tokens"] += self.spec_steps
                    self.counters["accepted_tokens"] += accepted
                    produced += accepted + 1
                else:
                    produced += 1
            produced = min(produced, max_tokens)
            self.counters["verify_calls"] += forwards if self.spec_steps else 0
            self.counters["prompt_tokens"] += prompt_tokens
            self.counters["generation_tokens"] += produced
            self.counters["requests"] += 1
        step_cost = self.spec_cost if self.spec_steps else 1.0
        return produced, forwards * step_cost / self.tokens_per_s

    def avg_accept_length(self) -> float:
        calls = self.counters["verify_calls"]
        return self.counters["generation_tokens"] / calls if calls else 0.0

    def metrics_text(self) -> str:
        labels = f'model_name="{self.served_name}"'
        c = self.counters
        if self.flavour == "sglang":
            lines = [
                "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
                "# TYPE sglang:generation_tokens_total counter",
                f'sglang:generation_tokens_total{{{labels},tp_rank="0"}} {c["generation_tokens"]}.0',
                "# TYPE sglang:prompt_tokens_total counter",
                f'sglang:prompt_tokens_total{{{labels},tp_rank="0"}} {c["prompt_tokens"]}.0',
                "# TYPE sglang:num_requests_total counter",
                f'sglang:num_requests_total{{{labels},tp_rank="0"}} {c["requests"]}.0',
                "# TYPE sglang:num_running_reqs gauge",
                f'sglang:num_running_reqs{{{labels},tp_rank="0"}} 0.0',
            ]
            # SGLang 0.5.23's speculative series are labelled prometheus metrics (srt/observability/
            # metrics_collector.py SchedulerMetricsCollector): a labelled metric has no sample until its first
            # observation, the first speculative verify step; vLLM's are bound to their labels at start (0.0).
            if self.spec_steps and c["verify_calls"]:
                rate = c["accepted_tokens"] / c["draft_tokens"] if c["draft_tokens"] else 0.0
                lines += [
                    "# TYPE sglang:spec_verify_calls_total counter",
                    f'sglang:spec_verify_calls_total{{{labels},tp_rank="0"}} {c["verify_calls"]}.0',
                    "# TYPE sglang:spec_accept_length gauge",
                    f'sglang:spec_accept_length{{{labels},tp_rank="0"}} {self.avg_accept_length()}',
                    "# TYPE sglang:spec_accept_rate gauge",
                    f'sglang:spec_accept_rate{{{labels},tp_rank="0"}} {rate}',
                ]
            return "\n".join(lines) + "\n"
        vlabels = f'engine="0",{labels}'
        lines = [
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{vlabels}}} {c['generation_tokens']}.0",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{vlabels}}} {c['prompt_tokens']}.0",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{vlabels}}} 0.0",
        ]
        if self.spec_steps:
            lines += [
                "# TYPE vllm:spec_decode_num_drafts_total counter",
                f"vllm:spec_decode_num_drafts_total{{{vlabels}}} {c['drafts']}.0",
                "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
                f"vllm:spec_decode_num_draft_tokens_total{{{vlabels}}} {c['draft_tokens']}.0",
                "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
                f"vllm:spec_decode_num_accepted_tokens_total{{{vlabels}}} {c['accepted_tokens']}.0",
                "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
            ]
            lines += [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{vlabels},position="{pos}"}} {n}.0'
                for pos, n in enumerate(self.accepted_per_pos)
            ]
        return "\n".join(lines) + "\n"


class KernelBuilds:
    """Kernels built on first use by the compiler TEST DOUBLE (tests/doubles/compiler_double.py): a silent, CPU-bound
    process named cicc in a process group of its own, as SGLang's ninja (sglang/kernels/jit/utils/compile/ninja.py)
    and FlashInfer's JIT run their compilers; a module already in the cache is not built again. One build at a time,
    as SGLang builds serially; a second request that needs the module waits on the first's build."""

    def __init__(self, flavour: str, fault: str) -> None:
        self.cache = os.path.expanduser(os.environ.get("ENGINE_DOUBLE_KERNEL_CACHE") or KERNEL_CACHE[flavour])
        self.start_s = float(os.environ.get("ENGINE_DOUBLE_COMPILE_START_S", "0"))
        self.sampled_s = float(os.environ.get("ENGINE_DOUBLE_COMPILE_SAMPLED_S", "0"))
        self.stall_after = (float(os.environ.get("ENGINE_DOUBLE_COMPILE_STALL_AFTER_S", "1"))
                            if fault == "compile-stall" else None)
        self.compiler = os.environ.get("ENGINE_DOUBLE_COMPILER") or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "compiler_double.py")
        self.lock = threading.Lock()

    def _compiler(self):
        """compiler_double.py, loaded from its file: the engine double is installed alone (a wheel, the sandbox's
        copy), so the file is found beside it or where ENGINE_DOUBLE_COMPILER says."""
        spec = importlib.util.spec_from_file_location("compiler_double", self.compiler)
        if spec is None or spec.loader is None or not os.path.exists(self.compiler):
            raise SystemExit(f"engine-double: no compiler double at {self.compiler} (set ENGINE_DOUBLE_COMPILER)")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def build(self, module: str, seconds: float) -> None:
        if seconds <= 0:
            return
        target = os.path.join(self.cache, f"{module}.so")
        with self.lock:
            if os.path.exists(target):
                return
            job = self._compiler().start(target, seconds, stall_after=self.stall_after)
            if job.wait() != 0:
                raise RuntimeError(f"engine-double: the build of {target} failed ({job.returncode})")


class Handler(BaseHTTPRequestHandler):
    engine: Engine
    server_version = "engine-test-double"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: object) -> None:
        sys.stderr.write("engine-double: " + (fmt % args) + "\n")

    def _send(self, status: int, body: object, content_type: str = "application/json") -> None:
        payload = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("X-Engine-Test-Double", "1")
        self.end_headers()
        self.wfile.write(payload)

    def _authorized(self, admin_route: bool) -> bool:
        """SGLang 0.5.23 srt/utils/auth.py decide_request_auth: an admin route (ADMIN_OPTIONAL, /abort_request
        among them) takes only the admin key when one is set, else the API key; the others take the API key."""
        key = (self.engine.admin_api_key or self.engine.api_key) if admin_route else self.engine.api_key
        return not key or self.headers.get("Authorization", "") == f"Bearer {key}"

    def _ready_and_authorized(self, admin_route: bool = False) -> bool:
        """Answer 503 while starting and 401 without the key, as the engines do; True when neither applies."""
        if not self.engine.ready:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "server is starting"})
            return False
        if not self._authorized(admin_route):
            self._send(HTTPStatus.UNAUTHORIZED, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self) -> None:
        engine = self.engine
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate", "/ready", "/ping"):
            if engine.fault == "hang":
                time.sleep(3600)
            if engine.gracefully_exit and path in ("/health", "/health_generate"):
                # SGLang 0.5.23 http_server.py health_generate: "Health check request received during shutdown".
                self._send(HTTPStatus.SERVICE_UNAVAILABLE, "")
                return
            # Both engines answer /health with an empty body: 503 while starting, 200 when ready.
            if engine.ready and engine.flavour == "sglang" and path in ("/health", "/health_generate"):
                self._send(self._sglang_health_generate(), "")
                return
            self._send(HTTPStatus.OK if engine.ready else HTTPStatus.SERVICE_UNAVAILABLE, "")
            return
        if path == "/metrics":
            self._send(HTTPStatus.OK, engine.metrics_text(), "text/plain; version=0.0.4")
            return
        if not self._ready_and_authorized():
            return
        routes = {
            "/v1/models": self._models,
            "/model_info": self._model_info,
            "/server_info": self._server_info,
            "/version": lambda: {"version": VERSIONS[engine.flavour], "test_double": DOUBLE_MARKER},
            "/openapi.json": lambda: {"openapi": "3.1.0", "paths": {
                **{path: {"get": {}} for path in ("/health", "/metrics", "/v1/models", "/version")},
                **{path: {"post": {}} for path in POST_ROUTES[engine.flavour]}}},
        }
        if path in routes:
            self._send(HTTPStatus.OK, routes[path]())
        else:
            self._send(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        # vLLM 0.33.0 checks the key only under /v1, /v2, /inference and /cohere
        # (entrypoints/serve/middleware/authenticate.py): its /invocations serves without it.
        unguarded = self.engine.fault == "unguarded-route" and path == "/invocations" and self.engine.ready
        admin_route = path in ADMIN_ROUTES[self.engine.flavour]
        if not unguarded and not self._ready_and_authorized(admin_route):
            return
        length = int(self.headers.get("Content-Length", "0"))
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._send(HTTPStatus.BAD_REQUEST, {"error": {"message": "invalid JSON body"}})
            return
        if not isinstance(request, dict):  # FastAPI's answer to a body its request model cannot take
            self._send(HTTPStatus.UNPROCESSABLE_ENTITY, {"detail": [{"type": "model_attributes_type"}]})
        elif path == "/invocations" and self.engine.flavour == "vllm" and "messages" not in request:
            self._send(HTTPStatus.BAD_REQUEST, {"error": {"message": "no request type matches the body"}})
        elif path in ("/v1/chat/completions", "/v1/completions", "/invocations"):
            self.aborted = threading.Event()
            with self.engine.lock:
                self.engine.in_flight += 1
                self.engine.aborts.add(self.aborted)
            try:
                self.engine.log_request(path, request)
                self._completion(request, chat=path.endswith("chat/completions") or path == "/invocations")
            finally:
                with self.engine.lock:
                    self.engine.in_flight -= 1
                    self.engine.aborts.discard(self.aborted)
        elif path == "/abort_request" and self.engine.flavour == "sglang":
            # SGLang 0.5.23 http_server.py abort_request -> tokenizer_manager.abort_request(abort_all=...).
            # The reply goes out under the lock: the aborted requests cannot count themselves out before it, so the
            # drain watchdog cannot exit mid-reply (SGLang answers on its one event loop before its watchdog looks
            # again, 5 s later).
            with self.engine.lock:
                if request.get("abort_all"):
                    for aborted in self.engine.aborts:
                        aborted.set()
                self._send(HTTPStatus.OK, "")
        else:
            self._send(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})

    def _sglang_health_generate(self) -> int:
        """SGLang 0.5.23 srt/entrypoints/http_server.py `health_generate`: submit a one-token generation, poll
        once a second for up to SGLANG_HEALTH_CHECK_TIMEOUT for any output, log an error and answer 503 if none
        came; so a stuck engine answers 503 after the timeout, as a loading one does at once."""
        engine = self.engine
        done = threading.Event()

        def one_token() -> None:
            engine.start_generation()
            done.set()

        threading.Thread(target=one_token, daemon=True).start()
        started = time.monotonic()
        while time.monotonic() < started + engine.health_check_timeout_s:
            time.sleep(1)  # `await asyncio.sleep(1)` before each look, the first one included
            if done.is_set():
                return HTTPStatus.OK
        tic = time.strftime("%H:%M:%S", time.localtime(time.time() - engine.health_check_timeout_s))
        print(f"engine-double: Health check failed. Server couldn't get a response from detokenizer for last "
              f"{engine.health_check_timeout_s:g} seconds. tic start time: {tic}.", file=sys.stderr, flush=True)
        engine.unhealthy = True
        return HTTPStatus.SERVICE_UNAVAILABLE

    def _models(self) -> dict[str, object]:
        engine = self.engine
        card = {"id": engine.served_name, "object": "model", "created": int(time.time()),
                "owned_by": engine.flavour, "root": engine.model_path,
                "max_model_len": int(engine.options.get("context-length") or
                                     engine.options.get("max-model-len") or 131072)}
        return {"object": "list", "data": [card]}

    def _model_info(self) -> dict[str, object]:
        engine = self.engine
        return {"model_path": engine.model_path, "served_model_name": engine.served_name,
                "tokenizer_path": str(engine.options.get("tokenizer-path") or engine.model_path),
                "is_generation": True, "weight_version": "default", "model_type": "kimi_k25",
                "architectures": ["KimiK25ForConditionalGeneration"], "test_double": DOUBLE_MARKER}

    def _server_info(self) -> dict[str, object]:
        engine = self.engine
        if engine.fault == "deadlock-on-generate" and engine.generations_started:
            # SGLang 0.5.23 srt/entrypoints/http_server.py get_server_info awaits the scheduler's answer to a
            # GetInternalStateReq (tokenizer_manager.get_internal_state); a scheduler stuck in a generation never
            # reads it, so the request hangs until the client gives up.
            threading.Event().wait()
        state: dict[str, object] = {"last_gen_throughput": engine.tokens_per_s, "world_size": 1,
                                    "memory_usage": {"weight": 0.0, "kvcache": 0.0}}
        if engine.spec_steps:
            state["avg_spec_accept_length"] = engine.avg_accept_length()
        info = {k.replace("-", "_"): v for k, v in engine.options.items() if k not in ("api-key", "admin-api-key")}
        if engine.fault == "unguarded-server-info":
            # SGLang 0.5.23 srt/utils/common.py build_server_info: server_args.resolved_dict(), keys included.
            info.update(api_key=engine.api_key, admin_api_key=engine.admin_api_key)
        info.update({"internal_states": [state], "version": VERSIONS["sglang"],
                     "test_double": DOUBLE_MARKER})
        return info

    def _completion(self, request: dict, chat: bool) -> None:
        engine = self.engine
        max_tokens = int(request.get("max_tokens") or request.get("max_completion_tokens") or 16)
        max_tokens = max(1, min(max_tokens, 4096))
        if chat:
            prompt = " ".join(message_text(m.get("content")) for m in request.get("messages", []))
        else:
            prompt = str(request.get("prompt", ""))
        prompt_tokens = max(1, len(prompt.split()))
        thinking = chat and engine.thinks(request)
        words, reasoning_words = engine.output_words(prompt, max_tokens, thinking)
        engine.sampled_generation(request)
        engine.start_generation()
        produced, seconds = engine.generate(prompt_tokens, min(max_tokens, len(words)))
        reply = Reply(words[:produced], min(reasoning_words, produced),
                      "length" if len(words) >= max_tokens else "stop", prompt_tokens, seconds)
        created = int(time.time())
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{created}{random.randrange(10**6):06d}"
        if request.get("stream"):
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            self._stream(reply, chat, ident, created, include_usage)
            return
        if self.aborted.wait(min(seconds, 30.0)):
            reply.finish_reason = "abort"
        self._send(HTTPStatus.OK, self._whole_response(reply, chat, ident, created))

    def _whole_response(self, reply: Reply, chat: bool, ident: str, created: int) -> dict[str, object]:
        engine = self.engine
        if not chat:
            choice = {"index": 0, "text": reply.text(), "finish_reason": reply.finish_reason, "logprobs": None}
            return {"id": ident, "object": "text_completion", "created": created,
                    "model": engine.served_name, "choices": [choice], "usage": reply.usage()}
        reasoning, content = reply.split()
        if engine.flavour == "sglang":
            # SGLang 0.5.23 srt/entrypoints/openai/serving_chat.py: content "" when all of it was reasoning,
            # reasoning_content None without reasoning.
            message = {"role": "assistant", "content": content, "reasoning_content": reasoning or None}
        else:
            # vLLM 0.33.0 entrypoints/openai/chat_completion/protocol.py ChatMessage: `reasoning`, content None
            # when the parser left none.
            message = {"role": "assistant", "content": content or None, "reasoning": reasoning or None}
        choice = {"index": 0, "message": message, "finish_reason": reply.finish_reason}
        return {"id": ident, "object": "chat.completion", "created": created,
                "model": engine.served_name, "choices": [choice], "usage": self._chat_usage(reply, whole=True)}

    def _chat_usage(self, reply: Reply, whole: bool) -> dict[str, object]:
        """Chat usage. SGLang 0.5.23 srt/entrypoints/openai/usage_processor.py `calculate_token_usage`:
        reasoning_tokens always, completion_tokens_details only when there were some, prompt_tokens_details None
        (dumped whole, None fields included). vLLM 0.33.0 entrypoints/openai/chat_completion/serving.py: with a
        reasoning parser completion_tokens_details counts them (`_include_reasoning_tokens_details`); a whole reply
        also carries prompt_tokens_details, None unless --enable-prompt-tokens-details (the stream leaves None out)."""
        usage: dict[str, object] = dict(reply.usage())
        if self.engine.flavour == "sglang":
            details = {"reasoning_tokens": reply.reasoning_words} if reply.reasoning_words else None
            usage.update({"prompt_tokens_details": None, "reasoning_tokens": reply.reasoning_words,
                          "completion_tokens_details": details})
        else:
            if self.engine.reasoning_parser:
                usage["completion_tokens_details"] = {"reasoning_tokens": reply.reasoning_words}
            if whole:
                usage["prompt_tokens_details"] = None
        return usage

    def _stream(self, reply: Reply, chat: bool, ident: str, created: int, include_usage: bool) -> None:
        """Server-sent events as the engines send them: `data: <json>` blocks, a usage chunk with empty choices
        only when stream_options.include_usage is true, then `data: [DONE]` (SGLang 0.5.23
        srt/entrypoints/openai/serving_chat.py `_generate_chat_stream` and serving_completions.py; vLLM 0.33.0
        entrypoints/openai/chat_completion/serving.py and completion/serving.py). One chunk per token."""
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.send_header("X-Engine-Test-Double", "1")
        self.end_headers()
        self.close_connection = True
        chunks = (self._chat_chunks if chat else self._completion_chunks)(reply, ident, created)
        delay = min(reply.seconds / max(1, len(reply.words)), 1.0)
        # Paced against a deadline per chunk, not a sleep after each: on a busy 2-core box the time spent writing a
        # chunk and waking up again would otherwise add to every token, more for a fast (speculative) double with
        # short delays than for its baseline, and skew the measured speed-up.
        start = time.monotonic()
        try:
            for index, chunk in enumerate(chunks):
                if index and self.aborted.wait(max(0.0, start + index * delay - time.monotonic())):
                    # SGLang 0.5.23 serving_chat.py: a graceful abort (/abort_request) ends the stream through the
                    # normal chunk path, with finish_reason "abort".
                    self._event({**chunk, "choices": [{**chunk["choices"][0], "finish_reason": "abort"}]})
                    break
                self._event(chunk)
            if include_usage:
                self._event(self._usage_chunk(reply, chat, ident, created))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _event(self, chunk: dict[str, object]) -> None:
        self.wfile.write(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
        self.wfile.flush()

    def _chat_chunks(self, reply: Reply, ident: str, created: int):
        engine = self.engine
        head = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": engine.served_name}
        sglang = engine.flavour == "sglang"
        reasoning_key = "reasoning_content" if sglang else "reasoning"

        def chunk(delta: dict[str, object], finish_reason: str | None = None) -> dict[str, object]:
            if sglang:
                # sse_utils.py StreamDelta/StreamChoice: reasoning_content always present, matched_stop too.
                choice = {"index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
                          "finish_reason": finish_reason, "matched_stop": None}
            else:
                # vLLM serializes with exclude_unset: the fields it set, logprobs/finish_reason included.
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**head, "choices": [choice]}

        yield chunk({"role": "assistant", "content": ""})
        last = len(reply.words) - 1
        for position, word in enumerate(reply.words):
            text = word if position in (0, reply.reasoning_words) else " " + word
            delta = {reasoning_key: text} if position < reply.reasoning_words else {"content": text}
            # vLLM sets finish_reason on the chunk of the last token; SGLang sends it in a chunk of its own.
            yield chunk(delta, reply.finish_reason if position == last and not sglang else None)
        if sglang or last < 0:
            yield chunk({} if sglang else {"content": ""}, reply.finish_reason)

    def _completion_chunks(self, reply: Reply, ident: str, created: int):
        head = {"id": ident, "object": "text_completion", "created": created, "model": self.engine.served_name}
        last = len(reply.words) - 1
        for position, word in enumerate(reply.words):
            finish = reply.finish_reason if position == last else None
            choice: dict[str, object] = {"index": 0, "text": word if position == 0 else " " + word,
                                         "logprobs": None, "finish_reason": finish}
            if self.engine.flavour == "sglang":
                choice["matched_stop"] = None
            else:
                choice["stop_reason"] = None
            yield {**head, "choices": [choice]}

    def _usage_chunk(self, reply: Reply, chat: bool, ident: str, created: int) -> dict[str, object]:
        # SGLang's UsageInfo is dumped whole for chat (model_dump_json()), without the None fields for completions
        # (model_dump_json(exclude_none=True)); vLLM excludes None fields in both.
        usage: dict[str, object] = self._chat_usage(reply, whole=False) if chat else dict(reply.usage())
        if self.engine.flavour == "sglang" and not chat:
            usage["reasoning_tokens"] = reply.reasoning_words
        return {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": self.engine.served_name, "choices": [], "usage": usage}


def message_text(content: object) -> str:
    """A chat message's text: a string, or a list of content parts whose text parts are joined with newlines
    (vLLM 0.33.0 vllm/renderers/chat_utils/chat_message.py, the text a string-format chat template gets; vLLM's
    benchmark client sends its prompts as [{"type": "text", "text": ...}])."""
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content
                         if isinstance(part, dict) and part.get("type") == "text")
    return "" if content is None else str(content)


class Reply:
    """What the model generated for one request: words (one token each), how many are thinking, timing."""

    def __init__(self, words: list[str], reasoning_words: int, finish_reason: str, prompt_tokens: int,
                 seconds: float) -> None:
        self.words, self.reasoning_words = words, reasoning_words
        self.finish_reason, self.prompt_tokens, self.seconds = finish_reason, prompt_tokens, seconds

    def text(self) -> str:
        return " ".join(self.words)

    def split(self) -> tuple[str, str]:
        """(reasoning, content) as the reasoning parser separates them."""
        return " ".join(self.words[:self.reasoning_words]), " ".join(self.words[self.reasoning_words:])

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.words),
                "total_tokens": self.prompt_tokens + len(self.words)}


class EngineHTTPServer(ThreadingHTTPServer):
    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True


def load_options(flavour: str, argv: list[str]) -> dict[str, object]:
    options = parse_cli(argv)
    config_path = options.pop("config", None)
    if config_path:
        with open(str(config_path), encoding="utf-8") as handle:
            merged = parse_flat_yaml(handle.read())
        merged.update(options)
        options = merged
    if flavour == "vllm":
        options.setdefault("port", 8000)
    options.setdefault("port", 30000)
    options.setdefault("host", "127.0.0.1")
    return options


def gpu_minors(driver_proc_dir: str | None, count: int) -> list[int]:
    """Device minors of GPU indices 0..count-1 (ENGINE_DOUBLE_GPU_DRIVER_PROC_DIR)."""
    if not driver_proc_dir:
        return list(range(count))
    by_bus = {}
    gpus_dir = os.path.join(driver_proc_dir, "gpus")
    for entry in os.listdir(gpus_dir):
        with open(os.path.join(gpus_dir, entry, "information"), encoding="utf-8") as handle:
            fields = dict(line.split(":", 1) for line in handle.read().splitlines() if ":" in line)
        by_bus[entry.lower()] = int(fields["Device Minor"].strip())
    return [by_bus[bus] for bus in sorted(by_bus)][:count]


def hold_gpus(options: dict[str, object]) -> list:
    """ENGINE_DOUBLE_GPU_DEV_DIR: open this rank's stand-in GPU device files and keep them open (see the docstring)."""
    dev_dir = os.environ.get("ENGINE_DOUBLE_GPU_DEV_DIR")
    if not dev_dir:
        return []
    world = int(options.get("tp-size") or options.get("tensor-parallel-size") or 1) * int(
        options.get("pp-size") or options.get("pipeline-parallel-size") or 1)
    count = max(1, world // int(options.get("nnodes") or 1))
    minors = gpu_minors(os.environ.get("ENGINE_DOUBLE_GPU_DRIVER_PROC_DIR"), count)
    if len(minors) < count:
        raise SystemExit(f"engine-double: {count} GPUs needed, {len(minors)} simulated in {dev_dir}")
    names = ["nvidiactl", "nvidia-uvm", *(f"nvidia{minor}" for minor in minors)]
    files = [open(os.path.join(dev_dir, name), "rb") for name in names]  # noqa: SIM115 (held for the process's life)
    print(f"engine-double: holds simulated GPUs {list(range(count))} (device minors {minors}, stand-in device files "
          f"in {dev_dir}; NVSIM_MEM_MIB={os.environ.get('NVSIM_MEM_MIB', '')})", flush=True)
    return files


def detect_flavour(argv0: str) -> str:
    explicit = os.environ.get("ENGINE_DOUBLE_FLAVOUR")
    if explicit:
        return explicit
    return "vllm" if "vllm" in os.path.basename(argv0) else "sglang"


def sglang_sigterm(engine: Engine) -> None:
    """SGLang 0.5.23 managers/tokenizer_manager.py SignalHandler.sigterm_handler + sigterm_watchdog: drain the requests
    in flight without a limit, then exit; at once when a health check has failed (UnHealthy). SGLang looks every 5 s;
    the double every 0.5 s, and at once when idle."""
    print("engine-double: SIGTERM received. Draining requests and shutting down...", flush=True)
    engine.gracefully_exit = True

    def watchdog() -> None:
        while True:
            if engine.unhealthy:
                print("engine-double: Signal SIGTERM received while health check failed. Force exiting.", flush=True)
                os._exit(0)
            with engine.lock:
                remaining = engine.in_flight
            print(f"engine-double: Gracefully exiting... Remaining number of requests {remaining}.", flush=True)
            if remaining == 0:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watchdog, daemon=True).start()


def main(argv: list[str]) -> int:
    flavour = detect_flavour(argv[0])
    args = argv[1:]
    if args[:1] == ["--version"]:
        print(f"{flavour} {VERSIONS[flavour]} - {DOUBLE_MARKER}")
        return 0
    if args[:1] != ["serve"]:
        print(f"usage: {argv[0]} serve [--config FILE] [options]  ({DOUBLE_MARKER})", file=sys.stderr)
        return 2
    options = load_options(flavour, args[1:])
    engine = Engine(flavour, options)
    print(f"{DOUBLE_MARKER}: {flavour} flavour, model {engine.model_path}, "
          f"fault={engine.fault}, speculative steps={engine.spec_steps}", flush=True)
    if engine.fault == "crash-at-start":
        time.sleep(0.3)
        print("engine-double: simulated crash during model load", file=sys.stderr, flush=True)
        return 1
    engine.gpu_files = hold_gpus(options)
    # The first forward (warm-up, CUDA-graph capture) builds its kernels before the HTTP server serves, silently.
    engine.kernels.build("start", engine.kernels.start_s)
    if engine.kernels.start_s:
        engine.ready_at = max(engine.ready_at, time.monotonic())
    if engine.fault == "ignore-sigterm":
        signal.signal(signal.SIGTERM, lambda *_: print("engine-double: ignoring SIGTERM", flush=True))
    elif flavour == "sglang" and not int(options.get("node-rank") or 0):
        signal.signal(signal.SIGTERM, lambda *_: sglang_sigterm(engine))
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    Handler.engine = engine
    server = EngineHTTPServer((str(options["host"]), int(options["port"])), Handler)
    if engine.fault == "crash-after-ready":
        threading.Timer(float(os.environ.get("ENGINE_DOUBLE_START_S", "0.5")) + 2.0,
                        lambda: os._exit(3)).start()
    print(f"engine-double: listening on {options['host']}:{options['port']}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
