"""playbooks/verify.yml with the engines' REAL benchmark clients against the engine test double.

SGLang's `python -m sglang.benchmark.serving` (0.5.23) and vLLM's `vllm bench serve` (0.33.0), from the contract
venvs, run with the arguments the verify role builds from the pinned locks' `bench:` recipes, on the ShareGPT test
fixture, with a tokenizer that loads only with trust_remote_code (custom code through `auto_map`, as Kimi's).
The doubles serve with Kimi's reasoning parser, and the gated (ShareGPT) levels go through each client's chat path:
streamed /v1/chat/completions requests with `thinking: true`, whose tokens all arrive as reasoning deltas, which
each client must count. `record` and `vllm` also run a second gated level sampled (verify_bench_sampled_concurrency),
whose requests must carry the sampling parameters. Two playbook runs share the doubles:

1. `record` serves a profile without speculation; its run (verify_mode=baseline: no smoke) records the baseline
   on the host. Beside it, vLLM's client without --trust-remote-code fails on the tokenizer.
2. Copies of `record`'s state directory switched to speculative releases (another profile name, same model
   revision): `slow` (0.66x) fails the gate on the ratio, `fast` (1.8x) passes, both without a warning;
   `other_commit`'s model directory records another revision, so the recorded baseline is not used. `vllm`
   serves a speculative vLLM release with trust_remote_code on a host where nothing was recorded: the report is
   written and the gate fails "speed-up not measured".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sglang_helpers import REPO_ROOT, contract_python, pinned_sglang_lock
from sglang_resolve import resolve_path
from vllm_helpers import contract_venv, pinned_vllm_version

sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))
from verify_helpers import (
    BENCH_DOUBLE,
    SHAREGPT_FIXTURE,
    EngineDouble,
    host_report_dir,
    run_verify,
    write_inventory,
    write_serving_state,
)

pytestmark = pytest.mark.contract

TOKENIZER = REPO_ROOT / "tests" / "fixtures" / "tokenizer-remote-code"
LAUNCHER = Path(__file__).resolve().parent / "sglang_bench_launcher.py"
# Not under stubs/: those are hashed into the contract venv's recipe; these only go on the launcher's path.
BENCH_STUBS = Path(__file__).resolve().parent / "bench_stubs"
SPEED = {"ENGINE_DOUBLE_TOKENS_PER_S": "50"}
# speculative output tok/s = accept length / spec cost x base: 1.18/1.78 = 0.66x, 2.95/1.64 = 1.8x
SLOW = {**SPEED, "ENGINE_DOUBLE_ACCEPT_RATE": "0.15", "ENGINE_DOUBLE_SPEC_COST": "1.78"}
FAST = {**SPEED, "ENGINE_DOUBLE_ACCEPT_RATE": "0.8", "ENGINE_DOUBLE_SPEC_COST": "1.64"}
# Kimi-K2.5 as the releases serve it: it thinks unless a request turns thinking off.
KIMI_PARSER = {"reasoning-parser": "kimi_k2"}
# One gated level, four ShareGPT prompts of 32 output tokens: a couple of seconds per run at 50 tok/s.
WORKLOAD = {"verify_concurrency": [1], "verify_gate_concurrency": [1], "verify_bench_sampled_concurrency": 0,
            "verify_bench_output_len": 32, "verify_bench_min_prompts": 4, "verify_bench_prompts_per_concurrency": 4,
            "verify_bench_warmup_requests": 0, "verify_sharegpt_subset": str(SHAREGPT_FIXTURE)}
# `record` and `vllm`: a second gated level, the sampled one, 8 prompts (the default verify_bench_sampling). The
# baseline key does not depend on the levels run, so the speculative hosts still find `record`'s baseline of level 1.
SAMPLED = {"verify_concurrency": [1, 2], "verify_gate_concurrency": [1, 2], "verify_bench_sampled_concurrency": 2}
SAMPLING = {"temperature": 0.6, "top_p": 0.95}


def _model_dir(root: Path, revision: str) -> Path:
    """A model directory as the model store leaves it: .model_store/manifest.json records the revision."""
    (root / ".model_store").mkdir(parents=True)
    (root / ".model_store" / "manifest.json").write_text(json.dumps({"format": 1, "revision": revision,
                                                                       "complete": True, "files": []}))
    return root


def _vllm_without_trust(python: Path, double: EngineDouble, work: Path, env: dict[str, str]) -> subprocess.Popen:
    """vLLM's client as verify would run it, less --trust-remote-code: it must refuse the tokenizer."""
    args = ["bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--dataset-name",
            "sharegpt", "--dataset-path", str(SHAREGPT_FIXTURE), "--sharegpt-output-len", "8", "--base-url",
            double.base_url, "--model", double.served_name, "--tokenizer", str(TOKENIZER), "--num-prompts", "1",
            "--temperature", "0.0", "--save-result", "--result-dir", str(work / "untrusted")]
    return subprocess.Popen([str(python), "-m", "vllm.entrypoints.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, env={**os.environ, **env})


@pytest.fixture(scope="module")
def clients() -> dict[str, object]:
    sglang_module = pinned_sglang_lock()["bench"]["module"]
    paths = os.pathsep.join(str(p) for p in [BENCH_STUBS, *resolve_path()])
    return {"sglang": [str(contract_python()), str(LAUNCHER), paths, sglang_module],
            "vllm_venv": contract_venv(pinned_vllm_version())}


@pytest.fixture(scope="module")
def runs(clients, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("verify-real")
    env = {"HF_HOME": str(work / "hf-home")}  # transformers copies the tokenizer's custom code under it
    model = _model_dir(work / "models" / "kimi", "c0ffee0000000000000000000000000000000001")
    other_model = _model_dir(work / "models" / "kimi-other", "deadbeef00000000000000000000000000000002")
    doubles = {name: EngineDouble(work, name, flavour, speculative=spec, options=KIMI_PARSER,
                                  env={**denv, "ENGINE_DOUBLE_REQUEST_LOG": str(work / f"{name}-requests.jsonl")})
               for name, flavour, spec, denv in (("base", "sglang", False, SPEED), ("base2", "sglang", False, SPEED),
                                                 ("slow", "sglang", True, SLOW),
                                                 ("fast", "sglang", True, FAST), ("fast2", "sglang", True, FAST),
                                                 ("vfast", "vllm", True, FAST))}
    reports = work / "artifacts"

    def host(name: str, double: EngineDouble, profile: str, model_dir: Path, state: Path | None = None,
             **extra: object) -> dict:
        state = state or work / "state" / name
        # vLLM: the role's own command, <release venv>/bin/python -m <lock module>, with the contract venv as the
        # release's venv. SGLang: its CPU venv needs the overlay and stubs first on the path (the launcher).
        vllm = double.flavour == "vllm"
        write_serving_state(state, double, TOKENIZER, profile, trust_remote_code=True,
                            model_paths=[str(model_dir)], venv=str(clients["vllm_venv"]) if vllm else None)
        command = {} if vllm else {"verify_bench_command": clients["sglang"]}
        return {"engine_service_state_dir": str(state), "ansible_become": False, "verify_report_dir": str(reports),
                **WORKLOAD, **command, **extra}

    started = time.monotonic()
    try:
        for double in doubles.values():
            double.wait_listening()
        untrusted = _vllm_without_trust(clients["vllm_venv"] / "bin" / "python", doubles["vfast"], work, env)
        first = work / "first.yml"
        write_inventory(first, {
            "record": host("record", doubles["base"], "kimi-plain", model, verify_mode="baseline", **SAMPLED),
        })
        result_1 = run_verify(first, env=env, timeout_s=300, verbosity='-v', workdir=work)
        print(f"first playbook run done at {time.monotonic() - started:.1f} s")
        untrusted_output = untrusted.communicate(timeout=120)[0]
        recorded = work / "state" / "record"
        for name in ("fast", "other_commit", "rerecord"):
            shutil.copytree(recorded, work / "state" / name)
        second = work / "second.yml"
        write_inventory(second, {
            "slow": host("slow", doubles["slow"], "kimi-eagle3", model, state=recorded),
            "fast": host("fast", doubles["fast"], "kimi-eagle3", model, state=work / "state" / "fast"),
            "other_commit": host("other_commit", doubles["fast2"], "kimi-eagle3", other_model,
                                 state=work / "state" / "other_commit"),
            "vllm": host("vllm", doubles["vfast"], "kimi-eagle3", model, **SAMPLED),
            # the same key measured again: the new numbers replace the old, which move to the history
            "rerecord": host("rerecord", doubles["base2"], "kimi-plain", model, state=work / "state" / "rerecord",
                             verify_mode="baseline", **SAMPLED),
        })
        result_2 = run_verify(second, env=env, timeout_s=300, verbosity='-v', workdir=work)
        print(f"second playbook run done at {time.monotonic() - started:.1f} s")
        output = result_1.stdout + result_2.stdout
        (work / "ansible-playbook.log").write_text(output, encoding="utf-8")
        yield {"output": output, "runs": (result_1, result_2), "reports": reports, "work": work, "doubles": doubles,
               "untrusted": (untrusted.returncode, untrusted_output)}
    finally:
        for double in doubles.values():
            double.stop()


def _recap(runs: dict, host: str) -> dict[str, int]:
    played = [run for run in runs["runs"] if run.played(host)]
    assert played, f"no recap for {host}:\n{runs['output'][-3000:]}"
    return played[0].recap(host)


def _report(runs: dict, host: str) -> dict:
    return json.loads((host_report_dir(runs["reports"], host) / "report.json").read_text())


def _inputs(runs: dict, host: str) -> dict:
    return json.loads((host_report_dir(runs["reports"], host) / "inputs.json").read_text())


def test_the_real_clients_ran_with_the_recipes_arguments_on_sharegpt(runs):
    for host, marker, backend in (("record", "sglang.benchmark.serving", "sglang-oai-chat"),
                                  ("vllm", "vllm.entrypoints.cli.main", "openai-chat")):
        inputs = _inputs(runs, host)
        assert marker in inputs["bench"]["command"]
        # the real client's results (the command above), allow-listed: the greedy level, then the sampled one
        for level, prompts in zip(inputs["bench"]["levels"], (4, 8), strict=True):
            result = level["result"]
            # every token was thinking (streamed as reasoning deltas), and each client counted all of them
            assert result["completed"] == prompts and result["total_output_tokens"] == prompts * 32, result
            assert result["backend"] == backend
        assert [(level["workload"], level["sampling"]) for level in inputs["bench"]["levels"]] == [
            ("sharegpt", {"temperature": 0.0}), ("sharegpt_sampled", SAMPLING)]
    assert {level["result"]["dataset_name"] for level in _inputs(runs, "record")["bench"]["levels"]} == {"sharegpt"}
    report = _report(runs, "vllm")
    assert [(row["workload"], row["sampling"]) for row in report["levels"]] == [
        ("sharegpt", {"temperature": 0.0}), ("sharegpt_sampled", SAMPLING)]
    assert report["workloads"]["sharegpt"]["sampling"] == {"temperature": 0.0}
    assert report["workloads"]["sharegpt_sampled"]["sampling"] == SAMPLING
    assert "speedup" not in report["levels"][0]  # nothing recorded on this host: see the next-but-one test
    assert report["levels"][0]["acceptance"]["rate"] > 0.3  # the window saw the double's drafts
    assert "--trust-remote-code" in runs["output"]  # the release says trust_remote_code: the role passes it


def _bench_requests(runs: dict, double: str) -> list[dict]:
    """The generation requests the double got from the benchmark client (the smoke asks for other max_tokens)."""
    log = runs["work"] / f"{double}-requests.jsonl"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [line for line in lines if line["max_tokens"] == WORKLOAD["verify_bench_output_len"]]


@pytest.mark.parametrize(("host", "double"), [("record", "base"), ("vllm", "vfast")])
def test_the_gated_levels_sent_the_conversations_as_chat_requests(runs, host, double):
    """What users send: each ShareGPT human turn as the user message of a streamed chat completion, thinking on
    (Kimi's default, so the drafter is measured on reasoning tokens), with the recipe's fixed output length; the
    greedy level at temperature 0, the sampled level with its temperature and top_p (SGLang's client sends them from
    --extra-request-body, vLLM's from --temperature and --top-p)."""
    requests = _bench_requests(runs, double)
    greedy = [request for request in requests if request["temperature"] == 0.0]
    sampled = [request for request in requests if request["temperature"] != 0.0]
    assert (len(greedy), len(sampled)) == (4, 8), requests
    chat = {"path": "/v1/chat/completions", "stream": True, "include_usage": True, "ignore_eos": True,
            "chat_template_kwargs": {"thinking": True}, "max_tokens": 32, "roles": ["user"]}
    for request in greedy:
        assert request == {**chat, "temperature": 0.0, "top_p": None}, request
    for request in sampled:
        assert request == {**chat, **SAMPLING}, request
    report = _report(runs, host)
    for name in ("sharegpt", "sharegpt_sampled"):
        workload = report["workloads"][name]
        assert workload["endpoint"] == "/v1/chat/completions" and workload["chat_template_kwargs"] == {"thinking": True}
        assert report["baseline_key"]["workloads"][name] == workload  # the route and the sampling are in the key


def test_vllm_client_refuses_the_custom_code_tokenizer_without_the_flag(runs):
    returncode, output = runs["untrusted"]
    assert returncode != 0
    assert "contains custom code which must be executed" in output and "trust_remote_code=True" in output


def test_no_recorded_baseline_fails_speed_up_not_measured(runs):
    assert _recap(runs, "vllm")["failed"] == 1
    assert "verify gate FAILED on vllm: speed-up not measured at concurrency 1: no comparable baseline" \
        in runs["output"]
    assert not _report(runs, "vllm")["gate"]["passed"]


def test_the_run_without_speculation_records_its_baseline_on_the_host(runs):
    assert _recap(runs, "record")["failed"] == 0
    files = list((runs["work"] / "state" / "record" / "verify-baselines").glob("*.json"))
    assert len(files) == 1
    document = json.loads(files[0].read_text())
    assert document["profile"] == "kimi-plain" and document["key"]["model"].startswith("c0ffee")
    assert document["levels"] == {"1": {"workload": "sharegpt"}, "2": {"workload": "sharegpt_sampled"}}


def test_a_second_recording_of_the_same_key_keeps_the_first_in_the_history(runs):
    assert _recap(runs, "rerecord")["failed"] == 0
    first = next((runs["work"] / "state" / "record" / "verify-baselines").glob("*.json"))
    store = runs["work"] / "state" / "rerecord" / "verify-baselines"
    assert [path.name for path in store.glob("*.json")] == [first.name]  # the same key, one current file
    kept = list((store / "history").iterdir())
    assert len(kept) == 1 and kept[0].name.startswith(f"{first.stem}-")
    assert kept[0].read_text() == first.read_text()  # the first recording, as it was
    current = json.loads((store / first.name).read_text())
    assert current["timestamp"] != json.loads(first.read_text())["timestamp"]
    assert f"(the one it replaces kept in {store}/history/)" in runs["output"]


def test_066x_fails_on_the_ratio_with_no_warning(runs):
    assert _recap(runs, "slow")["failed"] == 1
    report = _report(runs, "slow")
    assert report["gate"]["warnings"] == []
    assert "recorded on the host" in report["baseline"]["source"] and "'kimi-plain'" in report["baseline"]["source"]
    message = re.search(r"speed-up (0\.\d\d)x at concurrency 1 is below the 1\.00x minimum", runs["output"])
    assert message and float(message.group(1)) < 1.0, runs["output"][-3000:]


def test_18x_passes_with_no_warning(runs):
    assert _recap(runs, "fast")["failed"] == 0
    report = _report(runs, "fast")
    assert report["gate"]["passed"] and report["gate"]["warnings"] == []
    assert report["levels"][0]["speedup"]["value"] >= 1.0, report["levels"][0]  # the gate's side of 1.00x
    assert "WARNING:" not in "\n".join(line for line in runs["output"].splitlines() if "fast" in line)


def test_a_baseline_of_another_model_commit_is_not_used(runs):
    assert _recap(runs, "other_commit")["failed"] == 1
    report = _report(runs, "other_commit")
    assert "speedup" not in report["levels"][0]
    assert report["gate"]["failures"][0].startswith("speed-up not measured at concurrency 1")
    assert report["baseline_key"]["model"].startswith("deadbeef")


@pytest.mark.parametrize(("host", "double", "prefix"), [("slow", "slow", []), ("vllm", "vfast", ["bench", "serve"])])
def test_the_bench_client_double_writes_the_keys_the_real_client_writes(runs, host, double, prefix):
    """Where the real client cannot run (the container hosts), the double stands in: same flags, same JSON keys."""
    engine = runs["doubles"][double]
    out = runs["work"] / f"double-{host}"
    common = ["--base-url", engine.base_url, "--model", engine.served_name, "--tokenizer", str(TOKENIZER),
              "--dataset-name", "sharegpt", "--dataset-path", str(SHAREGPT_FIXTURE), "--sharegpt-output-len", "8",
              "--num-prompts", "2", "--max-concurrency", "1", "--request-rate", "inf"]
    if prefix:
        flavour = ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--ignore-eos", "--temperature",
                   "0.0", "--extra-body", '{"chat_template_kwargs":{"thinking":true}}', "--num-warmups", "0",
                   "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "99", "--save-result",
                   "--result-dir", str(out), "--result-filename", "r.json"]
    else:
        body = '{"chat_template_kwargs":{"thinking":true},"stream_options":{"include_usage":true},"temperature":0.0}'
        flavour = ["--backend", "sglang-oai-chat", "--warmup-requests", "0", "--extra-request-body", body,
                   "--output-file", str(out / "r.json")]
    out.mkdir()
    subprocess.run([sys.executable, str(BENCH_DOUBLE), *prefix, *common, *flavour], check=True, capture_output=True,
                   timeout=60)
    written = json.loads((out / "r.json").read_text().splitlines()[-1])
    sent = [json.loads(line) for line in (runs["work"] / f"{double}-requests.jsonl").read_text().splitlines()]
    assert {(r["path"], r["max_tokens"]) for r in sent if r["max_tokens"] == 8} == {("/v1/chat/completions", 8)}
    # the names of every field the real client wrote (verify keeps the values of its allow-list only)
    real = set(_inputs(runs, host)["bench"]["levels"][0]["result_fields"])
    assert set(written) - {"tag"} <= real, set(written) - {"tag"} - real
    read_by_verify = {"output_throughput", "completed", "duration", "total_output_tokens", "request_throughput",
                      "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms"}
    assert read_by_verify <= set(real) and read_by_verify <= set(written)
