"""Engine metrics for verify: Prometheus text parsing, acceptance over a window, speed-up gate.

Stdlib only. Used on the target by plugins/modules/engine_metrics.py (parsing) and on the controller by
plugins/plugin_utils/verify_report.py (acceptance, speed-up, gate messages).

Acceptance is computed from counter deltas over a benchmark window (never from since-start averages), by the
formula the engine's roster entry declares (meta/engines.yml, `metrics`): which counters the engine exports
(`counters`: what each counts -> its name) and how accept length and accept rate follow from their deltas
(`acceptance`):

* a ratio: ``{ratio: [numerator, denominator], plus: p}`` = p + Δnumerator / Δdenominator;
* ``per_step``: the other one through the draft tokens of a verify step, k = speculative_num_draft_tokens - 1
  (speculative_num_steps where the draft tokens are unknown; the two agree when eagle_topk is 1):
  length = 1 + rate * k, rate = (length - 1) / k.

At least one of the two is a ratio. The engines' declarations and the upstream files behind them are in the roster;
with k draft tokens per verify step every declaration measures the same quantity (length = 1 + rate * k).
`generation_tokens` counts every generated token; every other counter is one that only speculative decoding
increments (their absence says speculation is off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# What a roster entry's `acceptance` may say of length and rate (see the module docstring).
ACCEPTANCE_KEYS = ("length", "rate")
PER_STEP = "per_step"
PLAIN_COUNTER = "generation_tokens"


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


def _ratio_problems(what: str, rule: object, counters: dict) -> list[str]:
    if rule == PER_STEP:
        return []
    if not isinstance(rule, dict) or set(rule) - {"ratio", "plus"} or "ratio" not in rule:
        return [f"acceptance.{what} must be {PER_STEP!r} or {{ratio: [numerator, denominator], plus: number}}"]
    ratio, plus = rule["ratio"], rule.get("plus", 0)
    if not (isinstance(ratio, list) and len(ratio) == 2 and all(isinstance(name, str) for name in ratio)):
        return [f"acceptance.{what}.ratio must be two counter keys [numerator, denominator]"]
    problems = [f"acceptance.{what}.ratio names {name!r}, which is not a key of counters" for name in ratio
                if name not in counters]
    if isinstance(plus, bool) or not isinstance(plus, (int, float)):
        problems.append(f"acceptance.{what}.plus must be a number")
    return problems


def scheme_problems(metrics: object) -> list[str]:
    """What is wrong with an engine's `metrics` declaration (empty when nothing is)."""
    if not isinstance(metrics, dict):
        return ["metrics must be a mapping"]
    problems = [f"metrics.{key} is missing" for key in ("prefix", "counters", "acceptance") if key not in metrics]
    problems += [f"metrics.{key} is not a key (known: prefix, counters, acceptance)" for key in metrics
                 if key not in ("prefix", "counters", "acceptance")]
    if problems:
        return problems
    counters, acceptance = metrics["counters"], metrics["acceptance"]
    if not isinstance(metrics["prefix"], str) or not metrics["prefix"]:
        problems.append("metrics.prefix must be a non-empty string")
    if not isinstance(counters, dict) or not counters or not all(
            isinstance(name, str) and name for name in counters.values()):
        return [*problems, "metrics.counters must map what each counter counts to its name (non-empty strings)"]
    if len(counters) < 2 or PLAIN_COUNTER not in counters:
        problems.append(f"metrics.counters must name {PLAIN_COUNTER} and at least one counter of speculative decoding")
    if not isinstance(acceptance, dict) or set(acceptance) != set(ACCEPTANCE_KEYS):
        return [*problems, "metrics.acceptance must say how length and rate are measured (keys length, rate)"]
    for what in ACCEPTANCE_KEYS:
        problems += [f"metrics.{problem}" for problem in _ratio_problems(what, acceptance[what], counters)]
    if all(acceptance[what] == PER_STEP for what in ACCEPTANCE_KEYS):
        problems.append("metrics.acceptance: one of length and rate must be a ratio of counters")
    return problems


def _checked(metrics: dict) -> dict:
    problems = scheme_problems(metrics)
    if problems:
        raise MetricsError("acceptance metrics: " + "; ".join(problems))
    return metrics


def speculative_counter_names(metrics: dict) -> tuple[str, ...]:
    """The names of the counters only speculative decoding increments (all but the generated tokens)."""
    counters = _checked(metrics)["counters"]
    return tuple(name for what, name in counters.items() if what != PLAIN_COUNTER)


def has_speculative_counters(metrics: dict, scraped: dict[str, float]) -> bool:
    """True when the engine exports the counters that speculative decoding increments."""
    return all(name in scraped for name in speculative_counter_names(metrics))


def _ratio_value(rule: dict, value: dict[str, float]) -> float | str:
    """p + Δnumerator / Δdenominator, or the problem: the denominator did not move."""
    numerator, denominator = rule["ratio"]
    if value[denominator] <= 0:
        return f"no {denominator.replace('_', ' ')} over the window"
    return rule.get("plus", 0) + value[numerator] / value[denominator]


def _per_step(num_steps: int | None, num_draft_tokens: int | None, detail: dict[str, float]) -> float | None:
    if num_draft_tokens and num_draft_tokens > 1:
        detail["num_draft_tokens"] = float(num_draft_tokens)
        return float(num_draft_tokens - 1)
    if num_steps and num_steps > 0:
        detail["num_steps"] = float(num_steps)
        return float(num_steps)
    return None


def describe_acceptance(metrics: dict) -> str:
    """The declared formulas in words, with the engine's counter names (for the report)."""
    counters, acceptance = metrics["counters"], metrics["acceptance"]

    def ratio(rule: dict) -> str:
        numerator, denominator = (counters[name].split(":")[-1].removesuffix("_total") for name in rule["ratio"])
        plus = rule.get("plus", 0)
        return f"{f'{plus:g} + ' if plus else ''}Δ{numerator} / Δ{denominator}"

    length = (ratio(acceptance["length"]) if acceptance["length"] != PER_STEP else
              "1 + rate × (num_draft_tokens − 1)")
    rate = (ratio(acceptance["rate"]) if acceptance["rate"] != PER_STEP else
            "(length − 1) / (num_draft_tokens − 1), num_steps where the draft tokens are unknown")
    return f"length = {length}, rate = {rate}"


def window_acceptance(engine: str, metrics: dict, before: dict[str, float], after: dict[str, float], *,
                      num_steps: int | None = None, num_draft_tokens: int | None = None) -> Acceptance:
    """Acceptance rate and length from the counter deltas between two /metrics scrapes, by the formulas the engine's
    roster `metrics` declares; `per_step` goes through num_draft_tokens - 1 draft tokens per verify step, or
    num_steps where num_draft_tokens is unknown."""
    acceptance_rule = _checked(metrics)["acceptance"]
    result = Acceptance(engine=engine)
    if not has_speculative_counters(metrics, after):
        result.problem = "the engine exports no speculative-decoding counters (is speculation on?)"
        return result
    used = [name for what in ACCEPTANCE_KEYS if acceptance_rule[what] != PER_STEP
            for name in acceptance_rule[what]["ratio"]]
    names = {what: metrics["counters"][what] for what in dict.fromkeys(used)}
    delta = counter_deltas(before, after, tuple(names.values()))
    value = {what: delta.get(name, 0.0) for what, name in names.items()}
    result.detail = dict(value)
    measured: dict[str, float | None] = {}
    for what in ACCEPTANCE_KEYS:
        if acceptance_rule[what] != PER_STEP:
            outcome = _ratio_value(acceptance_rule[what], value)
            if isinstance(outcome, str):
                result.problem = outcome
                return result
            measured[what] = outcome
    if len(measured) == len(ACCEPTANCE_KEYS):
        result.length, result.rate = measured["length"], measured["rate"]
        return result
    step = _per_step(num_steps, num_draft_tokens, result.detail)
    if "length" not in measured:
        measured["length"] = None if step is None else 1.0 + measured["rate"] * step
    if "rate" not in measured:
        measured["rate"] = None if step is None else (measured["length"] - 1.0) / step
    result.length, result.rate = measured["length"], measured["rate"]
    if step is None:
        result.problem = ("speculative_num_draft_tokens and speculative_num_steps unknown: the accept "
                          f"{'rate' if result.rate is None else 'length'} cannot be derived")
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
