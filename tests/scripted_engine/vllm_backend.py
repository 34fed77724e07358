"""SCRIPTED ENGINE CORE for vLLM 0.33.0: everything above the GPU is vLLM's own code.

What runs for real (in the API server process, unchanged): the `vllm serve` CLI parser, `AsyncEngineArgs`
-> `create_engine_config()`, the FastAPI app (middleware incl. API-key auth, every router incl. SageMaker's
`/invocations`), the serving classes, chat template rendering, the kimi_k2 reasoning and tool parsers, and
`AsyncLLM` itself: its `InputProcessor` (tokenisation, SamplingParams incl. generation_config EOS ids), its
`OutputProcessor` (incremental detokenizer, stop strings, RequestOutput assembly) and its stat loggers
(`StatLoggerManager` -> `PrometheusStatLogger`, so `/metrics` carries the real `vllm:` series).

What is scripted: the EngineCore process. `AsyncLLM.__init__` obtains its engine-core client from
`EngineCoreClient.make_async_mp_client(...)` (vllm/v1/engine/core_client.py); `install()` replaces that
static method so that it returns `ScriptedEngineCoreClient`, which speaks the same client protocol
(`add_request_async`, `abort_requests_async`, `get_output_async` -> `EngineCoreOutputs`, utility calls)
but, instead of ZMQ sockets to a forked EngineCoreProc with a scheduler and GPU workers, runs one
"engine-core" thread that imitates the scheduler's per-step output (vllm/v1/core/sched/scheduler.py,
`Scheduler.update_from_output` / `make_stats`) with the tokens `script.py` decides.

Imitated upstream behaviour (vLLM 0.33.0 file: what):
- v1/engine/utils.py `wait_for_engine_startup`: the front end waits for the core's READY with no bound of its own
  (a poll loop of STARTUP_POLL_PERIOD_MS that ends only on READY or when a core process exits): a core that
  hangs while it loads keeps the server silent for ever, which only a stall bound outside it (the deploy's) ends;
  one that dies before ready -> RuntimeError("Engine core initialization failed. See root cause above. Failed
  core proc(s): {...}"). VLLM_ENGINE_READY_TIMEOUT_S bounds only the input-socket poll of
  v1/engine/core_client.py `MPClient.__init__`, after every core has sent READY: it never bounds a load.
- v1/engine/core_client.py `MPClient.__init__` + `_apply_ready_response`: sync num_gpu_blocks / block_size /
  max_model_len back into the front end's VllmConfig. The upstream `_apply_ready_response` itself is called on an
  `EngineCoreReadyResponse` we build.
- v1/core/sched/utils.py `check_stop`: EOS (sampling_params.eos_token_id), stop_token_ids (stop_reason = the
  token), max_tokens / max_model_len -> LENGTH, min_tokens.
- v1/core/sched/scheduler.py: EngineCoreEvent QUEUED at add, SCHEDULED at first schedule; `PrefillStats` on
  the first output; `SchedulerStats` (num_running/waiting, kv_cache_usage, PrefixCacheStats,
  SpecDecodingStats via `make_spec_decoding_stats` -> `SpecDecodingStats.observe_draft`) after each step;
  `RequestSpecDecodeMetrics` on the final output when per-request spec metrics are on.
- v1/engine/core_client.py AsyncMPClient: engine death -> `resources.engine_dead` and `EngineDeadError` from
  `get_output_async`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import msgspec
import numpy as np
import torch
from vllm.v1.engine import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreReadyResponse,
    EngineCoreRequest,
    FinishReason,
)
from vllm.v1.engine.core_client import EngineCoreClient, MPClient
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.metrics.stats import PrefillStats, PrefixCacheStats, RequestSpecDecodeMetrics, SchedulerStats
from vllm.v1.outputs import LogprobsLists, LogprobsTensors
from vllm.v1.spec_decode.metrics import SpecDecodingStats

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script import Script

logger = logging.getLogger("vllm.scripted_engine")

# KV capacity the scripted "GPU" reports in its ready message (upstream: profiled free memory / block bytes).
KV_CACHE_TOKENS = int(os.environ.get("SCRIPTED_ENGINE_KV_TOKENS", "262144"))
# What the scripted engine emits once a reply is used up but the request must go on (ignore_eos, min_tokens).
FILLER_TEXT = "ok"


@dataclass(eq=False)  # identity semantics: requests are kept in sets
class _Req:
    req: EngineCoreRequest
    prompt_ids: list[int]
    plan: list[int] = field(default_factory=list)  # the reply's token ids, in order
    filler: list[int] = field(default_factory=list)
    endless: bool = False
    out_ids: list[int] = field(default_factory=list)
    events: list[EngineCoreEvent] = field(default_factory=list)
    scheduled: bool = False
    spec_metrics: RequestSpecDecodeMetrics | None = None

    def next_token(self) -> int:
        i = len(self.out_ids)
        if i < len(self.plan):
            return self.plan[i]
        if self.endless and self.plan:
            return self.plan[i % len(self.plan)]
        return self.filler[i % len(self.filler)] if self.filler else 0


class ScriptedEngineCoreClient(EngineCoreClient):
    """An AsyncMPClient look-alike whose engine core is a thread running `script.py`."""

    def __init__(self, vllm_config, executor_class, log_stats: bool,  # noqa: PLR0917  (AsyncMPClient's signature)
                 client_addresses=None, client_count: int = 1, client_index: int = 0, renderer=None) -> None:
        self.vllm_config = vllm_config
        self.log_stats = log_stats
        self.client_index = client_index
        self._renderer = renderer
        # Attributes AsyncLLM and the upstream _apply_ready_response read (core_client.py MPClient.__init__).
        self.resources = SimpleNamespace(engine_dead=False)
        self.engine_ranks_managed = [0]
        self.engines_running = False
        self.stats_update_address = None
        self.coordinator_input_address = None
        self.coordinator_output_address = None
        self._effective_attention_block_sizes: set[int | None] = set()
        self._kv_event_sources: dict = {}

        spec = vllm_config.speculative_config
        self.num_spec_tokens = int(spec.num_speculative_tokens) if spec is not None else 0
        self.spec_metrics_level = getattr(vllm_config.observability_config, "per_request_spec_decode_metrics",
                                          "none") or "none"
        self.script = Script.from_env(speculative_steps=self.num_spec_tokens, engine="vllm")
        self.max_model_len = vllm_config.model_config.max_model_len

        self._loop = asyncio.get_running_loop()
        self._outputs: asyncio.Queue = asyncio.Queue()
        self._inbox: queue.Queue = queue.Queue()
        self._paused = False
        self._stop = threading.Event()

        # "Engine core process" start-up: the script's on_start (load time, crash, hang) in its own thread;
        # the front end waits for its ready message like MPClient does (blocking, the event loop included).
        if renderer is not None:
            renderer.start_mm_warmup_in_background()  # MPClient._start_mm_warmup (no-op for text models)
        failure: list[BaseException] = []

        def start():
            try:
                self.script.on_start(log=lambda m: logger.warning("%s", m))
            except BaseException as e:  # SystemExit(1) = the core process exited
                failure.append(e)

        starter = threading.Thread(target=start, name="EngineCore_DP0-start", daemon=True)
        starter.start()
        starter.join()  # wait_for_engine_startup: no bound of its own
        if failure:
            code = failure[0].code if isinstance(failure[0], SystemExit) else 1
            raise RuntimeError("Engine core initialization failed. See root cause above. "
                               f"Failed core proc(s): {{'EngineCore_DP0': {code}}}")

        cache = vllm_config.cache_config
        block_size = cache.block_size or 16
        num_blocks = max(1, KV_CACHE_TOKENS // block_size)
        self.num_blocks, self.block_size = num_blocks, block_size
        parallel = vllm_config.parallel_config
        sched = vllm_config.scheduler_config
        ready = EngineCoreReadyResponse(
            max_model_len=self.max_model_len, num_gpu_blocks=num_blocks, block_size=block_size,
            dp_stats_address=None, dtype=str(vllm_config.model_config.dtype).removeprefix("torch."),
            vllm_version="0.33.0", world_size=parallel.world_size, data_parallel_size=parallel.data_parallel_size,
            tensor_parallel_size=parallel.tensor_parallel_size,
            pipeline_parallel_size=parallel.pipeline_parallel_size,
            decode_context_parallel_size=getattr(parallel, "decode_context_parallel_size", 1),
            data_parallel_rank=0, max_num_seqs=sched.max_num_seqs,
            max_num_batched_tokens=sched.max_num_batched_tokens, instance_id=getattr(vllm_config, "instance_id", ""),
            supports_lora=vllm_config.lora_config is not None, max_loras=0,
            kv_cache_size_tokens=num_blocks * block_size,
            kv_cache_max_concurrency=num_blocks * block_size / self.max_model_len,
            effective_attention_block_size=block_size)
        # The upstream code that applies the engine's ready message to the front end's config.
        MPClient._apply_ready_response(self, msgspec.msgpack.encode(ready))

        self.tokenizer = renderer.get_tokenizer() if renderer is not None else None
        self._filler = self.tokenizer.encode(FILLER_TEXT, add_special_tokens=False) if self.tokenizer else []
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>") if self.tokenizer else None
        unk = getattr(self.tokenizer, "unk_token_id", None) if self.tokenizer else None
        self._end_of_turn = end if isinstance(end, int) and end != unk else None
        self._thread = threading.Thread(target=self._run, name="EngineCore_DP0", daemon=True)
        self._thread.start()
        logger.info("scripted engine core ready: %d KV blocks of %d tokens, %d speculative tokens",
                    num_blocks, block_size, self.num_spec_tokens)

    # --- the client protocol (core_client.py AsyncMPClient) -------------------------------------------------
    def shutdown(self, timeout: float | None = None) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        self.resources.engine_dead = True  # BackgroundResources.__call__ marks the engine dead on shutdown

    def dp_engines_running(self) -> bool:
        return self.engines_running

    def get_kv_event_sources(self):
        return {}

    async def get_output_async(self) -> EngineCoreOutputs:
        item = await self._outputs.get()
        if isinstance(item, BaseException):
            raise item
        return item

    async def get_supported_tasks_async(self):
        return ("generate",)  # EngineCore.get_supported_tasks for a generative model

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        if self.resources.engine_dead:
            raise EngineDeadError()
        self._inbox.put(("add", request))

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        if request_ids and not self.resources.engine_dead:
            self._inbox.put(("abort", list(request_ids)))

    async def pause_scheduler_async(self, mode="abort", clear_cache: bool = True) -> None:
        await self.pause_generation_async(mode, clear_cache)

    async def pause_generation_async(self, mode="abort", clear_cache: bool = True) -> None:
        self._paused = True
        self._inbox.put(("pause", mode))

    async def resume_scheduler_async(self) -> None:
        self._paused = False
        self._inbox.put(("wake", None))

    async def is_scheduler_paused_async(self) -> bool:
        return self._paused

    async def profile_async(self, *args, **kwargs) -> None:
        return None

    async def reset_mm_cache_async(self) -> None:
        return None

    async def reset_prefix_cache_async(self, *args, **kwargs) -> bool:
        return True

    async def reset_encoder_cache_async(self) -> None:
        return None

    async def sleep_async(self, level: int = 1, mode="abort") -> None:
        return None

    async def release_kv_cache_memory_async(self) -> None:
        return None

    async def wake_up_async(self, tags=None) -> bool:
        return True

    async def is_sleeping_async(self) -> bool:
        return False

    async def execute_dummy_batch_async(self) -> None:
        return None

    _weight_version = "0"

    async def set_weight_version_async(self, weight_version: str) -> None:
        self._weight_version = weight_version

    async def get_weight_version_async(self) -> str:
        return self._weight_version

    async def add_lora_async(self, lora_request) -> bool:
        return False

    async def remove_lora_async(self, lora_id: int) -> bool:
        return False

    async def list_loras_async(self) -> set[int]:
        return set()

    async def pin_lora_async(self, lora_id: int) -> bool:
        return False

    async def collective_rpc_async(self, *args, **kwargs):
        return []

    async def compute_weight_checksums_async(self):
        return []

    async def get_status(self):
        return {"engine_dead": self.resources.engine_dead, "paused": self._paused}

    # --- the "engine core process": a scheduler loop over script.py -----------------------------------------
    def _emit(self, item) -> None:
        self._loop.call_soon_threadsafe(self._outputs.put_nowait, item)

    def _plan(self, r: _Req) -> None:
        """What the "model" will say: script.py's reply to the prompt as rendered (chat template included)."""
        sp = r.req.sampling_params
        max_new = sp.max_tokens if sp is not None and sp.max_tokens is not None else 16
        text = self.tokenizer.decode(r.prompt_ids, skip_special_tokens=False) if self.tokenizer else ""
        # vLLM samples unless temperature < _SAMPLING_EPS (vllm/sampling_params.py sampling_type: GREEDY).
        self.script.before_generate(sampled=sp is not None and sp.temperature is not None and sp.temperature >= 1e-5)
        reply = self.script.reply(text, max_new)
        r.plan = list(self.tokenizer.encode(reply.text, add_special_tokens=False)) if self.tokenizer else []
        r.endless = reply.endless
        if not reply.endless:
            # The real model closes its turn: Kimi emits <|im_end|> (a generation_config EOS id -> stop_token_ids);
            # models without it emit the tokenizer's EOS.
            end = self._end_of_turn if self._end_of_turn is not None else (
                sp.eos_token_id if sp is not None and sp.eos_token_id is not None
                else getattr(self.tokenizer, "eos_token_id", None))
            if end is not None:
                r.plan.append(end)
        r.filler = self._filler

    # The "model" is sure of its token: p = 0.9, the rest spread evenly (vllm/v1/sample/sampler.py
    # gather_logprobs layout: column 0 the sampled/actual token, then the top-k, or the requested
    # logprob_token_ids; ranks are 1-based).
    def _logprob_row(self, token: int, k: int, fixed: list[int] | None) -> tuple[list[int], list[float], int]:
        vocab = len(self.tokenizer) if self.tokenizer is not None else token + 1
        top = math.log(0.9)
        rest = math.log(0.1 / max(vocab - 1, 1))
        if fixed:
            ids = list(fixed)
        else:
            k = vocab if k < 0 else k
            ids = ([token] + [i for i in range(vocab) if i != token])[:k]
        return [token, *ids], [top] + [top if i == token else rest for i in ids], 1

    def _sample_logprobs(self, r: _Req, new_ids: list[int]) -> LogprobsLists | None:
        sp = r.req.sampling_params
        fixed = getattr(sp, "logprob_token_ids", None) if sp is not None else None
        if sp is None or (sp.logprobs is None and not fixed) or not new_ids:
            return None
        rows = [self._logprob_row(t, sp.logprobs if sp.logprobs is not None else 0, fixed) for t in new_ids]
        return LogprobsLists(np.array([x[0] for x in rows], dtype=np.int64),
                             np.array([x[1] for x in rows], dtype=np.float32),
                             np.array([x[2] for x in rows], dtype=np.int64))

    def _prompt_logprobs(self, r: _Req) -> LogprobsTensors | None:
        sp = r.req.sampling_params
        if sp is None or sp.prompt_logprobs is None or len(r.prompt_ids) < 2:
            return None
        rows = [self._logprob_row(t, sp.prompt_logprobs, None) for t in r.prompt_ids[1:]]
        return LogprobsTensors(torch.tensor([x[0] for x in rows], dtype=torch.int64),
                               torch.tensor([x[1] for x in rows], dtype=torch.float32),
                               torch.tensor([x[2] for x in rows], dtype=torch.int64))

    def _accept(self, r: _Req, token: int) -> tuple[bool, FinishReason | None, int | str | None]:
        """Append one sampled token and run vllm/v1/core/sched/utils.py check_stop on it."""
        sp = r.req.sampling_params
        if sp is not None and len(r.out_ids) < (sp.min_tokens or 0) and token in sp.all_stop_token_ids:
            token = r.filler[0] if r.filler else token  # min_tokens masks stop tokens in the sampler
        r.out_ids.append(token)
        if sp is None:
            return True, FinishReason.STOP, None
        if token == sp.eos_token_id:
            return True, FinishReason.STOP, None
        if token in (sp.stop_token_ids or ()):
            return True, FinishReason.STOP, token
        max_tokens = sp.max_tokens if sp.max_tokens is not None else self.max_model_len
        if len(r.prompt_ids) + len(r.out_ids) >= self.max_model_len or len(r.out_ids) >= max_tokens:
            return True, FinishReason.LENGTH, None
        return False, None, None

    def _run(self) -> None:
        try:
            self._loop_body()
        except BaseException:  # the core process died: AsyncMPClient reports EngineDeadError
            if not self._stop.is_set():
                logger.exception("scripted EngineCore died")
                self.resources.engine_dead = True
                self._emit(EngineDeadError())

    def _loop_body(self) -> None:
        waiting: list[_Req] = []
        running: list[_Req] = []
        new_prefix_stats = PrefixCacheStats()
        while not self._stop.is_set():
            # 1) Inputs (EngineCoreProc.process_input_sockets -> _handle_client_request).
            block = not waiting and not running
            while True:
                try:
                    kind, payload = self._inbox.get(block=block, timeout=0.5 if block else None)
                except queue.Empty:
                    break
                block = False
                if kind == "add":
                    req: EngineCoreRequest = payload
                    r = _Req(req=req, prompt_ids=list(req.prompt_token_ids or []))
                    r.events.append(EngineCoreEvent.new_event(EngineCoreEventType.QUEUED))
                    if self.num_spec_tokens and self.spec_metrics_level != "none":
                        r.spec_metrics = RequestSpecDecodeMetrics.new(self.num_spec_tokens)
                    waiting.append(r)
                elif kind == "abort":
                    ids = set(payload)
                    before = len(waiting) + len(running)
                    waiting = [r for r in waiting if r.req.request_id not in ids]
                    running = [r for r in running if r.req.request_id not in ids]
                    if len(waiting) + len(running) < before and self.log_stats:
                        # Scheduler.finish_requests keeps aborted requests "to be removed from the batch", so
                        # has_requests() stays true for one more (empty) step whose stats show them gone.
                        self._emit(EngineCoreOutputs(outputs=[], scheduler_stats=self._stats(
                            running, waiting, PrefixCacheStats(), None)))
                elif kind == "pause" and payload == "abort":
                    # Scheduler pause in "abort" mode finishes everything in flight as ABORT.
                    outs = [EngineCoreOutput(request_id=r.req.request_id, new_token_ids=[],
                                             finish_reason=FinishReason.ABORT) for r in waiting + running]
                    waiting, running = [], []
                    if outs:
                        self._emit(EngineCoreOutputs(outputs=outs, scheduler_stats=self._stats(
                            [], [], PrefixCacheStats(), None)))
            if self._stop.is_set():
                return
            if self._paused or not (waiting or running):
                continue

            # 2) Schedule: admit waiting requests up to max_num_seqs (prefill = first sampled token).
            max_seqs = self.vllm_config.scheduler_config.max_num_seqs
            admitted: list[_Req] = []
            while waiting and len(running) + len(admitted) < max_seqs:
                r = waiting.pop(0)
                r.events.append(EngineCoreEvent.new_event(EngineCoreEventType.SCHEDULED))
                self._plan(r)  # script.before_generate() may block here for ever (deadlock fault)
                admitted.append(r)
                new_prefix_stats.record(num_tokens=len(r.prompt_ids), num_hits=0, preempted=False)

            # 3) Model step: one forward of the batch; speculation verifies drafts on decoding sequences.
            step_s = 0.0
            spec_stats = None
            outputs: list[EngineCoreOutput] = []
            finished: set[_Req] = set()
            per_req: list[tuple[_Req, int, int]] = []
            for r in running:
                n, accepted, seconds = self.script.step()
                step_s = max(step_s, seconds)
                per_req.append((r, n, accepted))
            for r in admitted:
                _, _, seconds = self.script.step()
                step_s = max(step_s, seconds)
                per_req.append((r, 1, -1))  # prefill: one token, no draft verified yet
            if step_s > 0:
                time.sleep(step_s)
            for r, n, accepted in per_req:
                new_ids: list[int] = []
                done, reason, stop_reason = False, None, None
                for _ in range(n):
                    tok = r.next_token()
                    done, reason, stop_reason = self._accept(r, tok)
                    new_ids.append(r.out_ids[-1])
                    if done:
                        break
                if accepted >= 0 and self.num_spec_tokens:
                    # Scheduler.update_from_output: num_accepted = sampled - 1 (before the stop check truncates),
                    # num_draft = the scheduled spec tokens.
                    if self.log_stats:
                        if spec_stats is None:
                            spec_stats = SpecDecodingStats.new(self.num_spec_tokens)
                        spec_stats.observe_draft(num_draft_tokens=self.num_spec_tokens,
                                                 num_accepted_tokens=accepted)
                    if r.spec_metrics is not None:
                        r.spec_metrics.observe(num_draft_tokens=self.num_spec_tokens,
                                               num_accepted=accepted,
                                               detailed=self.spec_metrics_level == "detailed")
                prefill_stats = None
                if accepted < 0:
                    prefill_stats = PrefillStats()
                    prefill_stats.set(num_prompt_tokens=len(r.prompt_ids), num_local_cached_tokens=0,
                                      num_external_cached_tokens=0)
                    prefill_stats.finalize(0)
                events, r.events = (r.events or None), []
                outputs.append(EngineCoreOutput(
                    request_id=r.req.request_id, new_token_ids=new_ids, finish_reason=reason,
                    stop_reason=stop_reason, events=events, prefill_stats=prefill_stats,
                    new_logprobs=self._sample_logprobs(r, new_ids),
                    new_prompt_logprobs_tensors=self._prompt_logprobs(r) if accepted < 0 else None,
                    spec_decode_metrics=r.spec_metrics if reason is not None else None,
                    trace_headers=r.req.trace_headers))
                if done:
                    finished.add(r)
            running = [r for r in running + admitted if r not in finished]
            stats = self._stats(running, waiting, new_prefix_stats, spec_stats)
            new_prefix_stats = PrefixCacheStats()
            self.engines_running = bool(running or waiting)
            self._emit(EngineCoreOutputs(outputs=outputs, scheduler_stats=stats, timestamp=time.monotonic(),
                                         finished_requests={r.req.request_id for r in finished} or None))

    def _stats(self, running, waiting, prefix_stats, spec_stats) -> SchedulerStats | None:
        """Scheduler.make_stats, with the KV usage a paged cache of this size would show."""
        if not self.log_stats:
            return None
        used = sum(math.ceil((len(r.prompt_ids) + len(r.out_ids)) / self.block_size) for r in running)
        return SchedulerStats(num_running_reqs=len(running), num_waiting_reqs=len(waiting),
                              kv_cache_usage=min(1.0, used / self.num_blocks), prefix_cache_stats=prefix_stats,
                              spec_decoding_stats=spec_stats)


def install() -> None:
    """Make AsyncLLM build a ScriptedEngineCoreClient instead of forking EngineCoreProc (core_client.py)."""

    def make_async_mp_client(vllm_config, executor_class, log_stats,  # noqa: PLR0917  (the upstream signature)
                             client_addresses=None, client_count=1, client_index=0, renderer=None):
        if vllm_config.parallel_config.data_parallel_size > 1:
            raise NotImplementedError("scripted engine: data parallelism is not scripted")
        return ScriptedEngineCoreClient(vllm_config, executor_class, log_stats, client_addresses, client_count,
                                        client_index, renderer=renderer)

    EngineCoreClient.make_async_mp_client = staticmethod(make_async_mp_client)
