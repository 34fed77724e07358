"""plugins/module_utils/engine/metrics.py: Prometheus parsing, window acceptance, speed-up and gate messages."""

from __future__ import annotations

import math

import pytest
from ansible_collections.blackwell.serving.plugins.module_utils.engine import metrics as m
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import load_roster

# The counter names of the engine roster (meta/engines.yml), as the verify role passes them.
SGLANG = load_roster()["sglang"]["metrics"]
VLLM = load_roster()["vllm"]["metrics"]
SGL_C, VLLM_C = SGLANG["counters"], VLLM["counters"]
V_DRAFTS, V_TOKENS, V_ACCEPTED = VLLM_C["drafts"], VLLM_C["draft_tokens"], VLLM_C["accepted_tokens"]

SGLANG_TEXT = """\
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="kimi-k2.5",tp_rank="0",is_streaming="false"} 1200.0
sglang:generation_tokens_total{model_name="kimi-k2.5",tp_rank="0",is_streaming="true"} 300.0
sglang:spec_verify_calls_total{model_name="kimi-k2.5",tp_rank="0"} 600.0
sglang:spec_accept_length{model_name="kimi-k2.5",tp_rank="0"} 2.5
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="kimi-k2.5"} 7
"""


def test_sums_every_label_set_of_a_metric():
    totals = m.parse_prometheus_text(SGLANG_TEXT)
    assert totals["sglang:generation_tokens_total"] == 1500.0
    assert totals["sglang:spec_verify_calls_total"] == 600.0
    assert totals["sglang:time_to_first_token_seconds_bucket"] == 7.0


def test_label_values_with_spaces_quotes_braces_and_timestamps():
    text = (
        'vllm:x_total{model_name="a b} {c",path="say \\"hi\\" }"} 3 1700000000000\n'
        "vllm:x_total 4\n"
        "vllm:y\t+Inf\n"
        "vllm:z NaN\n"
        "\n# EOF\n"
    )
    totals = m.parse_prometheus_text(text)
    assert totals["vllm:x_total"] == 7.0
    assert totals["vllm:y"] == math.inf
    assert math.isnan(totals["vllm:z"])


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('vllm:x{model="a" 1\n', "unterminated label set"),
        ("vllm:x\n", "sample without a value"),
        ("vllm:x{} \n", "sample without a value"),
        ("vllm:x twelve\n", "not a sample value"),
        ("<html>502 Bad Gateway</html>\n", "line 1"),
    ],
)
def test_junk_is_rejected_with_the_line(text, needle):
    with pytest.raises(m.MetricsError, match=needle):
        m.parse_prometheus_text(text)


def test_select_metrics_by_prefix():
    totals = {"sglang:a": 1.0, "vllm:b": 2.0, "process_cpu_seconds_total": 3.0}
    assert m.select_metrics(totals, ["sglang:", "vllm:"]) == {"sglang:a": 1.0, "vllm:b": 2.0}
    assert m.select_metrics(totals, []) == totals


def test_counter_deltas_ignore_gauges_and_refuse_a_restart():
    before = {"a_total": 10.0, "gauge": 5.0}
    after = {"a_total": 25.0, "gauge": 1.0, "new_total": 3.0}
    assert m.counter_deltas(before, after) == {"a_total": 15.0, "new_total": 3.0}
    with pytest.raises(m.MetricsError, match=r"went backwards.*restarted"):
        m.counter_deltas({"a_total": 10.0}, {"a_total": 2.0})


def test_vllm_acceptance_over_the_window_not_since_start():
    before = {V_DRAFTS: 1000, V_TOKENS: 3000, V_ACCEPTED: 2700}  # 90 % before
    after = {V_DRAFTS: 1100, V_TOKENS: 3300, V_ACCEPTED: 2745}  # 45 of 300 in window
    result = m.window_acceptance("vllm", VLLM, before, after)
    assert result.rate == pytest.approx(0.15)
    assert result.length == pytest.approx(1.45)
    assert result.detail == {"drafts": 100, "draft_tokens": 300, "accepted_tokens": 45}
    assert result.problem is None


def test_sglang_acceptance_length_and_rate_from_num_steps():
    before = {SGL_C['generation_tokens']: 5000, SGL_C['verify_calls']: 1000}
    after = {SGL_C['generation_tokens']: 7200, SGL_C['verify_calls']: 2000}
    result = m.window_acceptance("sglang", SGLANG, before, after, num_steps=3)
    assert result.length == pytest.approx(2.2)
    assert result.rate == pytest.approx(0.4)
    unknown_steps = m.window_acceptance("sglang", SGLANG, before, after)
    assert unknown_steps.length == pytest.approx(2.2) and unknown_steps.rate is None
    assert "speculative_num_draft_tokens and speculative_num_steps unknown" in unknown_steps.problem


def test_sglang_rate_divides_by_the_draft_tokens_as_sglang_does():
    """SGLang 0.5.23 (metrics_reporter.py, tokenizer_manager.py): correct drafts / (verify calls x (num_draft_tokens
    - 1)). With a draft tree (eagle_topk > 1) num_draft_tokens - 1 differs from num_steps."""
    before = {SGL_C['generation_tokens']: 0, SGL_C['verify_calls']: 0}
    after = {SGL_C['generation_tokens']: 2200, SGL_C['verify_calls']: 1000}  # 1200 correct drafts
    tree = m.window_acceptance("sglang", SGLANG, before, after, num_steps=3, num_draft_tokens=8)
    assert tree.rate == pytest.approx(1200 / (1000 * 7)) and tree.length == pytest.approx(2.2)
    assert tree.detail["num_draft_tokens"] == 8 and tree.problem is None
    chain = m.window_acceptance("sglang", SGLANG, before, after, num_steps=3, num_draft_tokens=4)
    assert chain.rate == pytest.approx(m.window_acceptance("sglang", SGLANG, before, after, num_steps=3).rate)


def test_one_definition_for_both_engines():
    """k drafts per verify, accept rate r: both formulas give length 1 + r*k for the same traffic."""
    verify_calls, k, accepted = 400, 3, 540
    sglang = m.window_acceptance(
        "sglang",
        SGLANG,
        {},
        {SGL_C['generation_tokens']: verify_calls + accepted, SGL_C['verify_calls']: verify_calls},
        num_steps=k,
    )
    vllm = m.window_acceptance(
        "vllm",
        VLLM,
        {},
        {V_DRAFTS: verify_calls, V_TOKENS: verify_calls * k, V_ACCEPTED: accepted},
    )
    assert sglang.rate == pytest.approx(vllm.rate) and sglang.length == pytest.approx(vllm.length)


def test_acceptance_problems_are_named():
    assert "no speculative-decoding counters" in m.window_acceptance("sglang", SGLANG, {}, {"x": 1}).problem
    idle = {V_DRAFTS: 5, V_TOKENS: 15, V_ACCEPTED: 3}
    assert m.window_acceptance("vllm", VLLM, idle, idle).problem == "no drafts over the window"
    with pytest.raises(m.MetricsError, match=r"metrics\.acceptance must say how length and rate are measured"):
        m.window_acceptance("trt", {"prefix": "t:", "counters": SGL_C, "acceptance": "magic"}, {}, {})
    broken = {**SGLANG, "acceptance": {"length": {"ratio": ["generation_tokens", "verify_call"]}, "rate": "per_step"}}
    with pytest.raises(m.MetricsError, match=r"ratio names 'verify_call', which is not a key of counters"):
        m.window_acceptance("x", broken, {}, {})
    both_derived = {**SGLANG, "acceptance": {"length": "per_step", "rate": "per_step"}}
    assert "one of length and rate must be a ratio" in " ".join(m.scheme_problems(both_derived))


# A third engine's own declaration: accepted tokens and verify steps, the length from their ratio plus the bonus
# token, the rate from the length through the draft tokens of a step.
OWN = {"prefix": "own:", "counters": {"generation_tokens": "own:gen_total", "steps": "own:steps_total",
                                     "accepted": "own:accepted_total"},
       "acceptance": {"length": {"ratio": ["accepted", "steps"], "plus": 1}, "rate": "per_step"}}


def test_an_engine_declares_a_scheme_of_its_own():
    assert m.scheme_problems(OWN) == []
    after = {"own:gen_total": 999, "own:steps_total": 100, "own:accepted_total": 150}
    result = m.window_acceptance("own", OWN, {"own:steps_total": 0, "own:accepted_total": 0}, after,
                                 num_draft_tokens=4)
    assert result.length == pytest.approx(2.5) and result.rate == pytest.approx(0.5)
    assert result.detail == {"accepted": 150, "steps": 100, "num_draft_tokens": 4}
    assert m.speculative_counter_names(OWN) == ("own:steps_total", "own:accepted_total")
    assert m.describe_acceptance(OWN).startswith("length = 1 + Δaccepted / Δsteps, rate = (length − 1)")
    unknown = m.window_acceptance("own", OWN, {}, after)
    assert unknown.length == pytest.approx(2.5) and unknown.rate is None
    assert "the accept rate cannot be derived" in unknown.problem


def test_the_rosters_declarations_in_words():
    assert m.describe_acceptance(VLLM) == ("length = 1 + Δspec_decode_num_accepted_tokens / Δspec_decode_num_drafts, "
                                           "rate = Δspec_decode_num_accepted_tokens / Δspec_decode_num_draft_tokens")
    assert m.describe_acceptance(SGLANG).startswith("length = Δgeneration_tokens / Δspec_verify_calls, rate = ")


def test_speedup_message_of_the_reference_host():
    assert m.speedup_message(1, 54.6, 82.5, 1.0) == (
        "speed-up 0.66x at concurrency 1 is below the 1.00x minimum (54.6 vs 82.5 tok/s baseline, -34%)"
    )
    assert m.speedup_message(8, 150.0, 82.5, 1.0).startswith("speed-up 1.82x at concurrency 8 meets")


def test_gate_fails_on_the_slow_level_and_says_by_how_much():
    gate = m.evaluate_gate(
        throughput={1: 54.6, 8: 400.0},
        baseline={1: 82.5, 8: 300.0},
        acceptance={},
        gate_levels=[1, 8],
        min_speedup=1.0,
        min_accept_rate=0.0,
        allow_missing_baseline=False,
    )
    assert not gate.passed
    assert gate.failures == [
        "speed-up 0.66x at concurrency 1 is below the 1.00x minimum (54.6 vs 82.5 tok/s baseline, -34%)"
    ]
    assert [c["status"] for c in gate.checks] == ["FAIL", "pass"]


def test_gate_checks_acceptance_against_its_minimum():
    low = m.Acceptance(engine="vllm", rate=0.15, length=1.45)
    gate = m.evaluate_gate(
        throughput={1: 100.0},
        baseline={1: 80.0},
        acceptance={1: low},
        gate_levels=[1],
        min_speedup=1.0,
        min_accept_rate=0.4,
        allow_missing_baseline=False,
    )
    assert gate.failures == [
        "acceptance rate 15.0% at concurrency 1 is below the 40.0% minimum "
        "(-25.0 points, Δ/metrics counters over the benchmark window)"
    ]
    unmeasured = m.evaluate_gate(
        throughput={1: 100.0},
        baseline={1: 80.0},
        acceptance={1: m.Acceptance(engine="sglang", problem="/metrics not available")},
        gate_levels=[1],
        min_speedup=1.0,
        min_accept_rate=0.4,
        allow_missing_baseline=False,
    )
    assert "could not be measured (/metrics not available)" in unmeasured.failures[0]


@pytest.mark.parametrize(("allow", "passed"), [(False, False), (True, True)])
def test_missing_baseline_fails_unless_allowed(allow, passed):
    gate = m.evaluate_gate(
        throughput={1: 54.6},
        baseline=None,
        acceptance={},
        gate_levels=[1],
        min_speedup=1.0,
        min_accept_rate=0.0,
        allow_missing_baseline=allow,
    )
    assert gate.passed is passed
    text = (gate.warnings if allow else gate.failures)[0]
    assert text.startswith("speed-up not measured at concurrency 1: no comparable baseline (verify a profile")


def test_missing_baseline_says_why_the_level_is_not_comparable():
    gate = m.evaluate_gate(
        throughput={1: 54.6, 32: 300.0},
        baseline={1: 30.0},
        acceptance={},
        gate_levels=[1, 32],
        min_speedup=1.0,
        min_accept_rate=0.0,
        allow_missing_baseline=False,
        missing_reasons={32: "concurrency 32 is above the request cap 16"},
    )
    assert gate.failures == [
        "speed-up not measured at concurrency 32: concurrency 32 is above the request cap 16 (verify a profile "
        "without speculation on the same model, engine, tensor parallel size and GPU first: it records one on "
        "the host)"
    ]


def test_a_gated_level_that_was_not_benchmarked_fails():
    gate = m.evaluate_gate(
        throughput={1: 90.0},
        baseline={1: 80.0, 8: 300.0},
        acceptance={},
        gate_levels=[1, 8],
        min_speedup=1.0,
        min_accept_rate=0.0,
        allow_missing_baseline=False,
    )
    assert gate.failures == ["concurrency 8 is gated but was not benchmarked"]


def test_baseline_mappings_are_normalised_and_checked():
    assert m.normalise_throughputs({"1": "82.5", 8: 300}, "b") == {1: 82.5, 8: 300.0}
    for bad in ({"one": 82.5}, {1: 0}, {0: 5.0}, {1: "fast"}, [82.5]):
        with pytest.raises(m.MetricsError):
            m.normalise_throughputs(bad, "verify_baseline")
