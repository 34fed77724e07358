"""The engine test double (tests/doubles/engine_double.py) against the pinned SGLang's own definitions.

The double runs as `engine_double.py serve --config <rendered YAML>` on a free loopback port. Its
/v1/models, /v1/chat/completions and /v1/completions answers are validated by SGLang's pydantic protocol
models (`sglang.srt.entrypoints.openai.protocol`, in the contract venv), keys SGLang would ignore are
reported, every `sglang:*` metric it serves must be defined, with the same type, in SGLang's
`srt/observability/metrics_collector.py`, and the keys of its /model_info and /server_info answers must be
keys SGLang's own handlers use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
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

# Validate each (model class name, JSON body) pair with SGLang's protocol model. `ignored` lists keys of
# the body the model does not know (pydantic drops them silently: the double would be sending noise).
VALIDATE_CODE = r"""
import json, sys
from pydantic import BaseModel, ValidationError
import sglang.srt.entrypoints.openai.protocol as protocol

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


@pytest.fixture(scope="module")
def double(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The double serving the speculative profile's rendered config; yields its port."""
    port = free_port()
    profile = {**PROFILES[SPEC_PROFILE], "port": port}
    config = tmp_path_factory.mktemp("double") / "sglang.yaml"
    overrides = {"sglang_listen_address": "127.0.0.1", "sglang_api_key": API_KEY}
    config.write_text(render_config(profile, overrides), encoding="utf-8")
    env = {**os.environ, "ENGINE_DOUBLE_FLAVOUR": "sglang", "ENGINE_DOUBLE_START_S": "0",
           "ENGINE_DOUBLE_TOKENS_PER_S": "100000"}
    proc = subprocess.Popen([sys.executable, str(DOUBLE), "serve", "--config", str(config)], env=env,
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
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
