"""Verify report: turn what the verify role collected into report.json, report.md (and baseline.json).

Controller-only code: the action plugin verify_report (plugins/action/verify_report.py) imports it and runs it in
the playbook's process. It is also a command-line program, with the controller's Python and the collection
importable (for example PYTHONPATH=<repository>/collections):
    python -m ansible_collections.blackwell.serving.plugins.plugin_utils.verify_report --inputs F --out-dir D
Input: the inputs.json the role wrote (bench client JSON per concurrency level, /metrics counters before and after
each level, smoke and readiness results). It computes acceptance over each benchmark window and the speed-up
against the baseline, decides the gate, writes the files, and prints one JSON object on stdout:
    {"gate": {...}, "summary": [lines], "files": {...}}
Exit status 0 even when the gate fails (the role fails the play with the gate's messages); 2 on bad
input (a baseline file that does not exist or is not a baseline).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ansible_collections.blackwell.serving.plugins.module_utils.engine import metrics
from ansible_collections.blackwell.serving.plugins.plugin_utils.verify_chart import draw

# Where each number comes from; the report prints these beside the numbers.
SRC_BENCH = "bench client JSON {key}"
SRC_WINDOW = "Δ/metrics counters over the benchmark window"
SRC_SINCE_START = "/server_info internal_states[0].avg_spec_accept_length, since engine start"
SRC_CLIENT_RATE = "bench client JSON spec_decode_acceptance_rate (the client's own /metrics window)"
SRC_CLIENT_LENGTH = "bench client JSON accept_length (read from /server_info: since engine start)"
BENCH_KEYS = ("output_throughput", "completed", "duration", "total_output_tokens", "request_throughput",
              "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
              "mean_tpot_ms", "p99_tpot_ms")


class InputError(ValueError):
    """Bad input: reported on stderr with exit status 2."""


def number(value: object, source: str) -> dict[str, object]:
    return {"value": value, "source": source}


# --- baseline ---------------------------------------------------------------------------------------

def _baseline_document(raw: object) -> tuple[dict, Path]:
    path = Path(str(raw)).expanduser()
    if not path.is_file():
        raise InputError(f"verify_baseline: {path} is not a file (pass a baseline.json written by "
                         "verify_mode=baseline, or a mapping concurrency: tok/s)")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"verify_baseline: {path} is not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("kind") != "verify-baseline":
        raise InputError(f"verify_baseline: {path} is not a baseline written by verify_mode=baseline "
                         "(its 'kind' is not 'verify-baseline')")
    return document, path


def workload_sampling(spec: object) -> dict | None:
    """The sampling parameters of a workload definition: its `sampling`, or the `temperature` of a definition
    recorded before workloads carried their sampling; None where neither is recorded."""
    if not isinstance(spec, dict):
        return None
    if isinstance(spec.get("sampling"), dict):
        return spec["sampling"]
    return {"temperature": spec["temperature"]} if "temperature" in spec else None


def sampling_text(sampling: object) -> str:
    """`temperature 0.6, top_p 0.95`, as the report prints a level's sampling parameters."""
    if not isinstance(sampling, dict) or not sampling:
        return "not recorded"
    return ", ".join(f"{key} {value}" for key, value in sampling.items())


def _document_levels(document: dict, where: str) -> dict[int, dict]:
    """{concurrency: {"output_throughput", "workload"?, "endpoint"?, "sampling"?, "request_cap"?}} of a baseline
    document. `endpoint` is the route the baseline's workload was sent to and `sampling` its sampling parameters (its
    key's workloads; None where not recorded)."""
    throughput = metrics.normalise_throughputs(document.get("output_throughput", {}), where)
    details = {int(k): v for k, v in (document.get("levels") or {}).items()}
    workloads = (document.get("key") or {}).get("workloads") or {}
    cap = document.get("request_cap")
    levels = {}
    for level, value in throughput.items():
        workload = details.get(level, {}).get("workload")
        spec = (workloads.get(workload) or {}) if workload else {}
        levels[level] = {"output_throughput": value, "workload": workload, "request_cap": cap,
                         "endpoint": spec.get("endpoint"), "sampling": workload_sampling(spec)}
    return levels


def _document_warnings(document: dict, inputs: dict) -> list[str]:
    """What makes an explicitly given baseline.json doubtful. The profile is not compared: the baseline is
    measured on a profile without speculation, so its name differs by design."""
    warnings = []
    for key in ("host", "engine"):
        if document.get(key) != inputs[key]:
            warnings.append(f"baseline {key} is {document.get(key)!r}, this run's is {inputs[key]!r}")
    if document.get("key") is not None and document.get("key") != inputs.get("baseline_key"):
        warnings.append("the baseline was measured on another model revision, engine version, tensor parallel "
                        "size, GPU model or workload than this run (its 'key' differs)")
    if document.get("speculative_counters_seen"):
        warnings.append("the baseline was measured while the engine exported speculative counters: "
                        "it may not be a run without speculation")
    if document.get("engine_is_test_double") != inputs["test_double"]["detected"]:
        warnings.append("the baseline and this run disagree on whether the engine is the ENGINE TEST DOUBLE")
    return warnings


def resolve_baseline(raw: object, inputs: dict) -> tuple[dict[int, dict] | None, dict[str, object]]:
    """Return ({concurrency: {"output_throughput", "workload", "request_cap"}} or None, description).

    An explicit baseline (verify_baseline / verify_baselines) wins; otherwise the one a run without speculation
    recorded on the host under this run's key (found by the role and passed as `recorded_baseline`)."""
    info: dict[str, object] = {"warnings": []}
    if raw in (None, "", {}):
        recorded = inputs.get("recorded_baseline")
        if not isinstance(recorded, dict):
            info["source"] = ("none: no baseline recorded on the host for this model revision, engine version, "
                              "tensor parallel size, GPU model and workload")
            return None, info
        if recorded.get("key") != inputs.get("baseline_key"):  # the file name is a hash of the key
            info["source"] = f"none: {inputs.get('recorded_baseline_path')} was recorded for another key"
            return None, info
        info["source"] = (f"baseline recorded on the host {inputs.get('recorded_baseline_path')} by the verify run "
                          f"of profile {recorded.get('profile')!r} (measured {recorded.get('timestamp')})")
        info["path"] = inputs.get("recorded_baseline_path")
        return _document_levels(recorded, "recorded baseline"), info
    if isinstance(raw, dict):
        info["source"] = "baseline from inventory (verify_baseline / verify_baselines[profile])"
        return {level: {"output_throughput": value, "workload": None, "request_cap": None}
                for level, value in metrics.normalise_throughputs(raw, "verify_baseline").items()}, info
    document, path = _baseline_document(raw)
    info["source"] = f"baseline report {path} (measured {document.get('timestamp')})"
    info["path"] = str(path)
    info["warnings"] = _document_warnings(document, inputs)
    return _document_levels(document, str(path)), info


def not_comparable(level: dict, inputs: dict, reference: dict | None) -> str | None:
    """Why this level's throughput cannot be compared with the baseline's, or None."""
    concurrency = int(level["concurrency"])
    if reference is None:
        return None
    caps = [cap for cap in (inputs.get("request_cap"), reference.get("request_cap")) if cap]
    if caps and concurrency > min(int(cap) for cap in caps):
        return (f"concurrency {concurrency} is above the request cap {min(int(cap) for cap in caps)} of this run "
                "or the baseline's: the two servers queue differently")
    if reference.get("workload") is not None and reference["workload"] != level.get("workload"):
        return (f"the baseline ran the {reference['workload']} workload at concurrency {concurrency}, this run "
                f"{level.get('workload')}")
    if reference.get("workload") is not None:
        # The same workload sent to another route (completions vs chat: another prompt, another output) is
        # another measurement; a document that does not record the route cannot show it is the same one.
        spec = ((inputs.get("bench") or {}).get("workloads") or {}).get(level.get("workload"), {})
        endpoint = spec.get("endpoint")
        if endpoint and reference.get("endpoint") != endpoint:
            return (f"the baseline sent the {reference['workload']} workload to "
                    f"{reference.get('endpoint') or 'a route it does not record'}, this run to {endpoint}")
        # Greedy and sampled decoding are other measurements (the sampler runs, drafts are accepted otherwise).
        sampling = level_sampling(level, inputs)
        if sampling is not None and reference.get("sampling") != sampling:
            return (f"the baseline ran the {reference['workload']} workload with "
                    f"{sampling_text(reference.get('sampling'))}, this run with {sampling_text(sampling)}")
    return None


def level_sampling(level: dict, inputs: dict) -> dict | None:
    """The sampling parameters a level ran with: as it recorded them, else its workload's definition."""
    if isinstance(level.get("sampling"), dict):
        return level["sampling"]
    return workload_sampling(((inputs.get("bench") or {}).get("workloads") or {}).get(level.get("workload")))


# --- levels -----------------------------------------------------------------------------------------

def summarise_level(level: dict, inputs: dict, baseline: dict[int, dict] | None,
                    baseline_source: str) -> tuple[dict, object]:
    concurrency = int(level["concurrency"])
    bench = level["result"]
    row: dict[str, object] = {"concurrency": concurrency, "num_prompts": level["num_prompts"],
                              "workload": level.get("workload"), "sampling": level_sampling(level, inputs)}
    for key in BENCH_KEYS:
        if key in bench:
            row[key] = number(bench[key], SRC_BENCH.format(key=key))
    acceptance = None
    if inputs["speculative"]:
        if level.get("metrics_available"):
            try:
                acceptance = metrics.window_acceptance(inputs["engine"], inputs["acceptance_counters"],
                                                       level["metrics_before"], level["metrics_after"],
                                                       num_steps=inputs.get("num_steps") or None,
                                                       num_draft_tokens=inputs.get("num_draft_tokens") or None)
            except metrics.MetricsError as exc:
                acceptance = metrics.Acceptance(engine=inputs["engine"], problem=str(exc))
        else:
            acceptance = metrics.Acceptance(engine=inputs["engine"],
                                            problem="/metrics not available (is the engine's metrics export on?)")
        row["acceptance"] = acceptance.as_dict()
    if "spec_decode_acceptance_rate" in bench:
        row["bench_client_accept_rate"] = number(bench["spec_decode_acceptance_rate"] / 100.0, SRC_CLIENT_RATE)
    if bench.get("accept_length") is not None:
        row["bench_client_accept_length"] = number(bench["accept_length"], SRC_CLIENT_LENGTH)
    reference = (baseline or {}).get(concurrency)
    why = not_comparable(level, inputs, reference)
    if why:
        row["not_comparable"] = why
    elif reference is not None:
        row["baseline_output_throughput"] = number(reference["output_throughput"], baseline_source)
        if "output_throughput" in bench:
            row["speedup"] = number(bench["output_throughput"] / reference["output_throughput"],
                                    "bench client output_throughput / baseline output_throughput")
    return row, acceptance


def build_report(inputs: dict) -> tuple[dict, dict | None]:
    baseline, baseline_info = (None, {"source": "not used in baseline mode", "warnings": []})
    if inputs["mode"] != "baseline":
        baseline, baseline_info = resolve_baseline(inputs.get("baseline"), inputs)
    rows, acceptance = [], {}
    for level in inputs["bench"]["levels"]:
        row, accept = summarise_level(level, inputs, baseline, str(baseline_info["source"]))
        rows.append(row)
        if accept is not None:
            acceptance[row["concurrency"]] = accept
    throughput = {r["concurrency"]: r["output_throughput"]["value"] for r in rows if "output_throughput" in r}
    comparable = {r["concurrency"]: r["baseline_output_throughput"]["value"] for r in rows
                  if "baseline_output_throughput" in r}
    gate_cfg = inputs["gate"]
    if inputs["mode"] == "full" and inputs["speculative"]:
        gate = metrics.evaluate_gate(
            throughput=throughput, baseline=comparable or None, acceptance=acceptance,
            gate_levels=[int(x) for x in gate_cfg["levels"]], min_speedup=float(gate_cfg["min_speedup"]),
            min_accept_rate=float(gate_cfg["min_accept_rate"]),
            allow_missing_baseline=bool(gate_cfg["allow_missing_baseline"]),
            missing_reasons={r["concurrency"]: r["not_comparable"] for r in rows if "not_comparable" in r},
        ).as_dict()
        for level, accept in acceptance.items():
            if accept.problem and level in gate_cfg["levels"]:
                gate["warnings"].append(f"acceptance at concurrency {level}: {accept.problem}")
    else:
        why = "baseline mode: measurement only" if inputs["mode"] == "baseline" else \
            "verify_speculative is false: there is no speculative speed-up to gate"
        gate = {"passed": True, "failures": [], "warnings": [], "checks": [], "not_applicable": why}
    gate["warnings"] = list(baseline_info["warnings"]) + gate["warnings"]  # type: ignore[operator]
    spec_seen = any(metrics.has_speculative_counters(inputs["acceptance_counters"], lvl.get("metrics_after", {}))
                    for lvl in inputs["bench"]["levels"])
    if inputs["speculative"] and inputs["mode"] == "full" and not spec_seen and \
            any(lvl.get("metrics_available") for lvl in inputs["bench"]["levels"]):
        gate["passed"] = False
        gate["failures"].append("verify_speculative is true but the engine exports no speculative-decoding "
                                "counters: speculation is not running")
    report = {
        "kind": "verify-report", "schema": 1, "host": inputs["host"], "engine": inputs["engine"],
        "profile": inputs["profile"], "mode": inputs["mode"], "timestamp": inputs["timestamp"],
        "speculative": inputs["speculative"], "speculative_num_steps": inputs.get("num_steps"),
        "speculative_num_draft_tokens": inputs.get("num_draft_tokens"),
        "engine_is_test_double": inputs["test_double"]["detected"], "test_double": inputs["test_double"],
        "endpoint": {"base_url": inputs["base_url"], "served_model_name": inputs["served_model_name"]},
        "readiness": inputs.get("readiness"), "smoke": inputs.get("smoke"),
        "bench_command": inputs["bench"]["command"], "workloads": inputs["bench"]["workloads"],
        "sharegpt_source": inputs["bench"].get("sharegpt_source"), "baseline_key": inputs.get("baseline_key"),
        "request_cap": inputs.get("request_cap"), "drafter_revision": inputs.get("drafter_revision"),
        "levels": rows, "baseline": {**baseline_info, "output_throughput": {
            level: ref["output_throughput"] for level, ref in baseline.items()} if baseline else None},
        "since_start": {"avg_spec_accept_length": number(inputs.get("since_start_accept_length"), SRC_SINCE_START)}
        if inputs.get("since_start_accept_length") is not None else None,
        "gate": gate, "gate_levels": [int(x) for x in gate_cfg["levels"]],
        "acceptance_formula": metrics.describe_acceptance(inputs["acceptance_counters"]),
    }
    baseline_doc = None
    if not inputs["speculative"]:  # a run without speculation is the baseline of its key
        baseline_doc = {
            "kind": "verify-baseline", "schema": 2, "host": inputs["host"], "engine": inputs["engine"],
            "profile": inputs["profile"], "served_model_name": inputs["served_model_name"],
            "timestamp": inputs["timestamp"], "key": inputs.get("baseline_key"),
            "workloads": inputs["bench"]["workloads"], "request_cap": inputs.get("request_cap"),
            "engine_is_test_double": inputs["test_double"]["detected"], "speculative_counters_seen": spec_seen,
            "output_throughput": {str(k): v for k, v in throughput.items()},
            "levels": {str(r["concurrency"]): {"workload": r.get("workload")} for r in rows},
            "source": SRC_BENCH.format(key="output_throughput"),
        }
    return report, baseline_doc


# --- Markdown ---------------------------------------------------------------------------------------

def fmt(value: object, spec: str = ".1f", suffix: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, dict):
        value = value.get("value")
        if value is None:
            return "–"
    return f"{value:{spec}}{suffix}" if isinstance(value, int | float) else str(value)


def answer_words(field: object, check: object) -> str:
    """Where a smoke reply's answer came, or, with verify_smoke_check generates, that it was not checked."""
    if check == "generates":
        return ("generated, the answer not checked (verify_smoke_check: generates; the sum "
                + (f"came in `{field}`)" if field else "is in neither field)"))
    return f"the answer came in `{field}`"


def sampled_smoke_line(sampled: object, check: object = "sum") -> str:
    """The sampled smoke request's line of the report: what it asked with and where its answer came."""
    if not isinstance(sampled, dict):
        return str(sampled or "not recorded")
    return (f"{sampled.get('request')}: {answer_words(sampled.get('answer_field'), check)}, "
            f"{sampled.get('completion_tokens')} tokens, finish_reason `{sampled.get('finish_reason')}`")


def markdown(report: dict) -> str:
    gated = report["gate_levels"] if report["mode"] == "full" and report["speculative"] else []
    lines = [f"# Verify report: {report['host']} · {report['engine']} · {report['profile']}", ""]
    if report["engine_is_test_double"]:
        lines += ["> **⚠ ENGINE TEST DOUBLE.** The endpoint is served by the engine test double, not by a real "
                  "engine: every number below measures the double, not a model.", ""]
    gate = report["gate"]
    verdict = "PASS" if gate["passed"] else "FAIL"
    if gate.get("not_applicable"):
        verdict += f" (no gate: {gate['not_applicable']})"
    lines += [f"- **Gate: {verdict}**", f"- Mode: `{report['mode']}`, speculative: `{report['speculative']}`"
              + (f", num_steps: {report['speculative_num_steps']}" if report["speculative_num_steps"] else "")
              + (f", num_draft_tokens: {report['speculative_num_draft_tokens']}"
                 if report.get("speculative_num_draft_tokens") else ""),
              f"- Endpoint: `{report['endpoint']['base_url']}`, model `{report['endpoint']['served_model_name']}`",
              f"- Measured: {report['timestamp']}",
              *[f"- Workload `{name}`: {json.dumps(spec)}" for name, spec in report["workloads"].items()],
              f"- ShareGPT subset: {report.get('sharegpt_source')}",
              f"- Baseline: {report['baseline']['source']}", ""]
    for failure in gate["failures"]:
        lines.append(f"- ❌ {failure}")
    for warning in gate["warnings"]:
        lines.append(f"- ⚠ {warning}")
    if gate["failures"] or gate["warnings"]:
        lines.append("")
    lines += ["## Throughput and acceptance", "",
              "| Concurrency | Output tok/s | Baseline tok/s | Speed-up | Accept rate | Accept length "
              "| Mean TTFT ms | Median ITL ms | P99 ITL ms | Completed | Gated | Workload | Sampling |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|:---|:---|"]
    for row in report["levels"]:
        accept = row.get("acceptance") or {}
        lines.append(
            f"| {row['concurrency']} | {fmt(row.get('output_throughput'))} | "
            f"{fmt(row.get('baseline_output_throughput'))} | {fmt(row.get('speedup'), '.2f', 'x')} | "
            f"{fmt(accept.get('rate'), '.1%')} | {fmt(accept.get('length'), '.2f')} | "
            f"{fmt(row.get('mean_ttft_ms'))} | {fmt(row.get('median_itl_ms'))} | {fmt(row.get('p99_itl_ms'))} | "
            f"{fmt(row.get('completed'), 'd')} | {'yes' if row['concurrency'] in gated else 'no'} | "
            f"{row.get('workload') or '–'} | {sampling_text(row.get('sampling'))} |")
    lines += ["", "![Throughput per concurrency, baseline vs this run, and acceptance](throughput.png)", "",
              "## Where the numbers come from", "",
              "- Output tok/s, TTFT, ITL, completed: the engine's own benchmark client, its JSON keys "
              "`output_throughput`, `mean_ttft_ms`, `median_itl_ms`, `p99_itl_ms`, `completed`.",
              f"- Baseline tok/s: {report['baseline']['source']}.",
              "- Speed-up: this run's `output_throughput` / baseline `output_throughput`, per concurrency.",
              f"- Accept rate and length: {SRC_WINDOW} (scraped before and after each level), as the engine's "
              f"roster entry declares them: {report['acceptance_formula']}."]
    extras = [(row["concurrency"], row[key]) for row in report["levels"]
              for key in ("bench_client_accept_rate", "bench_client_accept_length") if key in row]
    for level, item in extras:
        lines.append(f"- Concurrency {level}: {fmt(item['value'], '.3f')} ({item['source']}; for comparison only).")
    if report.get("since_start"):
        since = report["since_start"]["avg_spec_accept_length"]
        lines.append(f"- Since engine start (not the benchmark window): accept length {fmt(since['value'], '.3f')}"
                     f" ({since['source']}).")
    for row in report["levels"]:
        if row.get("not_comparable"):
            lines.append(f"- Concurrency {row['concurrency']}: no speed-up, not comparable: {row['not_comparable']}.")
    for row in report["levels"]:
        accept = row.get("acceptance") or {}
        if accept.get("problem"):
            lines.append(f"- Concurrency {row['concurrency']}: acceptance not measured: {accept['problem']}.")
    smoke = report.get("smoke") or {}
    if smoke:
        check = smoke.get("check", "sum")
        answer = (f"the answer {smoke.get('expected')} came in `{smoke.get('answer_field')}`" if check == "sum"
                  else answer_words(smoke.get("answer_field"), check))
        lines += ["", "## Smoke", "", f"- Asked `{smoke.get('question')}`: {answer} ({smoke.get('reasoning_chars')} "
                  f"characters of `{smoke.get('reasoning_field')}`)",
                  f"- Chat completion: {smoke.get('completion_tokens')} tokens, finish_reason "
                  f"`{smoke.get('finish_reason')}`; first characters: `{smoke.get('preview')}`",
                  f"- Sampled: {sampled_smoke_line(smoke.get('sampled'), check)}",
                  f"- Request without the API key: {smoke.get('unauthenticated')}"]
    return "\n".join(lines) + "\n"


def summary_lines(report: dict) -> list[str]:
    head = f"{report['host']}: {report['engine']} {report['profile']} ({report['mode']})"
    if report["engine_is_test_double"]:
        head += " [ENGINE TEST DOUBLE]"
    lines = [head]
    for row in report["levels"]:
        accept = row.get("acceptance") or {}
        lines.append(f"c={row['concurrency']} ({row.get('workload')}, {sampling_text(row.get('sampling'))}): "
                     f"{fmt(row.get('output_throughput'))} tok/s"
                     f", baseline {fmt(row.get('baseline_output_throughput'))}"
                     f", speed-up {fmt(row.get('speedup'), '.2f', 'x')}"
                     f", accept rate {fmt(accept.get('rate'), '.1%')} (window)")
    gate = report["gate"]
    lines.append("gate: " + ("PASS" if gate["passed"] else "FAIL") +
                 (f" ({gate['not_applicable']})" if gate.get("not_applicable") else ""))
    lines += [f"FAIL: {text}" for text in gate["failures"]] + [f"WARNING: {text}" for text in gate["warnings"]]
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", required=True, help="inputs.json, or - for stdin (then saved as inputs.json)")
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--chart", action="store_true", help="also draw throughput.png (needs matplotlib)")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read() if args.inputs == "-" else Path(args.inputs).read_text(encoding="utf-8")
        inputs = json.loads(text)
        report, baseline_doc = build_report(inputs)
    except (InputError, ValueError, KeyError, OSError) as exc:
        print(f"verify report: {exc}", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.inputs == "-":
        (args.out_dir / "inputs.json").write_text(json.dumps(inputs, indent=2) + "\n", encoding="utf-8")
    files = {"report_json": args.out_dir / "report.json", "report_md": args.out_dir / "report.md",
             "chart": args.out_dir / "throughput.png"}
    files["report_json"].write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    files["report_md"].write_text(markdown(report), encoding="utf-8")
    if baseline_doc is not None:
        files["baseline"] = args.out_dir / "baseline.json"
        files["baseline"].write_text(json.dumps(baseline_doc, indent=2) + "\n", encoding="utf-8")
    if args.chart:
        draw(report, files["chart"])
    print(json.dumps({"gate": report["gate"], "summary": summary_lines(report),
                      "engine_is_test_double": report["engine_is_test_double"],
                      "files": {k: str(v) for k, v in files.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
