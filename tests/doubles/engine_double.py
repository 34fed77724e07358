#!/usr/bin/env python3
"""ENGINE TEST DOUBLE: stands in for `sglang serve` / `vllm serve` on hosts without GPUs.

It is not an engine. It speaks the HTTP surface the playbooks and verify use, with the response
shapes of SGLang 0.5.23 and vLLM 0.33.0 (health, models, model/server info, completions, Prometheus
metrics), and it can misbehave on purpose so that fault handling is tested for real.

Invocation mirrors the engines:
    engine_double.py serve --config /etc/sglang/x.yaml          (SGLang flavour)
    engine_double.py serve /models/x --port 8000 [...]           (vLLM flavour, argv[0] or --flavour)
    engine_double.py --version

Environment (all optional):
    ENGINE_DOUBLE_FLAVOUR     sglang | vllm (default: from the program name, else sglang)
    ENGINE_DOUBLE_FAULT       none | crash-at-start | hang | ignore-sigterm | crash-after-ready
    ENGINE_DOUBLE_START_S     seconds /health answers 503 before it is ready (default 0.5)
    ENGINE_DOUBLE_TOKENS_PER_S  decode speed of one sequence without speculation (default 400)
    ENGINE_DOUBLE_ACCEPT_RATE   fraction of drafted tokens accepted when speculation is on (default 0.6)
    ENGINE_DOUBLE_SPEC_COST     relative cost of one verify step vs a plain decode step (default 1.3)
Stdlib only: it runs inside the systemd test hosts with the distribution's python3.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DOUBLE_MARKER = "ENGINE TEST DOUBLE (not an engine)"
VERSIONS = {"sglang": "0.5.23", "vllm": "0.33.0"}


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


class Engine:
    """State shared by the HTTP handlers: configuration, counters, readiness."""

    def __init__(self, flavour: str, options: dict[str, object]) -> None:
        self.flavour = flavour
        self.options = options
        self.model_path = str(options.get("model-path") or options.get("model") or "/models/unknown")
        self.served_name = str(options.get("served-model-name") or self.model_path)
        self.api_key = options.get("api-key") or os.environ.get("VLLM_API_KEY") or None
        self.fault = os.environ.get("ENGINE_DOUBLE_FAULT", "none")
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
            if self.spec_steps:
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

    def _authorized(self) -> bool:
        key = self.engine.api_key
        return not key or self.headers.get("Authorization", "") == f"Bearer {key}"

    def _ready_and_authorized(self) -> bool:
        """Answer 503 while starting and 401 without the key, as the engines do; True when neither applies."""
        if not self.engine.ready:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "server is starting"})
            return False
        if not self._authorized():
            self._send(HTTPStatus.UNAUTHORIZED, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self) -> None:
        engine = self.engine
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate", "/ready", "/ping"):
            if engine.fault == "hang":
                time.sleep(3600)
            # Both engines answer /health with an empty body: 503 while starting, 200 when ready.
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
        }
        if path in routes:
            self._send(HTTPStatus.OK, routes[path]())
        else:
            self._send(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if not self._ready_and_authorized():
            return
        length = int(self.headers.get("Content-Length", "0"))
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._send(HTTPStatus.BAD_REQUEST, {"error": {"message": "invalid JSON body"}})
            return
        if path in ("/v1/chat/completions", "/v1/completions"):
            self._send(HTTPStatus.OK, self._completion(request, chat=path.endswith("chat/completions")))
        else:
            self._send(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})

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
        state: dict[str, object] = {"last_gen_throughput": engine.tokens_per_s, "world_size": 1,
                                    "memory_usage": {"weight": 0.0, "kvcache": 0.0}}
        if engine.spec_steps:
            state["avg_spec_accept_length"] = engine.avg_accept_length()
        info = {k.replace("-", "_"): v for k, v in engine.options.items() if k != "api-key"}
        info.update({"internal_states": [state], "version": VERSIONS["sglang"],
                     "test_double": DOUBLE_MARKER})
        return info

    def _completion(self, request: dict, chat: bool) -> dict[str, object]:
        engine = self.engine
        max_tokens = int(request.get("max_tokens") or request.get("max_completion_tokens") or 16)
        max_tokens = max(1, min(max_tokens, 4096))
        if chat:
            prompt = " ".join(str(m.get("content", "")) for m in request.get("messages", []))
        else:
            prompt = str(request.get("prompt", ""))
        prompt_tokens = max(1, len(prompt.split()))
        produced, seconds = engine.generate(prompt_tokens, max_tokens)
        time.sleep(min(seconds, 30.0))
        text = " ".join(["ok"] * produced)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": produced,
                 "total_tokens": prompt_tokens + produced}
        created = int(time.time())
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "finish_reason": "length" if produced >= max_tokens else "stop"}
            return {"id": f"chatcmpl-{created}", "object": "chat.completion", "created": created,
                    "model": engine.served_name, "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
        return {"id": f"cmpl-{created}", "object": "text_completion", "created": created,
                "model": engine.served_name, "choices": [choice], "usage": usage}


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


def detect_flavour(argv0: str) -> str:
    explicit = os.environ.get("ENGINE_DOUBLE_FLAVOUR")
    if explicit:
        return explicit
    return "vllm" if "vllm" in os.path.basename(argv0) else "sglang"


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
    if engine.fault == "ignore-sigterm":
        signal.signal(signal.SIGTERM, lambda *_: print("engine-double: ignoring SIGTERM", flush=True))
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    Handler.engine = engine
    server = ThreadingHTTPServer((str(options["host"]), int(options["port"])), Handler)
    server.daemon_threads = True
    if engine.fault == "crash-after-ready":
        threading.Timer(float(os.environ.get("ENGINE_DOUBLE_START_S", "0.5")) + 2.0,
                        lambda: os._exit(3)).start()
    print(f"engine-double: listening on {options['host']}:{options['port']}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
