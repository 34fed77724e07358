"""Engine metrics for verify: Prometheus text parsing, acceptance over a window, speed-up gate.

Stdlib only. Used on the target by plugins/modules/engine_metrics.py (parsing) and on the controller by
roles/verify/files/verify_report.py (acceptance, speed-up, gate messages).

Acceptance has one definition for both engines, computed from counter deltas over a benchmark
window (never from since-start averages):

* vLLM:   accept rate   = d(spec_decode_num_accepted_tokens) / d(spec_decode_num_draft_tokens)
          accept length = 1 + d(spec_decode_num_accepted_tokens) / d(spec_decode_num_drafts)
* SGLang: accept length = d(generation_tokens) / d(spec_verify_calls)   (bonus token included)
          accept rate   = (accept length - 1) / (speculative_num_draft_tokens - 1)
          as SGLang 0.5.23 divides (srt/managers/scheduler_components/metrics_reporter.py, tokenizer_manager.py:
          correct drafts / (verify calls x (num_draft_tokens - 1))); speculative_num_steps only where the number
          of draft tokens is unknown (the two agree when eagle_topk is 1: num_draft_tokens = num_steps + 1)

Both are the same quantity: with k draft tokens per verify step, accept length = 1 + rate * k.
SGLang exports no accepted/drafted counters (its spec_accept_rate is a "most recent" gauge), so its
rate is derived from the length. The SGLang counters count finished requests only, so a window
must end after the benchmark's requests have finished (the benchmark client waits for them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# The counter names come from the engine roster (meta/engines.yml, each engine's `metrics`): a mapping of what each
# counter counts to its name, and the scheme that says which counters there are.
SCHEME_COUNTERS = {
    "verify_calls": ("generation_tokens", "verify_calls"),
    "draft_counters": ("generation_tokens", "drafts", "draft_tokens", "accepted_tokens"),
}


class MetricsError(ValueError):
    """Raised for text that is not Prometheus exposition format, or counters that cannot be compared."""


# --- Prometheus text -------------------------------------------------------------------------------

def _split_sample(line: str) -> tuple[str, str]:
    """Split one sample line into (metric name, the rest after the label set)."""
    brace = line.find("{")
    space = min((i for i in (line.find(" "), line.find("\t")) if i >= 0), default=-1)
    if brace < 0 or (0 <= space < brace):
        if space < 0:
            raise MetricsError(f"sample without a value: {line!r}")
        return line[:space], line[space:]
    name, index, in_quotes = line[:brace], brace + 1, False
    while index < len(line):
        char = line[index]
        if in_quotes and char == "\\":
            index += 2
            continue
        if char == '"':
            in_quotes = not in_quotes
        elif char == "}" and not in_quotes:
            return name, line[index + 1:]
        index += 1
    raise MetricsError(f"unterminated label set: {line!r}")


def parse_value(token: str) -> float:
    """Parse a Prometheus sample value (floats, +Inf, -Inf, NaN)."""
    try:
        return float(token)
    except ValueError as exc:
        raise MetricsError(f"not a sample value: {token!r}") from exc


def parse_prometheus_text(text: str) -> dict[str, float]:
    """Sum every sample of the exposition text by metric name (over all label sets).

    Comment and blank lines are skipped. A trailing timestamp after the value is ignored.
    """
    totals: dict[str, float] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            name, rest = _split_sample(line)
            fields = rest.split()
            if not fields:
                raise MetricsError(f"sample without a value: {line!r}")
            value = parse_value(fields[0])
        except MetricsError as exc:
            raise MetricsError(f"line {number}: {exc}") from None
        name = name.strip()
        if not name:
            raise MetricsError(f"line {number}: sample without a metric name: {line!r}")
        totals[name] = totals.get(name, 0.0) + value
    return totals


def select_metrics(totals: dict[str, float], prefixes: list[str] | tuple[str, ...]) -> dict[str, float]:
    """Keep the metrics whose name starts with one of the prefixes (all of them when none are given)."""
    if not prefixes:
        return dict(totals)
    return {name: value for name, value in totals.items() if name.startswith(tuple(prefixes))}


# --- Counter windows -------------------------------------------------------------------------------

def counter_deltas(before: dict[str, float], after: dict[str, float],
                   names: tuple[str, ...] | list[str] | None = None) -> dict[str, float]:
    """Increase of each counter over a window (of `names`, else of every `*_total` in `after`).

    Gauges are never differenced. A counter that went down means the engine restarted in the window.
    """
    deltas: dict[str, float] = {}
    wanted = names if names is not None else [name for name in after if name.endswith("_total")]
    for name in wanted:
        if name not in after:
            continue
        start, end = before.get(name, 0.0), after[name]
        if end < start:
            raise MetricsError(
                f"counter {name} went backwards over the window ({start:g} -> {end:g}): "
                "the engine restarted during the benchmark, the window cannot be measured")
        deltas[name] = end - start
    return deltas


@dataclass
class Acceptance:
    """Acceptance over one window; `rate`/`length` are None when the window shows no speculation."""

    engine: str
    rate: float | None = None
    length: float | None = None
    source: str = "Δ/metrics counters over the benchmark window"
    detail: dict[str, float] = field(default_factory=dict)
    problem: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"engine": self.engine, "rate": self.rate, "length": self.length, "source": self.source,
                "detail": self.detail, "problem": self.problem}


def _scheme(counters: dict[str, str]) -> str:
    scheme = counters.get("acceptance")
    if scheme not in SCHEME_COUNTERS:
        raise MetricsError(f"unknown acceptance scheme {scheme!r}: expected one of {sorted(SCHEME_COUNTERS)}")
    missing = [role for role in SCHEME_COUNTERS[scheme] if not counters.get(role)]
    if missing:
        raise MetricsError(f"the {scheme} scheme needs the counter names {', '.join(missing)}")
    return scheme


def speculative_counter_names(counters: dict[str, str]) -> tuple[str, ...]:
    """The names of the counters speculative decoding increments (all but the generated tokens)."""
    return tuple(counters[role] for role in SCHEME_COUNTERS[_scheme(counters)] if role != "generation_tokens")


def has_speculative_counters(counters: dict[str, str], scraped: dict[str, float]) -> bool:
    """True when the engine exports the counters that speculative decoding increments."""
    return all(name in scraped for name in speculative_counter_names(counters))


def window_acceptance(engine: str, counters: dict[str, str], before: dict[str, float], after: dict[str, float], *,
                      num_steps: int | None = None, num_draft_tokens: int | None = None) -> Acceptance:
    """Acceptance rate and length from the counter deltas between two /metrics scrapes. `counters` is the engine's
    roster `metrics` (its scheme and counter names); the verify_calls scheme gives the rate over
    num_draft_tokens - 1 drafts per verify step, or num_steps where num_draft_tokens is unknown."""
    scheme = _scheme(counters)
    result = Acceptance(engine=engine)
    if not has_speculative_counters(counters, after):
        result.problem = "the engine exports no speculative-decoding counters (is speculation on?)"
        return result
    names = {role: counters[role] for role in SCHEME_COUNTERS[scheme]}
    delta = counter_deltas(before, after, tuple(names.values()))
    value = {role: delta.get(name, 0.0) for role, name in names.items()}
    if scheme == "draft_counters":
        drafts, draft_tokens, accepted = value["drafts"], value["draft_tokens"], value["accepted_tokens"]
        result.detail = {"drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted}
        if drafts <= 0 or draft_tokens <= 0:
            result.problem = "no drafts over the window"
            return result
        result.rate = accepted / draft_tokens
        result.length = 1.0 + accepted / drafts
        return result
    generated, verify_calls = value["generation_tokens"], value["verify_calls"]
    result.detail = {"generation_tokens": generated, "verify_calls": verify_calls}
    if verify_calls <= 0:
        result.problem = "no verify calls over the window"
        return result
    result.length = generated / verify_calls
    if num_draft_tokens and num_draft_tokens > 1:
        result.rate = (result.length - 1.0) / (num_draft_tokens - 1)
        result.detail["num_draft_tokens"] = float(num_draft_tokens)
    elif num_steps and num_steps > 0:
        result.rate = (result.length - 1.0) / num_steps
        result.detail["num_steps"] = float(num_steps)
    else:
        result.problem = ("speculative_num_draft_tokens and speculative_num_steps unknown: the accept rate cannot be "
                          "derived from the length")
    return result


# --- Speed-up and gate -----------------------------------------------------------------------------

def normalise_throughputs(mapping: dict[object, object], what: str) -> dict[int, float]:
    """Turn {concurrency: tok/s} with string or int keys into {int: float}; reject junk clearly."""
    result: dict[int, float] = {}
    if not isinstance(mapping, dict):
        raise MetricsError(f"{what} must be a mapping of concurrency to output tok/s, got {type(mapping).__name__}")
    for key, value in mapping.items():
        try:
            level = int(str(key))
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise MetricsError(f"{what}: {key!r}: {value!r} is not concurrency: tok/s") from None
        if level < 1 or not math.isfinite(number) or number <= 0:
            raise MetricsError(f"{what}: {key!r}: {value!r} needs a concurrency >= 1 and a tok/s > 0")
        result[level] = number
    return result


def speedup_message(level: int, speculative: float, baseline: float, minimum: float) -> str:
    """Human sentence for one speed-up measurement, e.g. the 0.66x case of the reference host."""
    ratio = speculative / baseline
    verdict = "is below" if ratio < minimum else "meets"
    return (f"speed-up {ratio:.2f}x at concurrency {level} {verdict} the {minimum:.2f}x minimum "
            f"({speculative:.1f} vs {baseline:.1f} tok/s baseline, {ratio - 1.0:+.0%})")


def acceptance_message(level: int, rate: float, minimum: float) -> str:
    verdict = "is below" if rate < minimum else "meets"
    return (f"acceptance rate {rate:.1%} at concurrency {level} {verdict} the {minimum:.1%} minimum "
            f"({(rate - minimum) * 100:+.1f} points, Δ/metrics counters over the benchmark window)")


@dataclass
class GateResult:
    passed: bool
    failures: list[str]
    warnings: list[str]
    checks: list[dict[str, object]]

    def as_dict(self) -> dict[str, object]:
        return {"passed": self.passed, "failures": self.failures, "warnings": self.warnings,
                "checks": self.checks}


def evaluate_gate(*, throughput: dict[int, float], baseline: dict[int, float] | None,
                  acceptance: dict[int, Acceptance], gate_levels: list[int], min_speedup: float,
                  min_accept_rate: float, allow_missing_baseline: bool,
                  missing_reasons: dict[int, str] | None = None) -> GateResult:
    """Decide pass/fail for the speculative run: speed-up per gated level and acceptance per level.

    A gated level without a comparable baseline fails ("speed-up not measured", with the reason from
    `missing_reasons` when one is given) unless `allow_missing_baseline`, which makes it a warning."""
    failures: list[str] = []
    warnings: list[str] = []
    checks: list[dict[str, object]] = []
    for level in gate_levels:
        if level not in throughput:
            failures.append(f"concurrency {level} is gated but was not benchmarked")
            continue
        reference = (baseline or {}).get(level)
        if reference is None:
            why = (missing_reasons or {}).get(level) or "no comparable baseline"
            text = (f"speed-up not measured at concurrency {level}: {why} (verify a profile without speculation "
                    "on the same model, engine, tensor parallel size and GPU first: it records one on the host)")
            (warnings if allow_missing_baseline else failures).append(text)
            checks.append({"check": "speed-up", "concurrency": level, "status": "no baseline"})
        else:
            ratio = throughput[level] / reference
            ok = ratio >= min_speedup
            text = speedup_message(level, throughput[level], reference, min_speedup)
            checks.append({"check": "speed-up", "concurrency": level, "value": ratio,
                           "minimum": min_speedup, "status": "pass" if ok else "FAIL", "message": text})
            if not ok:
                failures.append(text)
        accept = acceptance.get(level)
        if min_accept_rate <= 0:
            continue
        if accept is None or accept.rate is None:
            why = accept.problem if accept else "not measured"
            failures.append(f"acceptance rate at concurrency {level} could not be measured ({why}); "
                            f"the {min_accept_rate:.1%} minimum cannot be checked")
            checks.append({"check": "acceptance", "concurrency": level, "status": "unmeasured"})
            continue
        ok = accept.rate >= min_accept_rate
        text = acceptance_message(level, accept.rate, min_accept_rate)
        checks.append({"check": "acceptance", "concurrency": level, "value": accept.rate,
                       "minimum": min_accept_rate, "status": "pass" if ok else "FAIL", "message": text})
        if not ok:
            failures.append(text)
    return GateResult(passed=not failures, failures=failures, warnings=warnings, checks=checks)
