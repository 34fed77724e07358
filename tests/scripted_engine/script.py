"""SCRIPTED MODEL: what the scripted backend under the real SGLang / vLLM front ends "generates".

This is the only part of the test engine that is not the engines' own code: the GPU work. The front ends
(HTTP servers, tokenizer and detokenizer, reasoning parsers, metrics) are SGLang's and vLLM's; below them
`sglang_scheduler.py` and `vllm_backend.py` ask this script which tokens to emit and how long each step takes.

The "model" answers an arithmetic question ("What is 123 + 456?") with the number, thinking first when the
chat template left the generation prompt open on `<think>` (Kimi-K2.5's template closes it with
`<think></think>` when the request says `thinking: false`), and otherwise emits `ok` until max_new_tokens:
the benchmark's ignore-eos workload. Stdlib only.

Faults (SCRIPTED_ENGINE_FAULT), as the light double has them (tests/doubles/engine_double.py):
    none                  serve normally
    crash-at-start        the backend exits 1 before it reports ready (the front end's own reaction follows)
    never-ready           the backend never reports ready (a load that never ends)
    startup-hang          never ready, and says what a vLLM worker waiting on a stuck peer says every
                          SCRIPTED_ENGINE_WARN_S seconds (see STARTUP_HANG_WARNING)
    slow-load             before ready, reads SCRIPTED_ENGINE_LOAD_FILE (default: this file) for
                          SCRIPTED_ENGINE_LOAD_S seconds (default 60) and logs nothing meanwhile: a cold weight load
                          whose progress bar reaches the journal only when it ends. The file is dropped from the page
                          cache before each read (posix_fadvise DONTNEED), so every read reaches the disk: the bytes
                          read by the process are its only sign of progress
    deadlock-on-generate  every generation after the first SCRIPTED_ENGINE_DEADLOCK_AFTER (default 0) blocks for
                          ever, and with it the scheduler (a kernel or collective deadlock); 1 lets SGLang's
                          warm-up request through, so the engine reports ready and then hangs
    garbage-output        every token is "foss" until max_new_tokens (sglang issue 23264's broken MoE path)
    slow-first-request    the first generation waits SCRIPTED_ENGINE_FIRST_REQUEST_S first
    sampler-hang          a sampled generation (temperature > 0) blocks for ever, and with it the scheduler; greedy
                          ones are served (FlashInfer's top-k/top-p sampler hanging a CUDA stream on SM120,
                          vllm#43885: greedy decoding never calls the sampler). With SCRIPTED_ENGINE_COMPILE_SAMPLED_S
                          it hangs after its kernels are built: a sampler that hangs after its compile
    compile-stall         a kernel build (below) stops working after SCRIPTED_ENGINE_COMPILE_STALL_AFTER_S (default
                          1): its compiler lives, idle, and the start or the generation waits on it for ever
Kernels built on first use, silently, by the compiler TEST DOUBLE (tests/doubles/compiler_double.py: a process named
cicc in a process group of its own, as SGLang's ninja runs its compilers, sglang/kernels/jit/utils/compile/ninja.py),
with an empty kernel cache only (SCRIPTED_ENGINE_KERNEL_CACHE; default the service user's, as the engine's: SGLang
0.5.23 ~/.cache/sglang/jit, sglang/kernels/jit/utils/compile/cache.py; vLLM 0.33.0 ~/.cache/vllm, vllm/envs.py):
    SCRIPTED_ENGINE_COMPILE_START_S    seconds of build before the backend reports ready (default 0: none): SGLang
                          0.5.23 builds most kernels on first use (about 210 `load_jit(` call sites under
                          sglang/kernels/ops), serially, inside the first forward, logged at debug level only
                          (sglang/kernels/jit/utils/compile/loader.py); vLLM's torch.compile, Triton and CUDA-graph
                          capture are as silent
    SCRIPTED_ENGINE_COMPILE_SAMPLED_S  seconds of build at the first sampled generation (default 0: none): with
                          EAGLE-3, SGLang's first sampled request builds FlashInfer's `sampling` module (a lazy import
                          in sglang/kernels/ops/sampling/renorm.py) and SGLang's tree_speculative_sampling_target_only
                          (sglang/kernels/ops/speculative/sampling.py); greedy generations never build
    SCRIPTED_ENGINE_COMPILER           the compiler double (default: tests/doubles/compiler_double.py of this tree)
Speed: SCRIPTED_ENGINE_TOKENS_PER_S (decode steps per second of one sequence, default 400); with speculation
each step yields 1 + the accepted draft tokens (SCRIPTED_ENGINE_ACCEPT_RATE per position, default 0.6) and
costs SCRIPTED_ENGINE_SPEC_COST plain steps (default 1.3). SCRIPTED_ENGINE_START_S: load time (default 0).
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import threading
import time
from dataclasses import dataclass, field

FAULTS = ("none", "crash-at-start", "never-ready", "startup-hang", "slow-load", "deadlock-on-generate",
          "garbage-output", "slow-first-request", "sampler-hang", "compile-stall")
KERNEL_CACHE = {"sglang": "~/.cache/sglang/jit", "vllm": "~/.cache/vllm"}
COMPILER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "doubles", "compiler_double.py")
# slow-load: the bytes of one read, and the pause between reads.
LOAD_READ_BYTES, LOAD_PAUSE_S = 1 << 20, 0.2
ARITHMETIC = re.compile(r"(-?\d+)\s*([-+*])\s*(-?\d+)")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# vLLM 0.33.0 vllm/distributed/device_communicators/shm_broadcast.py (MessageQueue.acquire_read/acquire_write):
# logged every VLLM_RINGBUFFER_WARNING_INTERVAL (60 s) while a worker waits on a peer that never answers.
STARTUP_HANG_WARNING = ("No available shared memory broadcast block found in {interval} seconds. This typically "
                        "happens when some processes are hanging or doing some time-consuming work (e.g. "
                        "compilation, weight/kv cache quantization).")


def _env_float(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name, "")
    try:
        return float(raw) if raw else default
    except ValueError:
        raise SystemExit(f"scripted engine: {name}={raw!r} is not a number") from None


@dataclass
class Reply:
    """One generation as text: the backend encodes it with the served model's tokenizer and emits its tokens.

    `endless` replies never reach EOS (the ignore-eos workload, garbage): they run to max_new_tokens.
    """

    text: str
    endless: bool = False


@dataclass
class Script:
    fault: str = "none"
    start_s: float = 0.0
    first_request_s: float = 10.0
    deadlock_after: int = 0
    warn_s: float = 60.0
    load_s: float = 60.0
    load_file: str = ""
    tokens_per_s: float = 400.0
    accept_rate: float = 0.6
    spec_cost: float = 1.3
    speculative_steps: int = 0
    compile_start_s: float = 0.0
    compile_sampled_s: float = 0.0
    compile_stall_after_s: float = 1.0
    kernel_cache: str = ""
    compiler: str = ""
    seed: int = 0
    _generations: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _build_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            known = ", ".join(FAULTS)
            raise SystemExit(f"scripted engine: unknown SCRIPTED_ENGINE_FAULT {self.fault!r} (known: {known})")
        self.rng = random.Random(self.seed)

    @classmethod
    def from_env(cls, speculative_steps: int = 0, env: dict[str, str] | None = None, engine: str = "sglang") -> Script:
        env = dict(os.environ if env is None else env)
        return cls(fault=env.get("SCRIPTED_ENGINE_FAULT", "none") or "none",
                   start_s=_env_float(env, "SCRIPTED_ENGINE_START_S", 0.0),
                   first_request_s=_env_float(env, "SCRIPTED_ENGINE_FIRST_REQUEST_S", 10.0),
                   deadlock_after=int(_env_float(env, "SCRIPTED_ENGINE_DEADLOCK_AFTER", 0)),
                   warn_s=_env_float(env, "SCRIPTED_ENGINE_WARN_S", 60.0),
                   load_s=_env_float(env, "SCRIPTED_ENGINE_LOAD_S", 60.0),
                   load_file=env.get("SCRIPTED_ENGINE_LOAD_FILE", ""),
                   tokens_per_s=_env_float(env, "SCRIPTED_ENGINE_TOKENS_PER_S", 400.0),
                   accept_rate=_env_float(env, "SCRIPTED_ENGINE_ACCEPT_RATE", 0.6),
                   spec_cost=_env_float(env, "SCRIPTED_ENGINE_SPEC_COST", 1.3),
                   speculative_steps=speculative_steps,
                   compile_start_s=_env_float(env, "SCRIPTED_ENGINE_COMPILE_START_S", 0.0),
                   compile_sampled_s=_env_float(env, "SCRIPTED_ENGINE_COMPILE_SAMPLED_S", 0.0),
                   compile_stall_after_s=_env_float(env, "SCRIPTED_ENGINE_COMPILE_STALL_AFTER_S", 1.0),
                   kernel_cache=os.path.expanduser(env.get("SCRIPTED_ENGINE_KERNEL_CACHE") or KERNEL_CACHE[engine]),
                   compiler=env.get("SCRIPTED_ENGINE_COMPILER") or COMPILER)

    # --- start-up -------------------------------------------------------------------------------------------
    def on_start(self, log=None) -> None:
        """Called by the backend before it reports ready: loads, crashes or never returns, as the fault says."""
        log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        if self.fault == "crash-at-start":
            log("scripted engine: crash-at-start: exiting before ready, as a failed weight load does")
            raise SystemExit(1)
        if self.fault == "never-ready":
            threading.Event().wait()
        if self.fault == "startup-hang":
            interval = int(self.warn_s) if self.warn_s == int(self.warn_s) else self.warn_s
            while True:
                time.sleep(self.warn_s)
                log(STARTUP_HANG_WARNING.format(interval=interval))
        if self.fault == "slow-load":
            self.slow_load()
        self.build_kernels("start", self.compile_start_s)
        if self.start_s > 0:
            time.sleep(self.start_s)

    def slow_load(self) -> int:
        """Read the load file from disk for load_s seconds, silently; the bytes read (as the process asked them)."""
        done = 0
        end = time.monotonic() + self.load_s
        with open(self.load_file or __file__, "rb", buffering=0) as handle:
            while time.monotonic() < end:
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                done += len(os.pread(handle.fileno(), LOAD_READ_BYTES, 0))
                time.sleep(LOAD_PAUSE_S)
        return done

    def build_kernels(self, module: str, seconds: float) -> float:
        """Build a module with the compiler double unless the kernel cache has it (blocking, one build at a time, as
        SGLang builds serially inside its forward); the seconds it took."""
        if seconds <= 0:
            return 0.0
        import importlib.util

        spec = importlib.util.spec_from_file_location("compiler_double", self.compiler)
        if spec is None or spec.loader is None or not os.path.exists(self.compiler):
            raise SystemExit(f"scripted engine: no compiler double at {self.compiler} (SCRIPTED_ENGINE_COMPILER)")
        compiler = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(compiler)
        stall = self.compile_stall_after_s if self.fault == "compile-stall" else None
        with self._build_lock:
            return compiler.build(os.path.join(self.kernel_cache, f"{module}.so"), seconds, stall_after=stall)

    # --- generation -------------------------------------------------------------------------------------------
    def before_generate(self, sampled: bool = False) -> None:
        """Called before each generation: blocks for ever when deadlocked (or, for a sampled one, when the sampler
        hangs), long the first time when slow."""
        with self._lock:
            self._generations += 1
            count = self._generations
        first = count == 1
        if self.fault == "deadlock-on-generate" and count > self.deadlock_after:
            threading.Event().wait()
        if sampled:
            self.build_kernels("sampling", self.compile_sampled_s)
        if self.fault == "sampler-hang" and sampled:
            threading.Event().wait()
        if first and self.fault == "slow-first-request":
            time.sleep(self.first_request_s)

    def reply(self, prompt_text: str, max_new_tokens: int) -> Reply:
        """The text answering the prompt (as rendered by the chat template, or a raw completion prompt)."""
        if self.fault == "garbage-output":
            return Reply(" ".join(["foss"] * max_new_tokens), endless=True)
        # The question is the last arithmetic in the prompt (a system prompt or earlier turns may hold others).
        matches = list(ARITHMETIC.finditer(prompt_text))
        if not matches:
            return Reply(" ".join(["ok"] * max_new_tokens), endless=True)
        left, op, right = int(matches[-1].group(1)), matches[-1].group(2), int(matches[-1].group(3))
        value = {"+": left + right, "-": left - right, "*": left * right}[op]
        answer = f"The answer is {value}."
        if prompt_text.rstrip().endswith(THINK_OPEN):  # the template left the model thinking
            return Reply(f"The user asks for {left} {op} {right}. It is {value}.{THINK_CLOSE}{answer}")
        return Reply(answer)

    def step(self) -> tuple[int, int, float]:
        """One decode step of one sequence: (tokens it yields, draft tokens accepted, seconds it costs)."""
        if not self.speculative_steps:
            return 1, 0, 1.0 / self.tokens_per_s
        accepted = 0
        with self._lock:
            while accepted < self.speculative_steps and self.rng.random() < self.accept_rate:
                accepted += 1
        return 1 + accepted, accepted, self.spec_cost / self.tokens_per_s



# --- the route table ---------------------------------------------------------------------------------------------
def route_rows(app) -> list[dict]:
    """The built app's route table, without calling anything: path, methods, route kind, endpoint function, the auth
    level the endpoint is marked with (SGLang's `@auth_level`, srt/utils/auth.py; "normal" when unmarked), whether
    the route is reached through an included router, and whether it validates a required request body before its
    handler runs. FastAPI 0.165 (SGLang's venv) keeps an included router as one
    `_IncludedRouter` entry of `app.routes`, with no path of its own: its routes are listed from its
    `effective_route_contexts()`, as the router matches them (SGLang's elastic-EP routes are included so)."""
    rows = []
    for route in app.routes:
        if hasattr(route, "effective_route_contexts"):
            rows += [_route_row(context, context.endpoint, included=True)
                     for context in route.effective_route_contexts()]
        else:
            rows.append(_route_row(route, getattr(route, "endpoint", None), included=False))
    return rows


def _route_row(route, endpoint, *, included: bool) -> dict:
    level = getattr(endpoint, "_auth_level", None)
    original = getattr(route, "original_route", None) or route
    body = getattr(original, "body_field", None)  # FastAPI: the request model a POST route validates first
    return {"path": getattr(route, "path", None) or None, "methods": sorted(getattr(route, "methods", None) or []),
            "kind": type(original).__name__,
            "endpoint": f"{endpoint.__module__}.{endpoint.__qualname__}" if endpoint else None,
            "auth_level": str(getattr(level, "value", level) or "normal"), "included": included,
            "body_required": bool(body is not None and body.field_info.is_required())}


def write_route_table(app, path: str | None = None) -> None:
    """Write the app's route table to SCRIPTED_ENGINE_ROUTES_FILE (tests/scripted_engine/front_end.py sets it), if set:
    the tests read which routes exist from the engine's own app, not from a list written here."""
    path = path or os.environ.get("SCRIPTED_ENGINE_ROUTES_FILE")
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(route_rows(app), handle, indent=1)
