"""roles/verify/files/verify_report.py: baseline resolution, report, Markdown, baseline document, CLI."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from module_utils import bws_metrics

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles" / "verify" / "files" / "verify_report.py"
_spec = importlib.util.spec_from_file_location("verify_report", SCRIPT)
report_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report_mod)


def bench(throughput: float, completed: int = 8) -> dict:
    return {"output_throughput": throughput, "completed": completed, "duration": 2.0, "total_output_tokens": 256,
            "mean_ttft_ms": 300.0, "median_itl_ms": 10.0, "p99_itl_ms": 20.0}


def inputs(**overrides) -> dict:
    base = {
        "host": "gpu01", "engine": "vllm", "profile": "kimi", "mode": "full", "timestamp": "20261129T100000Z",
        "speculative": True, "num_steps": 3, "base_url": "http://127.0.0.1:8000", "served_model_name": "kimi-k2.5",
        "test_double": {"detected": False, "header_x_engine_test_double": False, "marker": ""},
        "readiness": {"health_polls": 3}, "smoke": None, "since_start_accept_length": None,
        "bench": {
            "command": ["/opt/vllm/venv/bin/vllm", "bench", "serve"],
            "workload": {"backend": "openai", "dataset": "random", "input_len": 512, "output_len": 256},
            "levels": [
                {"concurrency": 1, "num_prompts": 16, "result": bench(54.6), "metrics_available": True,
                 "metrics_before": {bws_metrics.VLLM_DRAFTS: 0, bws_metrics.VLLM_DRAFT_TOKENS: 0,
                                    bws_metrics.VLLM_ACCEPTED_TOKENS: 0},
                 "metrics_after": {bws_metrics.VLLM_DRAFTS: 100, bws_metrics.VLLM_DRAFT_TOKENS: 300,
                                   bws_metrics.VLLM_ACCEPTED_TOKENS: 45}},
            ],
        },
        "baseline": {"1": 82.5},
        "gate": {"levels": [1], "min_speedup": 1.0, "min_accept_rate": 0.0, "require_baseline": False},
    }
    base.update(overrides)
    return base


def test_reference_host_case_fails_with_numbers_and_sources():
    report, baseline_doc = report_mod.build_report(inputs(), bws_metrics)
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
    assert "| 1 | 54.6 | 82.5 | 0.66x | 15.0% | 1.45 | 300.0 | 10.0 | 20.0 | 8 | yes |" in markdown
    assert "![Throughput per concurrency, baseline vs this run, and acceptance](throughput.png)" in markdown
    assert "ENGINE TEST DOUBLE" not in markdown


def test_test_double_is_shown_prominently():
    report, _ = report_mod.build_report(inputs(test_double={"detected": True, "header_x_engine_test_double": True,
                                                             "marker": "ENGINE TEST DOUBLE (not an engine)"}),
                                        bws_metrics)
    assert report_mod.markdown(report).splitlines()[2].startswith("> **⚠ ENGINE TEST DOUBLE.**")
    assert report_mod.summary_lines(report)[0].endswith("[ENGINE TEST DOUBLE]")


def test_no_baseline_is_said_explicitly():
    report, _ = report_mod.build_report(inputs(baseline=None), bws_metrics)
    assert report["gate"]["passed"]
    assert report["gate"]["warnings"][0] == "NO BASELINE: the speed-up of speculative decoding was not measured"
    assert "none: no baseline recorded" in report_mod.markdown(report)
    required = inputs(baseline=None, gate={"levels": [1], "min_speedup": 1.0, "min_accept_rate": 0.0,
                                           "require_baseline": True})
    assert not report_mod.build_report(required, bws_metrics)[0]["gate"]["passed"]


def test_baseline_mode_document_round_trips_as_verify_baseline(tmp_path):
    measured = inputs(mode="baseline", speculative=False, baseline=None)
    measured["bench"]["levels"][0]["result"] = bench(82.5)
    measured["bench"]["levels"][0]["metrics_before"] = measured["bench"]["levels"][0]["metrics_after"] = {}
    report, baseline_doc = report_mod.build_report(measured, bws_metrics)
    assert report["gate"]["not_applicable"] == "baseline mode: measurement only"
    assert baseline_doc["kind"] == "verify-baseline" and baseline_doc["output_throughput"] == {"1": 82.5}
    assert baseline_doc["speculative_counters_seen"] is False
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(baseline_doc))
    report, _ = report_mod.build_report(inputs(baseline=str(path)), bws_metrics)
    assert report["levels"][0]["speedup"]["value"] == pytest.approx(54.6 / 82.5)
    assert str(path) in report["levels"][0]["baseline_output_throughput"]["source"]
    assert report["baseline"]["warnings"] == []


def test_baseline_from_another_host_or_workload_is_flagged(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"kind": "verify-baseline", "host": "gpu02", "profile": "kimi", "engine": "vllm",
                                "workload": {"input_len": 1}, "engine_is_test_double": False,
                                "speculative_counters_seen": True, "output_throughput": {"1": 82.5}}))
    report, _ = report_mod.build_report(inputs(baseline=str(path)), bws_metrics)
    warnings = " | ".join(report["gate"]["warnings"])
    assert "baseline host is 'gpu02', this run's is 'gpu01'" in warnings
    assert "compares different benchmarks" in warnings
    assert "may not be a run without speculation" in warnings


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
        report_mod.build_report(inputs(baseline=str(path)), bws_metrics)


def test_speculation_claimed_but_absent_fails():
    claimed = inputs(baseline=None)
    claimed["bench"]["levels"][0]["metrics_after"] = {"vllm:generation_tokens_total": 100.0}
    gate = report_mod.build_report(claimed, bws_metrics)[0]["gate"]
    assert not gate["passed"]
    assert "engine exports no speculative-decoding counters" in gate["failures"][-1]


def test_cli_writes_the_files_and_prints_the_gate(tmp_path):
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--inputs", "-", "--out-dir", str(out), "--chart",
         f"--module-utils={REPO / 'module_utils'}"],
        input=json.dumps(inputs()), capture_output=True, text=True, check=True)
    printed = json.loads(result.stdout)
    assert printed["gate"]["passed"] is False
    assert printed["summary"][-1].startswith("FAIL: speed-up 0.66x at concurrency 1")
    assert {p.name for p in out.iterdir()} == {"inputs.json", "report.json", "report.md", "throughput.png"}
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_bad_baseline_exits_2_with_the_reason(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--inputs", "-", "--out-dir", str(tmp_path / "r"),
         f"--module-utils={REPO / 'module_utils'}"],
        input=json.dumps(inputs(baseline=str(tmp_path / "missing.json"))), capture_output=True, text=True,
        check=False)
    assert result.returncode == 2
    assert "verify_baseline:" in result.stderr and "is not a file" in result.stderr
    assert not (tmp_path / "r").exists()
