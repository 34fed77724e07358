"""playbooks/verify.yml against engine test doubles on localhost, one ansible-playbook run for all cases.

Each inventory host is one scenario (its own double on its own port), so the whole matrix costs one
playbook run: a 0.66x speculative double that must fail the gate, a 1.8x one that must pass, a vLLM
double behind an API key, a hung /health, an endpoint that ignores its API key, and a baseline run.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from verify_helpers import (
    BENCH_DOUBLE,
    SHAREGPT_FIXTURE,
    EngineDouble,
    host_report_dir,
    run_bench_double,
    run_verify,
    write_inventory,
    write_serving_state,
)

from tests.playbook_run import run_module

pytestmark = pytest.mark.integration

# Slow enough that the double's sleeps, not CPU contention on a busy CI box, set the throughput.
TOKENS_PER_S = "50"
LEVELS = [1, 8]
# Concurrency 1 is gated; 8 is benchmarked and reported but swings with the load of a shared 2-core CI box.
GATED = [1]
# The gated level runs sampled (verify_bench_sampled_concurrency, by default the highest gated level) but on `slow`.
SAMPLING = {"temperature": 0.6, "top_p": 0.95}
WORKLOAD = {"input_len": 16, "output_len": 32, "min_prompts": 4, "per_concurrency": 2}
VLLM_KEY = "vk-Secret-123!$q"
UNENFORCED_KEY = "never-Enforced-KEY-42"
ECHOED_KEY = "sk-Echoed-By-Server-Info-7"
PRE_WINDOW_REQUESTS = 150
KIMI_PARSERS = {"reasoning-parser": "kimi_k2", "tool-call-parser": "kimi_k2"}
# The smoke request and check before thinking was turned off (roles/verify/tasks/smoke.yml until then).
OLD_SMOKE_BODY = {"messages": [{"role": "user", "content": "Reply with one short sentence: what is 2 + 2?"}],
                  "temperature": 0, "max_tokens": 32}


def prompts_for(level: int) -> int:
    return max(WORKLOAD["min_prompts"], WORKLOAD["per_concurrency"] * level)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("verify")
    tokenizer = work / "tokenizer"
    tokenizer.mkdir()
    speed = {"ENGINE_DOUBLE_TOKENS_PER_S": TOKENS_PER_S}
    doubles = {
        "base": EngineDouble(work, "base", env=speed),
        # speculative output tok/s = accept length / spec cost x base: 1.18/1.78 = 0.66x, 2.95/1.64 = 1.8x
        "slow": EngineDouble(
            work,
            "slow",
            speculative=True,
            env={**speed, "ENGINE_DOUBLE_ACCEPT_RATE": "0.15", "ENGINE_DOUBLE_SPEC_COST": "1.78",
                 "ENGINE_DOUBLE_REQUEST_LOG": str(work / "slow-requests.jsonl")},
        ),
        "fast": EngineDouble(
            work,
            "fast",
            speculative=True,
            env={**speed, "ENGINE_DOUBLE_ACCEPT_RATE": "0.8", "ENGINE_DOUBLE_SPEC_COST": "1.64",
                 "ENGINE_DOUBLE_REQUEST_LOG": str(work / "fast-requests.jsonl")},
        ),
        # The same speculative engine on a host where nothing was recorded (its own double: the window counters
        # of `fast` must see only the `fast` host's benchmark).
        "unmeasured": EngineDouble(
            work,
            "unmeasured",
            speculative=True,
            env={**speed, "ENGINE_DOUBLE_ACCEPT_RATE": "0.8", "ENGINE_DOUBLE_SPEC_COST": "1.64"},
        ),
        "vllm": EngineDouble(
            work,
            "vllm",
            "vllm",
            speculative=True,
            api_key=VLLM_KEY,
            env={**speed, "ENGINE_DOUBLE_ACCEPT_RATE": "0.6", "ENGINE_DOUBLE_SPEC_COST": "1.3",
                 "ENGINE_DOUBLE_REQUEST_LOG": str(work / "vllm-requests.jsonl")},
        ),
        # vLLM as it serves without the deploy's middleware: /invocations answers without the key.
        "open_route": EngineDouble(work, "open_route", "vllm", api_key=VLLM_KEY,
                                   env={"ENGINE_DOUBLE_FAULT": "unguarded-route"}),
        "hang": EngineDouble(work, "hang", env={**speed, "ENGINE_DOUBLE_FAULT": "hang"}),
        # Kimi-K2.5 served with its reasoning parser: it thinks unless the request turns thinking off.
        "thinking": EngineDouble(work, "thinking", options=KIMI_PARSERS),
        "vthinking": EngineDouble(work, "vthinking", "vllm", options=KIMI_PARSERS),
        "garbage": EngineDouble(work, "garbage", options=KIMI_PARSERS, env={"ENGINE_DOUBLE_FAULT": "garbage-output"}),
        "deadlock": EngineDouble(work, "deadlock", "vllm", env={"ENGINE_DOUBLE_FAULT": "deadlock-on-generate"}),
        # SGLang without the release's key guard: /server_info returns the keys to an API client.
        "echo_key": EngineDouble(work, "echo_key", api_key=ECHOED_KEY, options={"admin-api-key": "admin-Echoed-8"},
                                 env={"ENGINE_DOUBLE_FAULT": "unguarded-server-info"}),
    }
    try:
        for double in doubles.values():
            double.wait_listening()
        for name in ("base", "slow", "fast", "unmeasured", "vllm", "open_route", "thinking", "vthinking", "garbage",
                     "deadlock", "echo_key"):
            _wait_healthy(doubles[name])
        # The recorded baseline: the same bench client against the double without speculation.
        baseline = {
            level: run_bench_double(
                doubles["base"],
                work,
                level,
                num_prompts=prompts_for(level),
                input_len=WORKLOAD["input_len"],
                output_len=WORKLOAD["output_len"],
                tokenizer=tokenizer,
            )["output_throughput"]
            for level in LEVELS
        }
        # Traffic before the benchmark window: 1-token requests (accept length 1.0) that must not count.
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda _: doubles["fast"].complete(1), range(PRE_WINDOW_REQUESTS)))
        pre_window = doubles["fast"].counters()

        # The same baseline as a baseline.json, the form verify_mode=baseline writes, for the `fast` host.
        baseline_file = work / "fast-baseline.json"
        baseline_file.write_text(json.dumps({
            "kind": "verify-baseline", "schema": 1, "host": "fast", "engine": "sglang", "profile": "p",
            "timestamp": "recorded by the test", "engine_is_test_double": True, "speculative_counters_seen": False,
            "workload": {"backend": "sglang-oai", "dataset": "random-ids", "input_len": WORKLOAD["input_len"],
                         "output_len": WORKLOAD["output_len"]},
            "output_throughput": {str(level): value for level, value in baseline.items()}}))
        report_root = work / "artifacts"
        hosts = {
            name: _host(doubles[source], tokenizer, report_root, work / name, **extra)
            for name, source, extra in (
                ("slow", "slow", {"verify_baselines": {"p": baseline}, "verify_min_accept_rate": 0.3,
                                  "verify_bench_sampled_concurrency": 0}),
                ("fast", "fast", {"verify_baseline": str(baseline_file)}),
                (
                    "vllm_key",
                    "vllm",
                    {
                        "verify_baselines": {"p": baseline},
                        "verify_min_accept_rate": 0.2,
                        "vllm_api_key": VLLM_KEY,
                    },
                ),
                ("baseline", "base", {"verify_mode": "baseline"}),
                # A full run of a release without speculation: measured and reported, recorded only when asked.
                ("plain_full", "base", {}),
                # A speculative profile and nothing recorded on the host: the speed-up is not measured.
                ("no_baseline", "unmeasured", {}),
                ("open_key", "base", {"verify_mode": "smoke", "sglang_api_key": UNENFORCED_KEY}),
                # A sampled level that is not gated, and sampling that would not sample: refused before anything runs.
                ("ungated_sampled", "base", {"verify_bench_sampled_concurrency": 8}),
                ("greedy_sampled", "base", {"verify_bench_sampling": {"temperature": 0.0, "top_q": 0.9}}),
                ("open_route", "open_route", {"verify_mode": "smoke", "vllm_api_key": VLLM_KEY}),
                ("echo_key", "echo_key", {"verify_mode": "smoke", "sglang_api_key": ECHOED_KEY}),
                (
                    "hang",
                    "hang",
                    {
                        "verify_readiness_timeout_s": 3,
                        "verify_health_interval_s": 1,
                        "verify_health_request_timeout_s": 1,
                        "verify_journal_command": ["tail", "-n", "40", str(doubles["hang"].log)],
                    },
                ),
                ("thinking", "thinking", {"verify_mode": "smoke"}),
                ("vllm_thinking", "vthinking", {"verify_mode": "smoke"}),
                ("garbage", "garbage", {"verify_mode": "smoke"}),
                ("deadlock", "deadlock", {"verify_mode": "smoke", "verify_smoke_timeout_s": 3}),
                (
                    "hang_no_journal",
                    "hang",
                    {
                        "verify_readiness_timeout_s": 2,
                        "verify_health_interval_s": 1,
                        "verify_health_request_timeout_s": 1,
                    },
                ),
            )
        }
        inventory = work / "inventory.yml"
        write_inventory(inventory, hosts)
        result = run_verify(inventory, workdir=work)
        (work / "ansible-playbook.log").write_text(result.stdout, encoding="utf-8")
        yield {
            "result": result,
            "output": result.stdout,
            "reports": report_root,
            "baseline": baseline,
            "doubles": doubles,
            "pre_window": pre_window,
            "final_fast": doubles["fast"].counters(),
            "work": work,
        }
    finally:
        for double in doubles.values():
            double.stop()


def _wait_healthy(double: EngineDouble) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{double.base_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{double.name} never became healthy")


def _host(double: EngineDouble, tokenizer: Path, report_root: Path, state_dir: Path, **extra: object) -> dict:
    command = [sys.executable, str(BENCH_DOUBLE)]  # the vLLM recipe's argv starts with `bench serve`
    write_serving_state(state_dir, double, tokenizer, "p")
    return {
        # What serves is read from the host's state (each scenario its own); the test runs as the user that
        # owns it (no sudo on a CI box).
        "engine_service_state_dir": str(state_dir),
        "ansible_become": False,
        "verify_bench_command": command,
        "verify_concurrency": LEVELS,
        "verify_gate_concurrency": GATED,
        "verify_bench_input_len": WORKLOAD["input_len"],
        "verify_bench_output_len": WORKLOAD["output_len"],
        "verify_bench_min_prompts": WORKLOAD["min_prompts"],
        "verify_bench_prompts_per_concurrency": WORKLOAD["per_concurrency"],
        "verify_bench_warmup_requests": 0,
        # (un-normalised, as the role's default is: the report paths it prints and publishes are normalised)
        "verify_report_dir": f"{report_root}/unused/..",
        "verify_sharegpt_subset": str(SHAREGPT_FIXTURE),
        **extra,
    }


def _recap(run: dict, host: str) -> dict[str, int]:
    assert run["result"].played(host), f"no recap for {host}:\n{run['output'][-3000:]}"
    return run["result"].recap(host)


def _report(run: dict, host: str) -> dict:
    return json.loads((host_report_dir(run["reports"], host) / "report.json").read_text())


def test_gate_fails_at_066x_with_which_level_and_how_much(run):
    assert _recap(run, "slow")["failed"] == 1
    report = _report(run, "slow")
    speedups = {row["concurrency"]: row["speedup"]["value"] for row in report["levels"]}
    assert speedups[1] < 1.0, speedups  # the gate's side of its 1.00x minimum; the figure itself is load's to move
    assert not report["gate"]["passed"]
    message = re.search(
        r"speed-up (0\.\d\d)x at concurrency 1 is below the 1\.00x minimum "
        r"\((\d+\.\d) vs (\d+\.\d) tok/s baseline, (-\d+)%\)",
        run["output"],
    )
    assert message, run["output"][-4000:]
    ratio, measured, base, percent = message.groups()
    assert float(base) == pytest.approx(run["baseline"][1], abs=0.05)
    assert float(ratio) == pytest.approx(float(measured) / float(base), abs=0.01)
    # The message rounds the tok/s figures to one decimal but computes the percentage from the exact ones.
    assert abs(int(percent) - (float(measured) / float(base) - 1) * 100) <= 1
    assert re.search(r"acceptance rate \d+\.\d% at concurrency 1 is below the 30\.0% minimum", run["output"])
    assert "verify gate FAILED on slow" in run["output"]
    assert f"(report: {host_report_dir(run['reports'], 'slow')}/report.md)" in " ".join(run["output"].split())
    assert "/unused/.." not in run["output"]


def test_gate_passes_at_18x(run):
    recap = _recap(run, "fast")
    # verify changes nothing on the host but its verdict record (what status.yml says): written here, the first
    # verdict on this host; no secret, nothing of the configuration.
    assert recap["failed"] == 0 and recap["changed"] == 1
    changed = [r["_task"] for r in run["result"].task_events_results() if r["_host"] == "fast" and r.get("changed")]
    assert changed == ["Verdict | record it on the host"], changed
    verdict = json.loads((run["work"] / "fast" / "verdict.json").read_text())
    assert {k: verdict[k] for k in ("kind", "mode", "passed", "failures")} == {
        "kind": "verify", "mode": "full", "passed": True, "failures": []}, verdict
    assert verdict["release"] == json.loads((run["work"] / "fast" / "state.json").read_text())["current"]
    report = _report(run, "fast")
    assert report["gate"]["passed"] and report["gate"]["failures"] == []
    row = report["levels"][0]
    # 1.8x as configured; what it measures on a shared machine is load's to move: the verdict is which side of the
    # gate's 1.00x minimum it fell on.
    assert row["concurrency"] == 1 and row["speedup"]["value"] >= 1.0, row
    assert verdict["speedup"] == round(row["speedup"]["value"], 2)
    assert row["baseline_output_throughput"]["source"].startswith("baseline report ")
    assert report["baseline"]["warnings"] == []  # same host, profile, engine and workload as recorded
    assert [(c["check"], c["concurrency"], c["status"]) for c in report["gate"]["checks"]] == [("speed-up", 1, "pass")]


def test_acceptance_is_counted_over_the_benchmark_window_only(run):
    report = _report(run, "fast")
    window_tokens = 0
    for row in report["levels"]:
        detail = row["acceptance"]["detail"]
        # What the double generated in the window is exactly what the client received.
        assert detail["generation_tokens"] == row["total_output_tokens"]["value"]
        assert row["acceptance"]["length"] == pytest.approx(detail["generation_tokens"] / detail["verify_calls"])
        assert row["acceptance"]["rate"] == pytest.approx((row["acceptance"]["length"] - 1) / 3)
        # accept rate 0.8 over 3 steps: 1 + 0.8 + 0.64 + 0.512 = 2.95 tokens per verify (less a truncated tail)
        assert 2.5 < row["acceptance"]["length"] < 3.1
        assert row["acceptance"]["source"] == "Δ/metrics counters over the benchmark window"
        window_tokens += detail["generation_tokens"]
    pre, final = run["pre_window"], run["final_fast"]
    generated_by_playbook = final["sglang:generation_tokens_total"] - pre["sglang:generation_tokens_total"]
    smoke = report["smoke"]  # the greedy and the sampled smoke request generated too
    assert generated_by_playbook == window_tokens + int(smoke["completion_tokens"]) + int(
        smoke["sampled"]["completion_tokens"])
    since_start = report["since_start"]["avg_spec_accept_length"]
    assert "since engine start" in since_start["source"]
    assert since_start["value"] == pytest.approx(
        final["sglang:generation_tokens_total"] / final["sglang:spec_verify_calls_total"]
    )
    # The 1-token requests before the window drag the since-start average down; the window ignores them.
    assert since_start["value"] < min(row["acceptance"]["length"] for row in report["levels"]) - 0.3


def test_no_baseline_fails_the_gate_speed_up_not_measured(run):
    assert _recap(run, "no_baseline")["failed"] == 1
    report = _report(run, "no_baseline")
    assert not report["gate"]["passed"]
    assert report["gate"]["failures"][0].startswith("speed-up not measured at concurrency 1: no comparable baseline")
    assert report["baseline"]["source"].startswith("none: no baseline recorded on the host")
    assert "verify gate FAILED on no_baseline: speed-up not measured at concurrency 1" in run["output"]


@pytest.mark.parametrize(("host", "workload", "sampling"), [("fast", "sharegpt_sampled", SAMPLING),
                                                            ("slow", "sharegpt", {"temperature": 0.0})])
def test_gated_levels_run_sharegpt_and_the_others_random_tokens(run, host, workload, sampling):
    """The gated level runs the ShareGPT conversations, sampled where it is the sampled level (`fast`, by default)
    and greedy where there is none (`slow`: verify_bench_sampled_concurrency 0); the others random tokens."""
    report = _report(run, host)
    assert {row["concurrency"]: row["workload"] for row in report["levels"]} == {1: workload, 8: "random"}
    assert {row["concurrency"]: row["sampling"] for row in report["levels"]} == {1: sampling,
                                                                                 8: {"temperature": 0.0}}
    inputs = json.loads((host_report_dir(run["reports"], host) / "inputs.json").read_text())
    results = {level["concurrency"]: level["result"] for level in inputs["bench"]["levels"]}
    assert results[1]["dataset_name"] == "sharegpt" and results[1]["sharegpt_output_len"] == WORKLOAD["output_len"]
    assert results[8]["dataset_name"] == "random-ids" and results[8]["random_input_len"] == WORKLOAD["input_len"]
    assert report["workloads"]["sharegpt"]["sampling"] == {"temperature": 0.0}
    assert report["workloads"]["sharegpt_sampled"]["sampling"] == SAMPLING
    # the gated level through the client's chat path, the random tokens through completions (the lock's endpoints)
    assert (results[1]["backend"], results[8]["backend"]) == ("sglang-oai-chat", "sglang-oai")
    assert report["workloads"][workload]["endpoint"] == "/v1/chat/completions"
    assert report["workloads"]["random"]["endpoint"] == "/v1/completions"
    markdown = (host_report_dir(run["reports"], host) / "report.md").read_text()
    shown = ", ".join(f"{key} {value}" for key, value in sampling.items())
    assert re.search(rf"^\| 1 \| .* \| yes \| {workload} \| {shown} \|$", markdown, re.MULTILINE), markdown


@pytest.mark.parametrize(("double", "sampling"), [("fast", SAMPLING), ("vllm", SAMPLING),
                                                  ("slow", {"temperature": 0.0, "top_p": None})])
def test_the_sampled_level_sent_its_sampling_parameters(run, double, sampling):
    """What the engine got from the benchmark client (the smoke asks for other max_tokens): the sampled level's chat
    requests carry temperature and top_p (SGLang's client in its request body, vLLM's from --temperature/--top-p),
    the greedy levels temperature 0 and no top_p."""
    log = run["work"] / f"{double}-requests.jsonl"
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    sent = [line for line in sent if line["max_tokens"] == WORKLOAD["output_len"]]
    chat = [(line["temperature"], line["top_p"]) for line in sent if line["path"] == "/v1/chat/completions"]
    completions = {(line["temperature"], line["top_p"]) for line in sent if line["path"] == "/v1/completions"}
    assert len(chat) == prompts_for(1), sent  # level 1's requests, the chat route's only ones of this length
    assert set(chat) == {(sampling["temperature"], sampling["top_p"])}, sent
    assert completions == {(0.0, None)}, sent  # level 8, random tokens


def test_a_sampled_level_that_is_not_gated_or_does_not_sample_is_refused_naming_it(run):
    output = " ".join(run["output"].split())
    assert _recap(run, "ungated_sampled")["failed"] == 1
    assert ("verify_bench_sampled_concurrency=8 is not one of verify_gate_concurrency [1]: the sampled level must be "
            "a gated level (0 = no sampled level)") in output, output[-3000:]
    assert _recap(run, "greedy_sampled")["failed"] == 1
    assert re.search(r'verify_bench_sampling=\{"temperature": 0\.0, "top_q": 0\.9\} does not sample the level '
                     r"verify_bench_sampled_concurrency=1: its keys must be among temperature, top_p, .* "
                     r"\(not: top_q\), and temperature must be > 0", output), output[-3000:]
    for host in ("ungated_sampled", "greedy_sampled"):  # refused before the benchmark: no report
        assert not (run["reports"] / host).exists()


def test_vllm_acceptance_matches_the_clients_own_window(run):
    assert _recap(run, "vllm_key")["failed"] == 0
    report = _report(run, "vllm_key")
    assert report["engine"] == "vllm"
    for row in report["levels"]:
        accept = row["acceptance"]
        assert accept["rate"] == pytest.approx(row["bench_client_accept_rate"]["value"])
        assert accept["length"] == pytest.approx(1 + accept["detail"]["accepted_tokens"] / accept["detail"]["drafts"])
        assert 0.25 < accept["rate"] < 0.55  # accept 0.6 over 3 tokens: (0.6 + 0.36 + 0.216) / 3 = 0.39
    checks = [(c["check"], c["status"]) for c in report["gate"]["checks"]]
    assert checks == [("speed-up", "pass"), ("acceptance", "pass")]


def test_hung_health_ends_at_the_timeout_with_the_log_tail(run):
    output = run["output"]
    assert _recap(run, "hang")["failed"] == 1
    assert re.search(r"sglang at http://127\.0\.0\.1:\d+ is not ready: /health did not answer 200 within 3 s", output)
    # the double's own log lines, one per line
    assert re.search(
        r"^\s+ENGINE TEST DOUBLE \(not an engine\): sglang flavour.*\n\s+engine-double: listening on",
        output,
        re.MULTILINE,
    )
    assert _recap(run, "hang_no_journal")["failed"] == 1
    assert "systemd does not run on this host, so unit sglang.service has no journal" in output


def test_report_files_table_and_chart(run):
    directory = host_report_dir(run["reports"], "fast")
    assert {"report.json", "report.md", "throughput.png", "inputs.json"} <= {p.name for p in directory.iterdir()}
    markdown = (directory / "report.md").read_text()
    assert "ENGINE TEST DOUBLE" in markdown
    assert "| Concurrency | Output tok/s | Baseline tok/s | Speed-up | Accept rate |" in markdown
    assert re.search(r"^\| 8 \| \d+\.\d \| \d+\.\d \| \d\.\d\dx \| \d+\.\d% \|", markdown, re.MULTILINE)
    assert "](throughput.png)" in markdown
    png = (directory / "throughput.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR" and len(png) > 5000
    assert _report(run, "fast")["engine_is_test_double"] is True
    assert "[ENGINE TEST DOUBLE]" in run["output"]


def test_api_key_refusal_and_no_leak(run):
    """The playbook runs at -vvv, which prints every remote command line: the key must be in none."""
    report = _report(run, "vllm_key")
    assert report["smoke"]["unauthenticated"] == "refused with HTTP 401"
    assert VLLM_KEY not in run["output"]
    assert UNENFORCED_KEY not in run["output"]
    for path in run["reports"].rglob("*"):
        if path.is_file():
            assert VLLM_KEY.encode() not in path.read_bytes(), path
    assert _recap(run, "open_key")["failed"] == 1
    assert "answered HTTP 200 to a request without it (expected 401 or 403)" in run["output"]


def test_every_post_route_of_the_route_table_is_asked_without_the_key(run):
    """The no-key probe reads the engine's own /openapi.json: every POST route refused is counted, and a route that
    serves without the key (vLLM's /invocations outside its guarded prefixes) fails the gate, named."""
    assert _report(run, "vllm_key")["smoke"]["unauthenticated_routes"] == (
        "5 POST routes refused without the key: the route table (/openapi.json) and the known generating routes")
    assert _recap(run, "open_route")["failed"] == 1
    flat = " ".join(run["output"].split())
    assert "1 of 5 POST routes of http://127.0.0.1:" in flat, flat[-3000:]
    assert "/invocations answered HTTP 422. Whoever reaches the port can use them without the key." in flat
    assert "--middleware bws_vllm_auth.RequireApiKey" in flat


def test_a_server_info_that_returns_the_key_fails_the_gate_without_showing_it(run):
    """SGLang 0.5.23 alone returns api_key and admin_api_key from /server_info; the release's plugin blanks them and
    fails open inside SGLang, so verify checks the outcome. The play output names the cause, not the key."""
    assert _recap(run, "echo_key")["failed"] == 1
    flat = " ".join(run["output"].split())
    assert "/server_info returned the API key to an API client" in flat, flat[-3000:]
    assert "bws_sglang_guard" in flat
    assert ECHOED_KEY not in run["output"] and "admin-Echoed-8" not in run["output"]


def test_baseline_mode_writes_a_baseline_to_pass_back(run):
    assert _recap(run, "baseline")["failed"] == 0
    directory = host_report_dir(run["reports"], "baseline")
    baseline = json.loads((directory / "baseline.json").read_text())
    assert baseline["kind"] == "verify-baseline" and baseline["profile"] == "p" and baseline["host"] == "baseline"
    assert baseline["speculative_counters_seen"] is False
    inputs = json.loads((directory / "inputs.json").read_text())
    measured = {str(level["concurrency"]): level["result"]["output_throughput"] for level in inputs["bench"]["levels"]}
    assert baseline["output_throughput"] == measured  # what the client measured on this host, every level
    assert set(measured) == {str(level) for level in LEVELS}
    assert f"baseline for verify_baseline: {directory / 'baseline.json'}" in run["output"]
    # the mode asks for it: recorded on the host under its key, nothing replaced
    recorded = list((run["work"] / "baseline" / "verify-baselines").glob("*.json"))
    assert len(recorded) == 1 and json.loads(recorded[0].read_text())["output_throughput"] == measured
    assert list((run["work"] / "baseline" / "verify-baselines" / "history").iterdir()) == []
    assert f"baseline recorded on the host: {recorded[0]}" in " ".join(run["output"].split())
    status = run_module("blackwell.serving.engine_status", f"state_dir={run['work'] / 'baseline'} units=[]",
                        timeout=60)
    assert [(b["key"], b["profile"], b["output_throughput"], b["history"]) for b in status["baselines"]] == [
        (recorded[0].stem, "p", measured, [])]


def test_a_full_run_without_speculation_records_no_baseline_unless_asked(run):
    """A deploy's gate or a verify of a plain profile never replaces the numbers a speculative release is gated on."""
    assert _recap(run, "plain_full")["failed"] == 0
    assert (host_report_dir(run["reports"], "plain_full") / "baseline.json").is_file()  # the controller's copy
    assert not (run["work"] / "plain_full" / "verify-baselines").exists()
    said = " ".join(run["output"].split())
    assert ("not recorded on the host as its baseline: verify_mode=baseline or -e verify_record_baseline=true "
            "records it") in said


def test_bench_client_double_writes_the_real_clients_keys(run):
    """The keys the role and report read, as the real clients write them (engines.md §4)."""
    sglang = json.loads((host_report_dir(run["reports"], "fast") / "inputs.json").read_text())
    vllm = json.loads((host_report_dir(run["reports"], "vllm_key") / "inputs.json").read_text())
    sglang_keys = {"backend", "dataset_name", "request_rate", "max_concurrency", "duration", "completed",
                   "total_input_tokens", "total_output_tokens", "request_throughput", "input_throughput",
                   "output_throughput", "total_throughput", "mean_ttft_ms", "median_itl_ms", "p99_itl_ms",
                   "mean_e2e_latency_ms", "p99_ttft_ms", "concurrency", "accept_length"}
    vllm_keys = {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                 "request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms",
                 "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "spec_decode_acceptance_rate",
                 "spec_decode_acceptance_length", "spec_decode_num_drafts", "spec_decode_accepted_tokens"}
    # inputs.json keeps the names of every field the client wrote, and the values of the allow-listed ones only
    # (plugins/modules/bench_result.py): SGLang's real client saves /server_info, API key included.
    for level in sglang["bench"]["levels"]:
        assert sglang_keys <= set(level["result_fields"]), sglang_keys - set(level["result_fields"])
        assert set(level["result"]) < set(level["result_fields"])
    for level in vllm["bench"]["levels"]:
        assert vllm_keys <= set(level["result_fields"]), vllm_keys - set(level["result_fields"])
        assert "ttfts" not in level["result_fields"]  # per-request lists only with --save-detailed, as in vLLM


def _adhoc_engine_metrics(url: str) -> dict:
    return run_module("blackwell.serving.engine_metrics", f"url={url} prefixes=vllm:,sglang:", timeout=60)


def test_engine_metrics_module_sums_counters_and_tolerates_a_missing_endpoint(run):
    double = run["doubles"]["vllm"]
    scraped = _adhoc_engine_metrics(f"{double.base_url}/metrics")
    assert scraped["available"] is True and scraped["test_double"] is True
    assert scraped["counters"] == {k: v for k, v in double.counters().items() if k.startswith("vllm:")}
    assert scraped["counters"]["vllm:spec_decode_num_accepted_tokens_per_pos_total"] > 0  # summed over positions
    double = run["doubles"]["base"]  # no API key: an unknown path is a plain 404
    missing = _adhoc_engine_metrics(f"{double.base_url}/no-metrics-here")
    assert missing["available"] is False and missing["status"] == 404 and missing["counters"] == {}


def _smoke_line(output: str, host: str) -> str:
    """The role's 'smoke: asked ...' message for a host, on one line (the YAML callback folds and quotes it)."""
    pattern = rf"^ok: \[{host}\] => \n\s+msg: '(smoke: asked .*?)'\n(?=\S|\n)"
    match = re.search(pattern, output, re.MULTILINE | re.DOTALL)
    assert match, f"no smoke line for {host}"
    return " ".join(match.group(1).replace("''", "'").split())


def _chat(double: EngineDouble, body: dict) -> dict:
    request = urllib.request.Request(f"{double.base_url}/v1/chat/completions",
                                     data=json.dumps({"model": double.served_name, **body}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["choices"][0]["message"]


@pytest.mark.parametrize(("name", "reasoning_field"), [("thinking", "reasoning_content"), ("vthinking", "reasoning")])
def test_negative_control_the_old_smoke_request_fails_against_a_thinking_model(run, name, reasoning_field):
    """The request smoke.yml sent before: Kimi thinks, its answer goes to the reasoning field, content is empty,
    so the old check (non-empty content) rolled every Kimi deploy back."""
    message = _chat(run["doubles"][name], OLD_SMOKE_BODY)
    assert not (message["content"] or "").strip()
    assert "2 + 2" in message[reasoning_field]


@pytest.mark.parametrize(("host", "engine"), [("thinking", "sglang"), ("vllm_thinking", "vllm")])
def test_the_new_smoke_passes_against_a_thinking_model_and_checks_the_sum(run, host, engine):
    assert _recap(run, host)["failed"] == 0
    line = _smoke_line(run["output"], host)
    pattern = r"asked 'What is (\d+) \+ (\d+)\? .*the answer (\d+) came in content"
    left, right, expected = re.search(pattern, line).groups()
    assert int(left) + int(right) == int(expected) and 100 <= int(left) <= 999


def test_the_smoke_question_changes_from_run_to_run(run):
    questions = {re.search(r"asked '([^']*)'", _smoke_line(run["output"], host)).group(1)
                 for host in ("thinking", "vllm_thinking", "slow", "fast", "vllm_key")}
    assert len(questions) >= 4, questions  # five draws of two operands from 900 values each


def test_garbage_output_fails_the_smoke_naming_the_reply(run):
    output = " ".join(run["output"].split())
    assert _recap(run, "garbage")["failed"] == 1
    assert re.search(r"the smoke answer is wrong: asked 'What is \d+ \+ \d+\? Reply with the number only\.', "
                     r"expected \d+; the greedy \(temperature 0\) request got HTTP 200 .*content 'foss foss", output), \
        output[-3000:]


def test_a_deadlocked_engine_fails_the_smoke_at_its_timeout_saying_what_that_means(run):
    output = " ".join(run["output"].split())
    assert _recap(run, "deadlock")["failed"] == 1
    assert "the engine answers but did not generate within 3 s: vllm at http://127.0.0.1:" in output
