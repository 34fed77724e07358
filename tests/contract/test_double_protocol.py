"""The engine test double (tests/doubles/engine_double.py) against the pinned SGLang's own definitions.

The double runs as `engine_double.py serve --config <rendered YAML>` on a free loopback port. Its
/v1/models, /v1/chat/completions and /v1/completions answers are validated by SGLang's pydantic protocol
models (`sglang.srt.entrypoints.openai.protocol`, in the contract venv), keys SGLang would ignore are
reported, every `sglang:*` metric it serves must be defined, with the same type, in SGLang's
`srt/observability/metrics_collector.py`, and the keys of its /model_info and /server_info answers must be
keys SGLang's own handlers use.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sglang_helpers import MODELS_FILE, REPO_ROOT, contract_python, free_port, sglang_metric_definitions
from sglang_render import render_config

pytestmark = pytest.mark.contract

DOUBLE = REPO_ROOT / "tests" / "doubles" / "engine_double.py"
API_KEY = "double-contract-key"
PROFILES = yaml.safe_load(MODELS_FILE.read_text(encoding="utf-8"))["engine_profiles"]
SPEC_PROFILE = next(name for name, p in PROFILES.items() if p.get("speculative"))

# Keys of a body that its pydantic model does not know (pydantic drops them silently), for the programs below.
IGNORED_KEYS_CODE = r'''
def ignored_keys(model, data, path=""):
    if isinstance(model, BaseModel) and isinstance(data, dict):
        found = []
        for key, value in data.items():
            if key not in type(model).model_fields:
                found.append(f"{path}{key}")
            else:
                found += ignored_keys(getattr(model, key), value, f"{path}{key}.")
        return found
    if isinstance(model, list) and isinstance(data, list):
        return [k for i, (m, d) in enumerate(zip(model, data)) for k in ignored_keys(m, d, f"{path}{i}.")]
    return []
'''

# Validate each (model class name, JSON body) pair with SGLang's protocol model. `ignored` lists keys of
# the body the model does not know (pydantic drops them silently: the double would be sending noise).
VALIDATE_CODE = r"""
import json, sys
from pydantic import BaseModel, ValidationError
import sglang.srt.entrypoints.openai.protocol as protocol

""" + IGNORED_KEYS_CODE + r"""
def validate(pairs):
    results = {}
    for name, body in pairs:
        cls = getattr(protocol, name)
        try:
            obj = cls.model_validate(body)
        except ValidationError as exc:
            results[name] = {"valid": False, "errors": exc.errors(include_url=False)}
            continue
        defaults = {k: f.default for k, f in cls.model_fields.items() if isinstance(f.default, (str, int))}
        results[name] = {"valid": True, "ignored": ignored_keys(obj, body),
                         "object_default": defaults.get("object")}
    return results

print(json.dumps([validate(pairs) for pairs in json.loads(sys.stdin.read())], default=str))
"""


def http(port: int, path: str, body: dict[str, Any] | None = None,
         key: str | None = API_KEY) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@contextlib.contextmanager
def running_double(flavour: str, args: list[str]) -> Iterator[None]:
    """The double as `<flavour> serve <args>`, ready (its /health answered 200) while the block runs."""
    env = {**os.environ, "ENGINE_DOUBLE_FLAVOUR": flavour, "ENGINE_DOUBLE_START_S": "0",
           "ENGINE_DOUBLE_TOKENS_PER_S": "100000"}
    port = int(args[args.index("--port") + 1]) if "--port" in args else None
    proc = subprocess.Popen([sys.executable, str(DOUBLE), "serve", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the double exited: {proc.stdout.read() if proc.stdout else ''}"
            try:
                if http(port, "/health", key=None)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail("the engine double did not answer /health within 15 s")
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def double(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The double serving the speculative profile's rendered config; yields its port."""
    port = free_port()
    profile = {**PROFILES[SPEC_PROFILE], "port": port}
    config = tmp_path_factory.mktemp("double") / "sglang.yaml"
    overrides = {"sglang_listen_address": "127.0.0.1", "sglang_api_key": API_KEY}
    config.write_text(render_config(profile, overrides), encoding="utf-8")
    # --port repeats the config's port on the command line (as SGLang, the command line wins) for the poller.
    with running_double("sglang", ["--config", str(config), "--port", str(port)]):
        yield port


@pytest.fixture(scope="module")
def responses(double: int) -> dict[str, dict[str, Any]]:
    """The double's answers, keyed by the SGLang protocol model that describes them."""
    calls = {
        "ModelList": ("/v1/models", None),
        "ChatCompletionResponse": ("/v1/chat/completions", {
            "model": PROFILES[SPEC_PROFILE]["served_model_name"], "max_tokens": 12,
            "messages": [{"role": "user", "content": "say ok"}]}),
        "CompletionResponse": ("/v1/completions", {
            "model": PROFILES[SPEC_PROFILE]["served_model_name"], "max_tokens": 12, "prompt": "say ok"}),
    }
    answers = {}
    for model_name, (path, body) in calls.items():
        status, text = http(double, path, body)
        assert status == 200, f"{path}: {status} {text}"
        answers[model_name] = json.loads(text)
    return answers


# Deliberately broken bodies, validated in the same venv process: the validator is no rubber stamp.
BROKEN = [("ChatCompletionResponse", {"id": "x", "model": "m", "usage": {}, "choices": [{"index": 0}]}),
          ("ModelList", {"object": "list", "data": [{"object": "model"}]})]


@pytest.fixture(scope="module")
def validation(responses: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """[results for the double's answers, results for BROKEN]."""
    proc_input = json.dumps([list(responses.items()), BROKEN])
    return run_json_in_venv_stdin(VALIDATE_CODE, proc_input)


@pytest.fixture(scope="module")
def validated(validation: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return validation[0]


def run_json_in_venv_stdin(code: str, stdin: str) -> Any:
    proc = subprocess.run([str(contract_python()), "-c", code], input=stdin, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model_name", ["ModelList", "ChatCompletionResponse", "CompletionResponse"])
def test_response_validates_against_sglang_protocol(validated: dict[str, Any], model_name: str) -> None:
    result = validated[model_name]
    assert result["valid"], f"{model_name}: {result.get('errors')}"
    assert result["ignored"] == [], f"{model_name}: keys SGLang's model does not have: {result['ignored']}"


@pytest.mark.parametrize("model_name", ["ModelList", "ChatCompletionResponse", "CompletionResponse"])
def test_object_field_is_what_sglang_sends(validated: dict[str, Any], responses: dict[str, Any],
                                           model_name: str) -> None:
    assert responses[model_name]["object"] == validated[model_name]["object_default"]


def test_models_card_names_the_served_model(responses: dict[str, Any]) -> None:
    card = responses["ModelList"]["data"][0]
    profile = PROFILES[SPEC_PROFILE]
    assert card["id"] == profile["served_model_name"]
    assert card["root"] == profile["model"]["path"]
    assert card["max_model_len"] == profile["context_length"]


def test_usage_adds_up(responses: dict[str, Any]) -> None:
    for name in ("ChatCompletionResponse", "CompletionResponse"):
        usage = responses[name]["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], name


def test_protocol_validation_catches_a_wrong_shape(validation: list[dict[str, Any]]) -> None:
    """A chat choice without `message` and a model card without `id` fail SGLang's models."""
    result = validation[1]
    assert result["ChatCompletionResponse"]["valid"] is False
    assert result["ModelList"]["valid"] is False


def test_metric_names_exist_in_sglang(double: int, responses: dict[str, Any]) -> None:
    definitions = sglang_metric_definitions()
    assert len(definitions["definitions"]) > 50, definitions["source"]  # the reader found SGLang's metrics
    status, text = http(double, "/metrics", key=None)
    assert status == 200
    declared, samples = {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            declared[name] = kind
        elif line and not line.startswith("#"):
            samples.append(line.split("{", 1)[0].split(" ", 1)[0])
    sglang_samples = [s for s in samples if s.startswith("sglang:")]
    assert "sglang:spec_accept_length" in sglang_samples  # the speculative profile serves spec metrics
    unknown = sorted({s for s in sglang_samples if s not in definitions["samples"]})
    assert unknown == [], f"metrics SGLang {definitions['source']} does not define: {unknown}"
    for sample in sglang_samples:
        kind, family = definitions["samples"][sample]
        assert declared.get(family) == kind, f"{sample}: double says {declared.get(family)}, SGLang {kind}"


def test_metric_reader_rejects_a_made_up_name() -> None:
    samples = sglang_metric_definitions()["samples"]
    assert "sglang:generation_tokens_total" in samples
    assert "sglang:num_requests_running" not in samples  # a vLLM-style name SGLang does not have


def test_double_rejects_a_missing_api_key(double: int) -> None:
    status, _ = http(double, "/v1/models", key=None)
    assert status == 401


# String keys SGLang's info endpoints are built with: dict-literal keys in entrypoints/http_server.py
# (/model_info, /server_info) and `state["..."] = ...` keys in managers/scheduler_components/internal_state.py
# (each /server_info internal_states entry). Read with ast from the installed source, nothing imported.
INFO_KEYS_CODE = r"""
import ast, importlib.util, json, pathlib
srt = pathlib.Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / "srt"
def dict_keys(path):
    keys = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            keys |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                keys.add(node.slice.value)
    return keys
http = dict_keys(srt / "entrypoints" / "http_server.py")
state = dict_keys(srt / "managers" / "scheduler_components" / "internal_state.py")
print(json.dumps({"http_server": sorted(http), "internal_state": sorted(state)}))
"""
DOUBLE_ONLY_KEYS = {"test_double"}  # the double's marker that it is one; not an SGLang key


@pytest.fixture(scope="module")
def info_keys() -> dict[str, set[str]]:
    proc = subprocess.run([str(contract_python()), "-c", INFO_KEYS_CODE], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {name: set(keys) for name, keys in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def test_model_info_keys_are_sglangs(double: int, info_keys: dict[str, set[str]]) -> None:
    status, text = http(double, "/model_info")
    assert status == 200
    keys = set(json.loads(text)) - DOUBLE_ONLY_KEYS
    assert {"model_path", "served_model_name", "tokenizer_path"} <= keys
    assert keys - info_keys["http_server"] == set()


def test_server_info_speculative_state_uses_sglangs_names(double: int, info_keys: dict[str, set[str]]) -> None:
    """verify reads internal_states[0].avg_spec_accept_length, as SGLang's own benchmark client does."""
    status, text = http(double, "/server_info")
    assert status == 200
    info = json.loads(text)
    assert {"internal_states", "version"} <= info_keys["http_server"]
    state = info["internal_states"][0]
    assert "avg_spec_accept_length" in state  # the double serves the speculative profile
    assert set(state) - info_keys["internal_state"] == set()


# ---- Streaming and thinking, against each engine's own protocol models -------------------------------------
# Each streamed chunk (the JSON after `data: `) is validated with the engine's pydantic model of a stream
# chunk: SGLang 0.5.23 sglang.srt.entrypoints.openai.protocol, vLLM 0.33.0
# vllm.entrypoints.openai.{chat_completion,completion}.protocol. Keys a model does not have are reported.
STREAM_VALIDATE_CODE = r"""
import importlib, json, sys
from pydantic import BaseModel, ValidationError

""" + IGNORED_KEYS_CODE + r"""
request = json.loads(sys.stdin.read())
classes = {name: getattr(importlib.import_module(module), name) for name, module in request["models"].items()}
results = []
for name, body in request["bodies"]:
    try:
        obj = classes[name].model_validate(body)
    except ValidationError as exc:
        results.append({"valid": False, "errors": exc.errors(include_url=False)})
        continue
    results.append({"valid": True, "ignored": ignored_keys(obj, body)})
print(json.dumps(results, default=str))
"""
SGLANG_PROTOCOL = "sglang.srt.entrypoints.openai.protocol"
PROTOCOL_MODELS = {
    "sglang": {"ChatCompletionStreamResponse": SGLANG_PROTOCOL, "CompletionStreamResponse": SGLANG_PROTOCOL,
               "ChatCompletionResponse": SGLANG_PROTOCOL},
    "vllm": {"ChatCompletionStreamResponse": "vllm.entrypoints.openai.chat_completion.protocol",
             "ChatCompletionResponse": "vllm.entrypoints.openai.chat_completion.protocol",
             "CompletionStreamResponse": "vllm.entrypoints.openai.completion.protocol"},
}
REASONING_KEY = {"sglang": "reasoning_content", "vllm": "reasoning"}
QUESTION = "What is 123 + 456? Reply with the number only."


def sse(port: int, path: str, body: dict[str, Any]) -> list[Any]:
    """POST with stream: true and read the server-sent events: each `data: ` payload (JSON, or the final
    `[DONE]`), checking each event is one `data:` line followed by a blank line, as the engines write them."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "", f"the stream does not end with a blank line: {raw[-200:]!r}"
    payloads = []
    for event in events[:-1]:
        assert event.startswith("data: ") and "\n" not in event, f"not one data line: {event!r}"
        data = event[len("data: "):]
        payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def validate_in(python: Path, flavour: str, bodies: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    stdin = json.dumps({"models": PROTOCOL_MODELS[flavour], "bodies": bodies})
    proc = subprocess.run([str(python), "-c", STREAM_VALIDATE_CODE], input=stdin, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def vllm_double(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The vLLM-flavour double with the speculative profile's vLLM options (Kimi's parsers among them)."""
    profile = PROFILES[SPEC_PROFILE]
    port = free_port()
    args = [profile["model"]["path"], "--port", str(port), "--host", "127.0.0.1", "--served-model-name",
            profile["served_model_name"], "--api-key", API_KEY]
    for flag, value in (profile.get("vllm_options") or {}).items():
        args += [f"--{flag}"] if value is True else [f"--{flag}", str(value)]
    with running_double("vllm", args):
        yield port


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    from vllm_helpers import contract_venv, pinned_vllm_version

    return contract_venv(pinned_vllm_version()) / "bin" / "python"


@pytest.fixture(scope="module")
def streams(double: int, vllm_double: int) -> dict[str, dict[str, list[Any]]]:
    """Per flavour: a thinking chat stream, a chat stream with thinking off, a completion stream (all with
    usage), and a chat stream without stream_options."""
    model = PROFILES[SPEC_PROFILE]["served_model_name"]
    chat = {"model": model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 400,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    result = {}
    for flavour, port in (("sglang", double), ("vllm", vllm_double)):
        result[flavour] = {
            "thinking": sse(port, "/v1/chat/completions", chat),
            "no_thinking": sse(port, "/v1/chat/completions", {**chat, "chat_template_kwargs": {"thinking": False}}),
            "completion": sse(port, "/v1/completions", {"model": model, "prompt": "say ok", "max_tokens": 7,
                                                        "stream": True, "stream_options": {"include_usage": True}}),
            "no_usage": sse(port, "/v1/chat/completions", {**chat, "stream_options": None}),
        }
    return result


def whole_chat_response(port: int) -> dict[str, Any]:
    """The request verify's smoke sent before thinking was turned off: 32 tokens, thinking on by default."""
    body = {"model": PROFILES[SPEC_PROFILE]["served_model_name"], "max_tokens": 32, "temperature": 0,
            "messages": [{"role": "user", "content": "Reply with one short sentence: what is 2 + 2?"}]}
    status, text = http(port, "/v1/chat/completions", body)
    assert status == 200
    return json.loads(text)


# Deliberately broken: a chunk without `choices`, a completion chunk with a finish_reason no engine sends.
BROKEN_CHUNKS = [("ChatCompletionStreamResponse", {"id": "x", "object": "chat.completion.chunk", "created": 1,
                                                   "model": "m"}),
                 ("CompletionStreamResponse", {"id": "x", "created": 1, "model": "m",
                                               "choices": [{"index": 0, "text": "a", "finish_reason": "eos"}]})]


@pytest.fixture(scope="module")
def whole_responses(double: int, vllm_double: int) -> dict[str, dict[str, Any]]:
    return {"sglang": whole_chat_response(double), "vllm": whole_chat_response(vllm_double)}


@pytest.fixture(scope="module")
def stream_validation(streams: dict[str, dict[str, list[Any]]], whole_responses: dict[str, dict[str, Any]],
                      vllm_python: Path) -> dict[str, dict[str, list[dict]]]:
    """Per flavour, one run of the engine's venv: {"stream": [...], "whole": [...], "broken": [...]}."""
    results = {}
    for flavour, python in (("sglang", contract_python()), ("vllm", vllm_python)):
        stream = []
        for name, payloads in streams[flavour].items():
            model = "CompletionStreamResponse" if name == "completion" else "ChatCompletionStreamResponse"
            stream += [(model, chunk) for chunk in payloads if chunk != "[DONE]"]
        whole = [("ChatCompletionResponse", whole_responses[flavour])]
        checked = validate_in(python, flavour, stream + whole + BROKEN_CHUNKS)
        results[flavour] = {"stream": checked[:len(stream)], "whole": checked[len(stream):-len(BROKEN_CHUNKS)],
                            "broken": checked[-len(BROKEN_CHUNKS):]}
    return results


@pytest.mark.parametrize("flavour", ["sglang", "vllm"])
def test_every_streamed_chunk_validates_against_the_engines_protocol(stream_validation: dict, flavour: str):
    results = stream_validation[flavour]["stream"]
    assert len(results) > 20
    invalid = [r["errors"] for r in results if not r["valid"]]
    assert invalid == [], invalid[:3]
    ignored = sorted({key for r in results for key in r["ignored"]})
    assert ignored == [], f"keys {flavour}'s stream models do not have: {ignored}"


@pytest.mark.parametrize("flavour", ["sglang", "vllm"])
@pytest.mark.parametrize("name", ["thinking", "no_thinking", "completion"])
def test_stream_ends_with_the_usage_chunk_then_done(streams: dict, flavour: str, name: str):
    payloads = streams[flavour][name]
    assert payloads[-1] == "[DONE]" and "[DONE]" not in payloads[:-1]
    usage_chunk = payloads[-2]
    assert usage_chunk["choices"] == [] and "usage" in usage_chunk
    assert all("usage" not in chunk for chunk in payloads[:-2])  # no continuous usage unless asked
    usage = usage_chunk["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    token_chunks = [c for c in payloads[:-2] if any(
        (choice.get("text") or choice.get("delta", {}).get("content") or
         choice.get("delta", {}).get(REASONING_KEY[flavour])) for choice in c["choices"])]
    assert usage["completion_tokens"] == len(token_chunks)
    finishes = [choice["finish_reason"] for c in payloads[:-2] for choice in c["choices"] if choice["finish_reason"]]
    assert len(finishes) == 1
    ids = {c["id"] for c in payloads[:-1]}
    assert len(ids) == 1


@pytest.mark.parametrize("flavour", ["sglang", "vllm"])
def test_without_include_usage_there_is_no_usage_chunk(streams: dict, flavour: str):
    payloads = streams[flavour]["no_usage"]
    assert payloads[-1] == "[DONE]"
    assert all(chunk["choices"] and "usage" not in chunk for chunk in payloads[:-1])


def _joined(payloads: list[Any], key: str) -> str:
    return "".join(choice["delta"].get(key) or "" for c in payloads[:-1] for choice in c["choices"])


@pytest.mark.parametrize("flavour", ["sglang", "vllm"])
def test_kimi_thinks_into_the_engines_reasoning_field_unless_thinking_is_off(streams: dict, flavour: str):
    thinking, plain = streams[flavour]["thinking"], streams[flavour]["no_thinking"]
    assert "123 + 456" in _joined(thinking, REASONING_KEY[flavour])
    assert _joined(thinking, "content").strip() == "579"  # the answer after the thinking, 400 tokens allow it
    assert _joined(plain, REASONING_KEY[flavour]) == ""
    assert _joined(plain, "content") == "579"
    other = {"sglang": "reasoning", "vllm": "reasoning_content"}[flavour]
    assert all(other not in choice["delta"] for c in thinking[:-1] for choice in c["choices"])


@pytest.mark.parametrize("flavour", ["sglang", "vllm"])
def test_whole_chat_response_puts_a_truncated_thought_in_the_reasoning_field(whole_responses: dict,
                                                                            stream_validation: dict, flavour: str):
    """Why the old smoke failed every Kimi deploy: 32 tokens of thought in the reasoning field, empty content."""
    response = whole_responses[flavour]
    message = response["choices"][0]["message"]
    assert not message["content"] and "2 + 2" in message[REASONING_KEY[flavour]]
    assert response["choices"][0]["finish_reason"] == "length"
    [result] = stream_validation[flavour]["whole"]
    assert result["valid"] and result["ignored"] == [], result


@pytest.mark.parametrize("flavour", ["sglang", "vllm"])
def test_stream_validation_catches_a_wrong_chunk(stream_validation: dict, flavour: str):
    results = [r["valid"] for r in stream_validation[flavour]["broken"]]
    assert results[0] is False  # no choices
    if flavour == "sglang":
        assert results[1] is False  # SGLang's finish_reason is a Literal; vLLM's is any string
