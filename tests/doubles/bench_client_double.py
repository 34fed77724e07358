#!/usr/bin/env python3
"""BENCH CLIENT TEST DOUBLE: stands in for the engines' own benchmark clients in tests.

It is not the real client. It accepts the flags the verify role passes to
    python -m sglang.benchmark.serving ...          (SGLang flavour: no leading positional words)
    vllm bench serve ...                            (vLLM flavour: invoked as `<double> bench serve ...`)
really sends the requests to the server with the given concurrency, to the route the real client would use
(a chat backend, SGLang's sglang-oai-chat or vLLM's openai-chat with --endpoint /v1/chat/completions: the prompt
as the one user message of a chat completion; otherwise /v1/completions), but not streamed (the TTFT it reports is
therefore the full request latency), measures, and writes the output file with the schema of the real client of
that engine:
    SGLang: one JSON line appended to --output-file (sglang.benchmark.serving keys)
    vLLM:   one JSON document at --result-dir/--result-filename (vllm bench serve keys, including the
            spec_decode_* fields computed from /metrics before and after the run, as vLLM does).
Auth: `Authorization: Bearer $OPENAI_API_KEY`, like both real clients. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import random
import statistics
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

DOUBLE_MARKER = "BENCH CLIENT TEST DOUBLE"


def build_parser(flavour: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"bench_client_double ({flavour})", allow_abbrev=False)
    add = parser.add_argument
    add("--backend", required=True)
    add("--base-url", required=True)
    add("--model", required=True)
    add("--served-model-name")
    add("--tokenizer", required=True)
    add("--dataset-name", required=True)
    add("--num-prompts", type=int, required=True)
    add("--max-concurrency", type=int, required=True)
    add("--request-rate", default="inf")
    add("--random-input-len", type=int, default=1024)
    add("--random-output-len", type=int, default=128)
    add("--random-range-ratio", type=float, default=0.0)
    add("--dataset-path", default="")
    add("--sharegpt-output-len", type=int)
    add("--seed", type=int, default=0)
    if flavour == "sglang":
        add("--output-file", required=True)
        add("--warmup-requests", type=int, default=1)
        add("--disable-ignore-eos", action="store_true")
        add("--extra-request-body", default="")
    else:
        # vllm/benchmarks/serve.py, its argument group "sampling parameters"
        add("--temperature", type=float)
        add("--top-p", type=float)
        add("--top-k", type=int)
        add("--min-p", type=float)
        add("--presence-penalty", type=float)
        add("--frequency-penalty", type=float)
        add("--repetition-penalty", type=float)
        add("--extra-body", type=json.loads)
        add("--trust-remote-code", action="store_true")
        add("--endpoint", default="/v1/completions")
        add("--ignore-eos", action="store_true")
        add("--num-warmups", type=int, default=0)
        add("--save-result", action="store_true")
        add("--save-detailed", action="store_true")
        add("--result-dir", required=True)
        add("--result-filename", required=True)
        add("--percentile-metrics", default="ttft,tpot,itl")
        add("--metric-percentiles", default="99")
    return parser


@dataclass
class Outcome:
    latencies: list[float] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    input_lens: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


VLLM_SAMPLING = ("top_p", "top_k", "min_p", "temperature", "frequency_penalty", "presence_penalty",
                 "repetition_penalty")


def sampling(args: argparse.Namespace) -> dict[str, object]:
    """What the real clients put in each request body: SGLang temperature 0.0 unless --extra-request-body
    names one (sglang/benchmark/serving.py); vLLM each sampling parameter only when given, then --extra-body
    (vllm/benchmarks/serve.py). Not streamed, so no stream_options (the engines refuse them without `stream`)."""
    if hasattr(args, "extra_request_body"):
        body = {"temperature": 0.0, "ignore_eos": True, **json.loads(args.extra_request_body or "{}")}
    else:
        given = {key: getattr(args, key) for key in VLLM_SAMPLING if getattr(args, key) is not None}
        body = {"ignore_eos": bool(args.ignore_eos), **given, **(args.extra_body or {})}
    body.pop("stream_options", None)
    return body


def route(args: argparse.Namespace) -> str:
    """The route the real client posts to: SGLang's by backend (sglang/benchmark/serving.py _BACKEND_API_PATHS),
    vLLM's --endpoint, which its openai-chat backend requires to end in chat/completions
    (vllm/benchmarks/lib/endpoint_request_func.py)."""
    if hasattr(args, "extra_request_body"):
        return "/v1/chat/completions" if args.backend == "sglang-oai-chat" else "/v1/completions"
    if args.backend == "openai-chat" and not args.endpoint.endswith("chat/completions"):
        raise SystemExit(f"bench_client_double: backend openai-chat needs a chat/completions --endpoint, "
                         f"got {args.endpoint!r}")
    return args.endpoint


def post_completion(url: str, model: str, prompt: str, max_tokens: int,
                    extra: dict[str, object]) -> tuple[float, int]:
    if url.endswith("chat/completions"):
        payload = {"model": model, "messages": [{"role": "user", "content": prompt}],
                   "max_completion_tokens": max_tokens, **extra}
    else:
        payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens, **extra}
    request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as response:
        reply = json.loads(response.read())
    return time.perf_counter() - start, int(reply["usage"]["completion_tokens"])


def sharegpt_prompts(path: str, count: int, seed: int) -> list[str]:
    """First human turns of the ShareGPT file, sampled as the real clients do (a seeded shuffle)."""
    conversations = json.loads(Path(path).read_text(encoding="utf-8"))
    prompts = [c["conversations"][0]["value"] for c in conversations if len(c.get("conversations", [])) >= 2]
    random.Random(seed).shuffle(prompts)
    return [prompts[i % len(prompts)] for i in range(count)]


def run_requests(args: argparse.Namespace, model: str, count: int) -> Outcome:
    rng = random.Random(args.seed)
    if args.dataset_name == "sharegpt":
        prompts = sharegpt_prompts(args.dataset_path, count, args.seed)
        output_len = args.sharegpt_output_len
    else:
        prompts = [" ".join(f"w{rng.randrange(30000)}" for _ in range(args.random_input_len)) for _ in range(count)]
        output_len = args.random_output_len
    extra, url = sampling(args), args.base_url.rstrip("/") + route(args)
    outcome = Outcome()

    def one(prompt: str) -> None:
        try:
            latency, produced = post_completion(url, model, prompt, output_len, extra)
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            outcome.errors.append(str(exc))
            return
        outcome.latencies.append(latency)
        outcome.output_lens.append(produced)
        outcome.input_lens.append(len(prompt.split()))

    with ThreadPoolExecutor(max_workers=max(1, args.max_concurrency)) as pool:
        list(pool.map(one, prompts))
    return outcome


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def latency_stats(prefix: str, seconds: list[float], pcts: tuple[float, ...]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds] or [0.0]
    stats = {f"mean_{prefix}_ms": statistics.fmean(ms), f"median_{prefix}_ms": statistics.median(ms),
             f"std_{prefix}_ms": statistics.pstdev(ms)}
    stats.update({f"p{pct:g}_{prefix}_ms": percentile(ms, pct) for pct in pcts})
    return stats


def scrape(base_url: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/metrics", timeout=30) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return totals
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def server_accept_length(base_url: str) -> float | None:
    request = urllib.request.Request(f"{base_url.rstrip('/')}/server_info")
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            info = json.loads(response.read())
        return info["internal_states"][0].get("avg_spec_accept_length")
    except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError):
        return None


def timing_lists(outcome: Outcome) -> dict[str, list[float]]:
    """Per-request seconds. Non-streaming: TTFT is the whole latency, ITL/TPOT spread it evenly."""
    pairs = list(zip(outcome.latencies, outcome.output_lens, strict=True))
    return {"ttft": outcome.latencies, "e2e": outcome.latencies,
            "tpot": [lat / max(1, n - 1) for lat, n in pairs], "itl": [lat / max(1, n) for lat, n in pairs]}


def sglang_main(args: argparse.Namespace) -> int:
    model = args.served_model_name or args.model
    if args.warmup_requests:
        run_requests(argparse.Namespace(**{**vars(args), "max_concurrency": 1}), model, args.warmup_requests)
    start = time.perf_counter()
    outcome = run_requests(args, model, args.num_prompts)
    duration = time.perf_counter() - start
    total_in, total_out, completed = sum(outcome.input_lens), sum(outcome.output_lens), len(outcome.latencies)
    times = timing_lists(outcome)
    # The keys and their order of sglang.benchmark.serving 0.5.23 (without goodput / cache report).
    result: dict[str, object] = {
        "tag": DOUBLE_MARKER, "backend": args.backend, "dataset_name": args.dataset_name,
        "request_rate": float(args.request_rate), "max_concurrency": args.max_concurrency,
        "sharegpt_output_len": args.sharegpt_output_len, "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len, "random_range_ratio": args.random_range_ratio,
        "server_info": None, "duration": duration, "completed": completed,
        "total_input_tokens": total_in, "total_input_text_tokens": total_in, "total_input_vision_tokens": 0,
        "total_output_tokens": total_out, "total_output_tokens_retokenized": total_out,
        "request_throughput": completed / duration, "input_throughput": total_in / duration,
        "output_throughput": total_out / duration, "total_throughput": (total_in + total_out) / duration,
    }
    for key, name in (("e2e", "e2e_latency"), ("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl")):
        result.update(latency_stats(name, times[key], (90.0, 95.0, 99.0)))
    result.update({"concurrency": sum(outcome.latencies) / duration,
                   "accept_length": server_accept_length(args.base_url),
                   "max_output_tokens_per_s": total_out / duration, "max_concurrent_requests": args.max_concurrency})
    with open(args.output_file, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(result) + "\n")
    print(f"{DOUBLE_MARKER}: {completed} requests, {result['output_throughput']:.1f} output tok/s")
    if outcome.errors:
        print("\n".join(outcome.errors[:5]), file=sys.stderr)
    return 0 if not outcome.errors else 1


def vllm_spec_fields(before: dict[str, float], after: dict[str, float]) -> dict[str, object]:
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    drafts, draft_tokens = delta("vllm:spec_decode_num_drafts_total"), delta("vllm:spec_decode_num_draft_tokens_total")
    if draft_tokens <= 0:
        return {}
    accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
    return {"spec_decode_acceptance_rate": accepted / draft_tokens * 100,
            "spec_decode_acceptance_length": 1 + accepted / drafts if drafts > 0 else 0.0,
            "spec_decode_num_drafts": int(drafts), "spec_decode_draft_tokens": int(draft_tokens),
            "spec_decode_accepted_tokens": int(accepted), "spec_decode_per_position_acceptance_rates": []}


def vllm_main(args: argparse.Namespace) -> int:
    if not args.save_result:
        print("bench_client_double: nothing to do without --save-result", file=sys.stderr)
        return 2
    model = args.served_model_name or args.model
    if args.num_warmups:
        run_requests(args, model, args.num_warmups)
    before = scrape(args.base_url)
    start = time.perf_counter()
    outcome = run_requests(args, model, args.num_prompts)
    duration = time.perf_counter() - start
    after = scrape(args.base_url)
    total_in, total_out, completed = sum(outcome.input_lens), sum(outcome.output_lens), len(outcome.latencies)
    times = timing_lists(outcome)
    # The keys and their order of `vllm bench serve` 0.33.0 --save-result (vllm/benchmarks/serve.py).
    result: dict[str, object] = {
        "duration": duration, "completed": completed, "failed": len(outcome.errors),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": completed / duration, "request_goodput": None,
        "output_throughput": total_out / duration, "total_token_throughput": (total_in + total_out) / duration,
        "input_lens": outcome.input_lens, "output_lens": outcome.output_lens, "ttfts": outcome.latencies,
        "itls": [[] for _ in outcome.latencies], "latencies": outcome.latencies,
        "start_times": [0.0 for _ in outcome.latencies], "queue_times": [0.0 for _ in outcome.latencies],
        "generated_texts": ["" for _ in outcome.latencies], "errors": outcome.errors,
        "max_output_tokens_per_s": total_out / duration, "max_concurrent_requests": args.max_concurrency,
        "rtfx": 0.0,
    }
    percentiles = tuple(float(p) for p in args.metric_percentiles.split(","))
    selected = args.percentile_metrics.split(",")
    for key, name in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e", "e2el")):
        if name in selected:
            result.update(latency_stats(name, times[key], percentiles))
    result.update(vllm_spec_fields(before, after))
    result.update({"date": time.strftime("%Y%m%d-%H%M%S"), "endpoint_type": args.backend, "backend": args.backend,
                   "label": None, "model_id": args.model, "tokenizer_id": args.tokenizer,
                   "num_prompts": args.num_prompts, "request_rate": args.request_rate, "burstiness": 1.0,
                   "max_concurrency": args.max_concurrency})
    if not args.save_detailed:  # vllm bench serve drops these lists unless --save-detailed
        for name in ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"):
            result.pop(name, None)
    path = Path(args.result_dir) / args.result_filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result), encoding="utf-8")
    print(f"{DOUBLE_MARKER}: {completed} requests, {result['output_throughput']:.1f} output tok/s")
    if outcome.errors:
        print("\n".join(outcome.errors[:5]), file=sys.stderr)
    return 0 if not outcome.errors else 1


# Opt-in record of who ran the double (a test creates the file, world-writable, on its test host).
RUNS_LOG = Path("/tmp/bench-client-double-runs.log")


def record_run(flavour: str) -> None:
    if RUNS_LOG.is_file():
        with RUNS_LOG.open("a", encoding="utf-8") as log:
            log.write(f"{flavour} user={pwd.getpwuid(os.geteuid()).pw_name} home={os.environ.get('HOME')} "
                      f"cwd={os.getcwd()}\n")


def main(argv: list[str]) -> int:
    flavour = "vllm" if argv[:2] == ["bench", "serve"] else "sglang"
    record_run(flavour)
    args = build_parser(flavour).parse_args(argv[2:] if flavour == "vllm" else argv)
    if not Path(args.tokenizer).exists():
        # Both real clients treat a missing local path as a hub id and fail offline; so does the double.
        print(f"bench_client_double: tokenizer {args.tokenizer!r} is not a local path", file=sys.stderr)
        return 2
    if args.dataset_name not in ("random", "random-ids", "sharegpt"):
        print(f"bench_client_double: dataset {args.dataset_name!r} is not offline", file=sys.stderr)
        return 2
    if args.dataset_name == "sharegpt" and not Path(args.dataset_path).is_file():
        # With no --dataset-path both real clients download ShareGPT from the Hub, which fails offline.
        print(f"bench_client_double: sharegpt needs a local --dataset-path, got {args.dataset_path!r}", file=sys.stderr)
        return 2
    return sglang_main(args) if flavour == "sglang" else vllm_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
