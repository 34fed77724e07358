"""SCRIPTED SCHEDULER for SGLang 0.5.23: the one piece of the real server that is replaced for a CPU test.

`sglang_serve.py` runs SGLang's real HTTP server (`launch_server` in sglang/srt/entrypoints/http_server.py:
FastAPI app, auth middleware, TokenizerManager, the detokenizer subprocess, warm-up, /health, /metrics, the
OpenAI routes and parsers) and hands it `run_scripted_scheduler_process` as `run_scheduler_process_func`.
This process stands where the GPU scheduler (`run_scheduler_process` in sglang/srt/managers/scheduler.py)
stands and speaks the same protocol; what it "generates" comes from script.py (the scripted model).

What it imitates, with the upstream code it follows (all paths under python/sglang/ of 0.5.23):

  start-up    srt/managers/scheduler.py run_scheduler_process: load_plugins(), publish(server_args,
              role="scheduler", ranks=SpawnRanks(...)), configure_scheduler_process (kill_itself_when_parent_died,
              setproctitle "sglang::scheduler", faulthandler, configure_logger); then one dict on the pipe,
              Scheduler.get_init_info(): {"status": "ready", "max_total_num_tokens", "max_req_input_len",
              "startup_time", "hicache_object_layout"}; the launcher (srt/entrypoints/engine.py
              _wait_for_scheduler_ready) waits for it and copies max_req_input_len into the TokenizerManager.
              max_req_input_len as srt/managers/tp_worker.py computes it: min(context_len - 1, kv - 1) - 5.
  sockets     srt/managers/scheduler_components/ipc_channels.py SchedulerIpcChannels.create: PULL connect
              scheduler_input_ipc_name (from the TokenizerManager), DEALER connect rpc_ipc_name, PUSH connect
              tokenizer_ipc_name (control replies, AbortReq) and detokenizer_ipc_name (BatchTokenIDOutput);
              every message through srt/managers/io_struct.py sock_send / sock_recv (msgpack of the msgspec
              structs, or pickle when SGLang is told to).
  requests    Scheduler._request_dispatcher (srt/managers/scheduler.py): TokenizedGenerateReqInput and
              BatchTokenizedGenerateReqInput are generated; AbortReq ends a queued request with an AbortReq
              back to the tokenizer (Scheduler.abort_request, _make_abort_req) and a running one with
              finish reason FINISH_ABORT on its next output (schedule_batch.py FINISH_ABORT.to_json);
              GetInternalStateReq answers GetInternalStateReqOutput (scheduler_components/internal_state.py:
              the resolved server args, get_context().resolved_server_args_dict(), plus live fields);
              ShutdownReq ends the loop (Scheduler.handle_shutdown); ConfigureLoggingReq and FreezeGCReq are
              forwarded to the detokenizer as the real handlers do; every other control request the
              TokenizerManager awaits (the `_COMMUNICATOR_SPECS` of srt/managers/tokenizer_control_mixin.py)
              gets its *Output type back, unsuccessful ("not supported by the scripted engine"), so no
              endpoint hangs; RpcReqInput gets RpcReqOutput on the rpc socket (Scheduler.handle_rpc_request).
  outputs     srt/managers/scheduler_components/output_streamer.py (accept / to_payload): one
              BatchTokenIDOutput per decode step for the requests due (every step when streaming at
              stream_interval 1, else only when finished), with decode_ids/read_offsets in the incremental
              detokenization form of Req.init_incremental_detokenize (schedule_batch.py,
              INIT_INCREMENTAL_DETOKENIZATION_OFFSET = 5 prompt tokens of context), finish reasons as
              FINISH_MATCHED_TOKEN / FINISH_MATCHED_STR / FINISH_LENGTH / FINISH_ABORT .to_json(),
              SchedulerReqTimeStats per request (srt/observability/req_time_stats.py), and the speculative
              counters (spec_verify_ct, spec_num_correct_drafts, histogram) of Req when speculation is on.
              The real DetokenizerManager turns the ids into text.
  metrics     srt/observability/metrics_collector.py SchedulerMetricsCollector.init_new / log_stats
              (SchedulerStats: num_running_reqs, gen_throughput, token_usage, spec_accept_length,
              spec_accept_rate, ...) and increment_realtime_tokens, written to prometheus_client's
              multiprocess directory that the HTTP server's /metrics reads, as the real scheduler's
              metrics reporter does; the load snapshot (srt/managers/load_snapshot.py) for /v1/loads.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import signal
import sys
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script import Script

# What stands for SGLang's max_running_requests derived from its memory pool when the flag is not set.
DERIVED_MAX_RUNNING_REQUESTS = 256
logger = logging.getLogger("sglang.scripted_scheduler")

# srt/managers/schedule_batch.py INIT_INCREMENTAL_DETOKENIZATION_OFFSET
INIT_INCREMENTAL_DETOKENIZATION_OFFSET = 5
# How often SchedulerStats go to the collector (the real reporter logs every decode_log_interval steps).
STATS_INTERVAL_S = 0.5
NOT_SUPPORTED = "not supported by the scripted engine (tests/scripted_engine/sglang_scheduler.py)"


@dataclass
class ScriptedReq:
    rid: str
    http_worker_ipc: str | None
    input_ids: list
    stream: bool
    sampling: Any
    time_stats: Any
    planned: list  # token ids the script wants to emit (the EOS included when the reply ends)
    eos_ids: set
    max_new_tokens: int
    stop_strs: list
    output_ids: list = field(default_factory=list)
    finished_reason: dict | None = None
    to_abort: dict | None = None
    send_token_offset: int = 0
    send_decode_id_offset: int = 0
    surr_and_decode: list | None = None
    read_offset: int = 0
    spec_verify_ct: int = 0
    spec_num_correct_drafts: int = 0
    spec_hist: list = field(default_factory=list)
    started: bool = False
    reasoning: bool = False  # Req.require_reasoning: count output tokens through the think-end token
    reasoning_tokens: int = 0


class ScriptedScheduler:
    def __init__(self, server_args, port_args, dp_rank):
        from sglang.srt.managers.scheduler_components.output_sender import SenderWrapper
        from sglang.srt.runtime_context import get_model, get_observability, get_serving, get_spec
        from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer
        from sglang.srt.utils.network import get_zmq_socket

        self.server_args = server_args
        self.dp_rank = dp_rank if dp_rank is not None else 0
        self.t0 = time.perf_counter()
        self.startup_time = None
        spec = get_spec()
        self.spec_algorithm = getattr(spec, "speculative_algorithm", None)
        speculative = bool(self.spec_algorithm)
        self.spec_steps = int(getattr(spec, "speculative_num_steps", 0) or 0) if speculative else 0
        self.spec_draft_tokens = int(getattr(spec, "speculative_num_draft_tokens", 0) or 0) if speculative else 0
        self.script = Script.from_env(
            speculative_steps=max(self.spec_draft_tokens - 1, self.spec_steps, 0) if speculative else 0)

        # The same tokenizer the real scheduler and detokenizer load (Scheduler.init_tokenizer).
        self.tokenizer = get_tokenizer(
            get_serving().tokenizer_path,
            tokenizer_mode=get_serving().tokenizer_mode,
            trust_remote_code=get_model().trust_remote_code,
            revision=get_model().revision,
            tokenizer_backend=get_serving().tokenizer_backend,
        )
        self.eos_ids = self._eos_ids()
        # ModelConfig.think_end_ids for the reasoning-token count (Req.update_reasoning_tokens); one token here.
        think_end = self.tokenizer.convert_tokens_to_ids("</think>")
        known = isinstance(think_end, int) and think_end != self.tokenizer.unk_token_id
        self.think_end_id = think_end if known else None
        self.context_len = self._context_len()
        self.max_total_num_tokens = int(os.environ.get("SCRIPTED_ENGINE_KV_TOKENS", "200000"))
        # srt/managers/tp_worker.py: max_req_len = min(context_len - 1, kv - 1); max_req_input_len = max_req_len - 5
        # The running batch's bound: --max-running-requests as configured (srt/managers/scheduler.py
        # self.max_running_requests, reported as effective_max_running_requests_per_dp by
        # scheduler_components/internal_state.py); without it SGLang derives one from its memory pool
        # (model_executor/pool_configurator.py), which a scripted core has not: 256 stands for that.
        configured = getattr(server_args, "max_running_requests", None)
        self.max_running_requests = int(configured) if configured else DERIVED_MAX_RUNNING_REQUESTS
        self.max_req_len = min(self.context_len - 1, self.max_total_num_tokens - 1)
        self.max_req_input_len = self.max_req_len - 5

        # ipc_channels.py SchedulerIpcChannels.create (rank zero)
        ctx = zmq.Context(2)
        self.recv_from_tokenizer = get_zmq_socket(ctx, zmq.PULL, port_args.scheduler_input_ipc_name, False)
        self.recv_from_rpc = get_zmq_socket(ctx, zmq.DEALER, port_args.rpc_ipc_name, False)
        self.send_to_tokenizer = SenderWrapper(get_zmq_socket(ctx, zmq.PUSH, port_args.tokenizer_ipc_name, False))
        self.send_to_detokenizer = SenderWrapper(get_zmq_socket(ctx, zmq.PUSH, port_args.detokenizer_ipc_name, False))
        self.poller = zmq.Poller()
        self.poller.register(self.recv_from_tokenizer, zmq.POLLIN)
        self.poller.register(self.recv_from_rpc, zmq.POLLIN)

        self.waiting: list[ScriptedReq] = []
        self.running: list[ScriptedReq] = []
        self.gracefully_exit = False
        self.enable_metrics = bool(get_observability().enable_metrics)
        self.metrics_collector = None
        if self.enable_metrics:
            from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector

            self.metrics_collector = SchedulerMetricsCollector.init_new(
                server_args=server_args, enable_priority_scheduling=False, enable_lora=False,
                enable_hierarchical_cache=False).collector
        self.load_snapshot_writer = None
        try:
            from sglang.srt.managers.load_snapshot import create_load_snapshot_writer
            from sglang.srt.runtime_context import get_parallel

            self.load_snapshot_writer = create_load_snapshot_writer(
                port_args, get_parallel().num_dp_ranks, self.dp_rank, publish_interval=1)
        except Exception as e:  # the real scheduler only warns, too (Scheduler.init_ipc_channels)
            logger.warning("load snapshot writer init failed: %s", e)
        # interval counters for SchedulerStats
        self._last_stats = time.perf_counter()
        self._gen_tokens = 0
        self._spec_verify = 0
        self._spec_accepted = 0
        self._spec_verify_total = 0
        self._spec_accepted_total = 0
        self._last_throughput = 0.0
        self._dispatch = self._build_dispatch()

    # ------------------------------------------------------------------ set-up helpers
    def _eos_ids(self) -> set:
        ids = set()
        tok_eos = getattr(self.tokenizer, "eos_token_id", None)
        if tok_eos is not None:
            ids.add(int(tok_eos))
        try:
            from sglang.srt.runtime_context import get_model

            path = get_model().model_path
            for name in ("generation_config.json", "config.json"):
                fp = os.path.join(path, name)
                if os.path.exists(fp):
                    with open(fp, encoding="utf-8") as handle:
                        val = json.load(handle).get("eos_token_id")
                    for v in (val if isinstance(val, list) else [val]):
                        if v is not None:
                            ids.add(int(v))
        except Exception:
            pass
        return ids

    def _context_len(self) -> int:
        from sglang.srt.runtime_context import get_model

        ctx = getattr(get_model(), "context_length", None)
        if ctx:
            return int(ctx)
        try:
            with open(os.path.join(get_model().model_path, "config.json"), encoding="utf-8") as handle:
                return int(json.load(handle).get("max_position_embeddings", 4096))
        except Exception:
            return 4096

    def get_init_info(self) -> dict:
        # Scheduler.get_init_info (srt/managers/scheduler.py); startup_time as
        # srt/observability/startup_time.py build_scheduler_startup_time (no weights, no CUDA graphs here).
        if self.startup_time is None:
            self.startup_time = {"load_weight": 0.0, "kv_cache_allocation": 0.0,
                                 "scheduler_e2e": time.perf_counter() - self.t0, "cuda_graph": {}}
        info = {
            "status": "ready",
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_req_input_len": self.max_req_input_len,
            "startup_time": self.startup_time,
        }
        try:
            from sglang.srt.mem_cache.hicache_storage import disabled_l3_layout

            info["hicache_object_layout"] = disabled_l3_layout("Hierarchical cache is disabled", page_size=1)
        except Exception:
            info["hicache_object_layout"] = None
        return info

    # ------------------------------------------------------------------ control requests
    def _build_dispatch(self):
        from sglang.srt.managers import io_struct as io

        d = {
            io.TokenizedGenerateReqInput: self.handle_generate,
            io.BatchTokenizedGenerateReqInput: lambda r: [self.handle_generate(x) for x in r] and None,
            io.AbortReq: self.handle_abort,
            io.GetInternalStateReq: self.handle_get_internal_state,
            io.SetInternalStateReq: lambda r: io.SetInternalStateReqOutput(updated=False),
            io.ShutdownReq: self.handle_shutdown,
            io.ConfigureLoggingReq: self.forward_to_detokenizer,
            io.FreezeGCReq: self.forward_to_detokenizer,
            io.FlushCacheReqInput: lambda r: self._generic_output(io.FlushCacheReqOutput, success=True),
        }
        # Every other request of Scheduler._request_dispatcher whose reply the TokenizerManager awaits:
        # "XReqInput"/"XReq" -> "XReqOutput" (the pairs of tokenizer_control_mixin._COMMUNICATOR_SPECS).
        for name in dir(io):
            cls = getattr(io, name)
            if not isinstance(cls, type) or cls in d:
                continue
            out_name = None
            if name.endswith("ReqInput"):
                out_name = name[: -len("Input")] + "Output"
            elif name.endswith("Req"):
                out_name = name + "Output"
            out_cls = getattr(io, out_name, None) if out_name else None
            if isinstance(out_cls, type):
                d[cls] = self._replier(out_cls)
        d[io.LoadLoRAAdapterReqInput] = lambda r: self._generic_output(io.LoRAUpdateOutput)
        d[io.UnloadLoRAAdapterReqInput] = lambda r: self._generic_output(io.LoRAUpdateOutput)
        if hasattr(io, "LoadLoRAAdapterFromTensorsReqInput"):
            d[io.LoadLoRAAdapterFromTensorsReqInput] = lambda r: self._generic_output(io.LoRAUpdateOutput)
        if hasattr(io, "UpdateWeightFromDiskReqInput"):
            d[io.UpdateWeightFromDiskReqInput] = lambda r: self._generic_output(io.UpdateWeightFromDiskReqOutput)
        return d

    def _replier(self, out_cls):
        """The handler that answers a control request with its *Output struct (one closure per reply type)."""
        return lambda _request: self._generic_output(out_cls)

    def _generic_output(self, out_cls, **overrides):
        """An *Output struct with every required field filled: not successful, with a message saying why."""
        import msgspec

        kwargs = {}
        for f in msgspec.structs.fields(out_cls):
            if f.name in overrides:
                kwargs[f.name] = overrides[f.name]
                continue
            if f.required:
                kwargs[f.name] = _empty_value(f.type, f.name)
        for k, v in overrides.items():
            kwargs.setdefault(k, v)
        return out_cls(**kwargs)

    def forward_to_detokenizer(self, req):
        # Scheduler.configure_logging / handle_freeze_gc forward the request to the detokenizer.
        self.send_to_detokenizer.send_output(req, req)

    def handle_shutdown(self, req):
        self.gracefully_exit = True  # Scheduler.handle_shutdown

    def handle_get_internal_state(self, req):
        from sglang.srt.managers.io_struct import GetInternalStateReqOutput
        from sglang.srt.runtime_context import get_context
        from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

        try:
            state = get_context().resolved_server_args_dict()
        except Exception as e:
            state = {"error": f"resolved_server_args_dict failed: {e}"}
        state["startup_time"] = self.startup_time
        state["effective_max_running_requests_per_dp"] = self.max_running_requests
        state["last_gen_throughput"] = self._last_throughput
        state["memory_usage"] = {"weight": 0.0, "kvcache": 0.0, "token_capacity": self.max_total_num_tokens,
                                 "graph": 0.0}
        if self.spec_algorithm and self._spec_verify_total:  # internal_state.py _add_speculative
            state["avg_spec_accept_length"] = (
                (self._spec_verify_total + self._spec_accepted_total) / self._spec_verify_total)
        state["scripted_engine"] = True
        state.pop("custom_sigquit_handler", None)
        return GetInternalStateReqOutput(internal_state=msgspec_to_builtins(state))

    def handle_abort(self, req):
        # Scheduler.abort_request: queued requests get an AbortReq back (_make_abort_req), running ones
        # finish with FINISH_ABORT on their next output.
        from sglang.srt.managers.io_struct import AbortReq

        for r in list(self.waiting):
            if req.abort_all or r.rid.startswith(req.rid):
                self.waiting.remove(r)
                self.send_to_tokenizer.send_output(
                    AbortReq(rid=r.rid, finished_reason=req.finished_reason, http_worker_ipc=r.http_worker_ipc), r)
        for r in self.running:
            if req.abort_all or r.rid.startswith(req.rid):
                r.to_abort = req.finished_reason or {"type": "abort", "message": "Aborted", "status_code": None,
                                                     "err_type": None}

    # ------------------------------------------------------------------ generation
    def handle_generate(self, req):
        from sglang.srt.observability.req_time_stats import SchedulerReqTimeStats

        sp = req.sampling_params
        input_ids = list(req.input_ids or [])
        prompt_text = req.input_text if isinstance(req.input_text, str) else None
        if prompt_text is None:
            prompt_text = self.tokenizer.decode(input_ids, skip_special_tokens=False)
        max_new = sp.max_new_tokens
        if max_new is None:
            max_new = self.max_req_len - len(input_ids)
        max_new = max(0, min(int(max_new), self.max_req_len - len(input_ids)))
        reply = self.script.reply(prompt_text, max(max_new, 1))
        planned = list(self.tokenizer.encode(reply.text, add_special_tokens=False))
        eos_ids = set(self.eos_ids)
        if sp.stop_token_ids:
            eos_ids |= set(int(t) for t in sp.stop_token_ids)
        if not reply.endless and self.eos_ids:
            planned.append(sorted(self.eos_ids)[0])
        if sp.ignore_eos and not reply.endless:
            # ignore_eos: the model goes on past its answer; the script's filler is "ok".
            filler = list(self.tokenizer.encode(" ok", add_special_tokens=False)) or planned[:1]
            planned = [t for t in planned if t not in self.eos_ids]
            while len(planned) < max_new:
                planned.extend(filler)
        stop_strs = sp.stop_strs or []
        if isinstance(stop_strs, str):
            stop_strs = [stop_strs]
        ts = SchedulerReqTimeStats.new_from_obj(getattr(req, "time_stats", None))
        try:
            ts.set_metrics_collector(self.metrics_collector)
            ts.enable_metrics = self.enable_metrics
            ts.set_scheduler_recv_time()
            ts.set_wait_queue_entry_time()
        except Exception:
            logger.debug("time stats", exc_info=True)
        r = ScriptedReq(rid=req.rid, http_worker_ipc=req.http_worker_ipc, input_ids=input_ids, stream=bool(req.stream),
                        sampling=sp, time_stats=ts, planned=planned, eos_ids=eos_ids, max_new_tokens=max_new,
                        stop_strs=list(stop_strs),
                        reasoning=bool(getattr(req, "require_reasoning", False))
                        or prompt_text.rstrip().endswith("<think>"))
        if max_new == 0:
            r.finished_reason = {"type": "length", "length": 0}
        self.waiting.append(r)

    def _admit(self):
        """Prefill: waiting requests join the running batch (one step, like a prefill forward), up to
        max_running_requests running; the others stay queued, in order (srt/managers/schedule_policy.py PrefillAdder,
        bounded by the scheduler's max_running_requests)."""
        room = self.max_running_requests - len(self.running)
        if not self.waiting or room <= 0:
            return
        admitted, self.waiting = self.waiting[:room], self.waiting[room:]
        for r in admitted:
            # SGLang's sampler is skipped when every request is greedy: TokenizerManager normalises temperature 0 to
            # top_k 1 (srt/sampling/sampling_params.py normalize), is_all_greedy = top_k <= 1
            # (srt/sampling/sampling_batch_info.py).
            self.script.before_generate(sampled=r.sampling.top_k > 1)  # blocks for ever under deadlock-on-generate
            with contextlib.suppress(Exception):
                r.time_stats.set_forward_entry_time()
            if self.metrics_collector is not None:
                self.metrics_collector.increment_realtime_tokens(None, prefill_compute_tokens=len(r.input_ids))
            r.started = True
            self.running.append(r)

    def _decode_step(self):
        tokens, _accepted, seconds = self.script.step()
        time.sleep(seconds)
        produced = 0
        for r in self.running:
            if r.finished_reason is not None:
                continue
            if r.to_abort is not None:
                r.finished_reason = r.to_abort
                continue
            n = tokens if self.spec_algorithm else 1
            if self.spec_algorithm:
                r.spec_verify_ct += 1
                # The accepted drafts of this step (capped by what is left).
                left = r.max_new_tokens - len(r.output_ids)
                n = max(1, min(n, left))
                acc = n - 1
                r.spec_num_correct_drafts += acc
                while len(r.spec_hist) <= acc:
                    r.spec_hist.append(0)
                r.spec_hist[acc] += 1
                self._spec_verify += 1
                self._spec_accepted += acc
                self._spec_verify_total += 1
                self._spec_accepted_total += acc
            for _ in range(n):
                idx = len(r.output_ids)
                tok = r.planned[idx] if idx < len(r.planned) else (r.planned[-1] if r.planned else 0)
                r.output_ids.append(tok)
                produced += 1
                if r.reasoning:  # schedule_batch.py Req.update_reasoning_tokens
                    r.reasoning_tokens += 1
                    if tok == self.think_end_id:
                        r.reasoning = False
                if not r.sampling.ignore_eos and tok in r.eos_ids and len(r.output_ids) > r.sampling.min_new_tokens:
                    r.finished_reason = {"type": "stop", "matched": tok}  # FINISH_MATCHED_TOKEN
                    break
                if r.stop_strs:
                    tail = self.tokenizer.decode(r.output_ids[-16:])
                    hit = next((s for s in r.stop_strs if s and s in tail), None)
                    if hit is not None:
                        r.finished_reason = {"type": "stop", "matched": hit}  # FINISH_MATCHED_STR
                        break
                if len(r.output_ids) >= r.max_new_tokens:
                    r.finished_reason = {"type": "length", "length": r.max_new_tokens}  # FINISH_LENGTH
                    break
            if len(r.output_ids) == 1 or (r.finished_reason is not None and len(r.output_ids) <= n):
                with contextlib.suppress(Exception):
                    r.time_stats.set_prefill_finished_time()
        self._gen_tokens += produced
        if self.metrics_collector is not None and produced:
            self.metrics_collector.increment_realtime_tokens(None, decode_tokens=produced)

    def _stream_output(self):
        from sglang.srt.managers.io_struct import BatchTokenIDOutput, wrap_as_pickle

        due = []
        for r in self.running:
            if r.finished_reason is not None:
                due.append(r)
            elif r.stream and len(r.output_ids) > r.send_token_offset:
                interval = r.sampling.stream_interval or 1
                unsent = len(r.output_ids) - r.send_token_offset
                if interval == 1 or unsent >= interval or r.send_token_offset == 0:
                    due.append(r)
        if not due:
            return
        b = {k: [] for k in ("rids", "http_worker_ipcs", "finished_reasons", "decoded_texts", "decode_ids",
                             "read_offsets", "output_ids", "skip_special_tokens", "spaces_between_special_tokens",
                             "no_stop_trim", "prompt_tokens", "reasoning_tokens", "completion_tokens",
                             "cached_tokens", "retraction_counts", "time_stats", "spec_verify_ct",
                             "spec_num_correct_drafts", "spec_num_block_accept_tokens", "spec_num_cap_tokens",
                             "spec_correct_drafts_histogram", "spec_cap_lens_histogram", "image_tokens",
                             "audio_tokens", "video_tokens", "cached_tokens_details")}
        for r in due:
            b["rids"].append(r.rid)
            b["http_worker_ipcs"].append(r.http_worker_ipc)
            b["finished_reasons"].append(r.finished_reason)
            # array("q") as Req.output_ids (schedule_batch.py); io_struct types these fields List[array]
            b["output_ids"].append(array("q", r.output_ids[r.send_token_offset:]))
            r.send_token_offset = len(r.output_ids)
            # Req.init_incremental_detokenize
            if r.surr_and_decode is None:
                r.read_offset = len(r.input_ids)
                surr = max(r.read_offset - INIT_INCREMENTAL_DETOKENIZATION_OFFSET, 0)
                r.surr_and_decode = r.input_ids[surr:] + list(r.output_ids)
                r.read_offset -= surr
                r._cur = len(r.output_ids)
            else:
                r.surr_and_decode.extend(r.output_ids[r._cur:])
                r._cur = len(r.output_ids)
            b["decode_ids"].append(array("q", r.surr_and_decode[r.send_decode_id_offset:]))
            r.send_decode_id_offset = len(r.surr_and_decode)
            b["read_offsets"].append(r.read_offset)
            b["decoded_texts"].append("")
            b["skip_special_tokens"].append(r.sampling.skip_special_tokens)
            b["spaces_between_special_tokens"].append(r.sampling.spaces_between_special_tokens)
            b["no_stop_trim"].append(r.sampling.no_stop_trim)
            b["prompt_tokens"].append(len(r.input_ids))
            b["reasoning_tokens"].append(r.reasoning_tokens)
            b["completion_tokens"].append(len(r.output_ids))
            b["cached_tokens"].append(0)
            b["cached_tokens_details"].append(None)
            b["retraction_counts"].append(0)
            b["image_tokens"].append(0)
            b["audio_tokens"].append(0)
            b["video_tokens"].append(0)
            if r.finished_reason is not None:
                try:
                    r.time_stats.set_completion_time()
                except Exception:
                    logger.debug("completion time", exc_info=True)
            b["time_stats"].append(r.time_stats)
            if self.spec_algorithm:
                b["spec_verify_ct"].append(r.spec_verify_ct)
                b["spec_num_correct_drafts"].append(r.spec_num_correct_drafts)
                b["spec_num_block_accept_tokens"].append(0)
                b["spec_num_cap_tokens"].append(0)
                b["spec_correct_drafts_histogram"].append(list(r.spec_hist))
                b["spec_cap_lens_histogram"].append([])
        empty = [[] for _ in due]
        out = BatchTokenIDOutput(
            rids=b["rids"], http_worker_ipcs=b["http_worker_ipcs"], finished_reasons=b["finished_reasons"],
            decoded_texts=b["decoded_texts"], decode_ids=b["decode_ids"], read_offsets=b["read_offsets"],
            output_ids=b["output_ids"], skip_special_tokens=b["skip_special_tokens"],
            spaces_between_special_tokens=b["spaces_between_special_tokens"], no_stop_trim=b["no_stop_trim"],
            prompt_tokens=b["prompt_tokens"], reasoning_tokens=b["reasoning_tokens"],
            completion_tokens=b["completion_tokens"], cached_tokens=b["cached_tokens"],
            cached_tokens_details=b["cached_tokens_details"],
            image_tokens=b["image_tokens"], audio_tokens=b["audio_tokens"], video_tokens=b["video_tokens"],
            input_token_logprobs_val=list(empty), input_token_logprobs_idx=list(empty),
            output_token_logprobs_val=list(empty), output_token_logprobs_idx=list(empty),
            input_top_logprobs_val=list(empty), input_top_logprobs_idx=list(empty),
            output_top_logprobs_val=list(empty), output_top_logprobs_idx=list(empty),
            input_token_ids_logprobs_val=list(empty), input_token_ids_logprobs_idx=list(empty),
            output_token_ids_logprobs_val=list(empty), output_token_ids_logprobs_idx=list(empty),
            output_token_entropy_val=None, output_token_sampling_mask=None, output_hidden_states=None,
            routed_experts=None, indexer_topk=None, customized_info=None, placeholder_tokens_idx=None,
            placeholder_tokens_val=None, retraction_counts=b["retraction_counts"],
            time_stats=wrap_as_pickle(b["time_stats"]),
            dp_ranks=[self.dp_rank] * len(due),
            spec_verify_ct=b["spec_verify_ct"] if self.spec_algorithm else None,
            spec_num_correct_drafts=b["spec_num_correct_drafts"] if self.spec_algorithm else None,
            spec_num_block_accept_tokens=b["spec_num_block_accept_tokens"] if self.spec_algorithm else None,
            spec_num_cap_tokens=b["spec_num_cap_tokens"] if self.spec_algorithm else None,
            spec_correct_drafts_histogram=b["spec_correct_drafts_histogram"] if self.spec_algorithm else None,
            spec_cap_lens_histogram=b["spec_cap_lens_histogram"] if self.spec_algorithm else None,
        )
        self.send_to_detokenizer.send_output(out)
        self.running = [r for r in self.running if r.finished_reason is None]

    # ------------------------------------------------------------------ metrics
    def _log_stats(self, force=False):
        now = time.perf_counter()
        if not force and now - self._last_stats < STATS_INTERVAL_S:
            return
        dt = max(now - self._last_stats, 1e-6)
        self._last_throughput = self._gen_tokens / dt
        used = sum(len(r.input_ids) + len(r.output_ids) for r in self.running)
        if self.metrics_collector is not None:
            from sglang.srt.observability.metrics_collector import QueueCount, SchedulerStats

            stats = SchedulerStats(
                num_running_reqs=QueueCount(total=len(self.running)),
                num_queue_reqs=QueueCount(total=len(self.waiting)),
                gen_throughput=self._last_throughput,
                token_usage=used / self.max_total_num_tokens,
                full_token_usage=used / self.max_total_num_tokens,
                num_used_tokens=used, kv_used_tokens=used,
                kv_available_tokens=self.max_total_num_tokens - used,
                decode_sum_seq_lens=used,
                utilization=1.0 if self.running else 0.0,
            )
            if self.spec_algorithm and self._spec_verify:
                stats.spec_accept_length = (self._spec_verify + self._spec_accepted) / self._spec_verify
                proposed = self._spec_verify * max(self.spec_draft_tokens - 1, 1)
                stats.spec_accept_rate = self._spec_accepted / proposed
                stats.spec_num_steps = self.spec_steps
                stats.spec_num_draft_tokens = self.spec_draft_tokens
            try:
                self.metrics_collector.log_stats(stats)
            except Exception:
                logger.warning("log_stats failed", exc_info=True)
        if self.load_snapshot_writer is not None:
            try:
                from sglang.srt.managers.load_snapshot import LoadSnapshot

                self.load_snapshot_writer.write(LoadSnapshot(
                    timestamp=time.time(), dp_rank=self.dp_rank, num_running_reqs=len(self.running),
                    num_waiting_reqs=len(self.waiting), num_used_tokens=used,
                    num_total_tokens=self.max_total_num_tokens, max_total_num_tokens=self.max_total_num_tokens,
                    token_usage=used / self.max_total_num_tokens, gen_throughput=self._last_throughput))
            except Exception:
                logger.debug("load snapshot write failed", exc_info=True)
        self._last_stats = now
        self._gen_tokens = 0
        if self.spec_algorithm:
            self._spec_verify = self._spec_accepted = 0

    # ------------------------------------------------------------------ loop
    def _recv_requests(self, timeout_ms: int) -> list:
        from sglang.srt.managers.io_struct import sock_recv

        reqs = []
        events = dict(self.poller.poll(timeout_ms))
        if not events:
            return reqs
        for sock in (self.recv_from_tokenizer, self.recv_from_rpc):
            while True:
                try:
                    reqs.append((sock, sock_recv(sock, zmq.NOBLOCK)))
                except zmq.ZMQError:
                    break
        return reqs

    def run_event_loop(self):
        from sglang.srt.managers.io_struct import RpcReqInput, RpcReqOutput, sock_send

        while not self.gracefully_exit:
            busy = bool(self.running or self.waiting)
            for _sock, req in self._recv_requests(0 if busy else 100):
                if isinstance(req, RpcReqInput):
                    sock_send(self.recv_from_rpc, RpcReqOutput(success=False, message=NOT_SUPPORTED))
                    continue
                handler = self._dispatch.get(type(req))
                if handler is None:
                    logger.warning("scripted scheduler: no handler for %s", type(req).__name__)
                    continue
                out = handler(req)
                if out is not None:
                    self.send_to_tokenizer.send_output(out, req)  # Scheduler.send_control_output
            if self.gracefully_exit:
                break
            self._admit()
            # finished-at-admission (max_new_tokens 0) and aborted requests go out without a step
            if self.running and any(r.finished_reason is None and r.to_abort is None for r in self.running):
                self._decode_step()
            else:
                for r in self.running:
                    if r.finished_reason is None and r.to_abort is not None:
                        r.finished_reason = r.to_abort
            self._stream_output()
            self._log_stats(force=not self.running and self._gen_tokens > 0)


def _empty_value(tp, name):
    """A value of type `tp` for a required field of an unsupported control reply."""
    import typing

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is bool:
        return False
    if tp is str:
        return NOT_SUPPORTED if name in ("message", "error_message", "error", "msg") else ""
    if tp in (int, float):
        return tp(0)
    if origin is typing.Union and type(None) in args:
        return None
    if origin in (list, list) or tp is list:
        return []
    if origin in (dict, dict) or tp is dict:
        return {}
    if origin is typing.Union:
        return _empty_value(args[0], name)
    return None


def run_scripted_scheduler_process(server_args, port_args, gpu_id, tp_rank, pp_rank, dp_rank, pipe_writer,  # noqa: PLR0917
                                   display_tp_rank=None, display_dp_rank=None, display_moe_ep_rank=None):
    # (positional, as upstream's: srt/entrypoints/engine.py starts it with a positional argument tuple)
    """Stands for srt/managers/scheduler.py run_scheduler_process (same signature, same hand-shake)."""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank

    load_plugins()
    if dp_rank is None and "SGLANG_DP_RANK" in os.environ:  # scheduler.py resolve_spawn_dp_rank
        dp_rank = int(os.environ["SGLANG_DP_RANK"])
    publish(server_args, role="scheduler",
            ranks=SpawnRanks(world_rank=spawn_world_rank(server_args, tp_rank=tp_rank, pp_rank=pp_rank),
                             dp_rank=dp_rank, gpu_id=gpu_id))
    # configure_scheduler_process (scheduler.py), without the GPU/NUMA affinity parts
    from sglang.srt.utils import configure_logger, kill_itself_when_parent_died

    kill_itself_when_parent_died()
    try:
        import setproctitle

        setproctitle.setproctitle("sglang::scheduler")
    except ImportError:
        pass
    faulthandler.enable()
    configure_logger(server_args, prefix="")
    parent_process = None
    try:
        import psutil

        parent_process = psutil.Process().parent()
    except Exception:
        pass

    scheduler = None
    try:
        script = Script.from_env()
        script.on_start(log=logger.error)  # crash-at-start exits 1, never-ready never returns
        scheduler = ScriptedScheduler(server_args, port_args, dp_rank)
        pipe_writer.send(scheduler.get_init_info())
        logger.info("scripted scheduler ready (speculative=%s)", scheduler.spec_algorithm)
        scheduler.run_event_loop()
        logger.info("scripted scheduler: ShutdownReq received, exiting")
    except SystemExit:
        raise
    except Exception:
        import traceback

        logger.error("Scheduler hit an exception: %s", traceback.format_exc())
        if parent_process is not None:
            parent_process.send_signal(signal.SIGQUIT)  # as run_scheduler_process does
