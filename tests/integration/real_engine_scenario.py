"""The steps of the real-front-end host scenario, shared by test_real_sglang_host.py and test_real_vllm_host.py
(one file per engine, so that xdist runs the two hosts side by side). Each step states the host it leaves."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import yaml

from tests.integration.engine_host import REPO, EngineHost
from tests.integration.lifecycle_helpers import API_KEY, assert_rolled_back, deploy, main_pid, play_failure
from tests.playbook_run import run_at_a_terminal

# Lines only the engines' own start-up writes (the light double writes none of them): SGLang 0.5.23
# srt/entrypoints/http_server.py after its warm-up; vLLM 0.33.0 entrypoints/launchers/api_server/entry.py.
OWN_START_LINES = {"sglang": "The server is fired up and ready to roll!",
                   "vllm": "Starting vLLM server on"}


def unit(engine: str) -> str:
    return f"{engine}.service"


def deploy_serves_from_the_real_front_end(host: EngineHost, runs: list, engine: str) -> None:
    """Leaves: the engine's real front end serving release 1 under its unit."""
    run = deploy(host, runs, f"deploy_{engine}.yml")
    assert run.status == "successful", run.stdout[-4000:]
    assert host.unit(unit(engine))["ActiveState"] == "active"
    assert host.health() == 200
    journal = host.sh(f"journalctl -u {unit(engine)} --no-pager -o cat")
    assert OWN_START_LINES[engine] in journal, journal[-3000:]
    assert "ENGINE TEST DOUBLE" not in run.stdout
    if engine == "sglang":  # the layout SGLang resolved, read back from its /server_info by the gate's verify
        flat = " ".join(run.stdout.split())
        # (the quote comes doubled, the message being a YAML single-quoted string)
        layout = ('{"attention_data_parallel_size": 1, "data_parallel_size": 1, "expert_parallel_size": 1, '
                  '"tensor_parallel_size": 1} (/server_info).')
        assert re.search(r"sglang runs the release'+s layout " + re.escape(layout), flat), flat[-3000:]


# The controller's secrets while CI runs verify: a Hub token (passed to the play), a variable named with --redact-env
# (passed), a CI token (not named: never passed), and a vars file's model-store token; the engine's API key is the
# inventory's. None of them may be anywhere the controller keeps, nor in the engine's journal.
CI_ENVIRONMENT = {"HF_TOKEN": "hf_RealHostFakeHubToken0001", "DEPLOY_SECRET": "deploy-secret-RealHost-0002",
                  "GITHUB_TOKEN": "ghp_RealHostFakeCiToken0003"}
VARS_FILE = {"model_store_hf_token": "hf_RealHostVarsFileToken0004"}
SECRETS = {"API key": API_KEY, **CI_ENVIRONMENT, **VARS_FILE}


def verify_passes_with_the_real_parsers(host: EngineHost, runs: list, engine: str) -> None:
    """verify.yml on what serves, as CI runs it (scripts/ci_playbook.py, ansible-runner) with every secret set:
    the smoke's answer comes through the engine's real kimi_k2 reasoning parser. Leaves: the host as it was."""
    secrets_file = host.workdir / "secrets.yml"
    secrets_file.write_text(yaml.safe_dump(VARS_FILE))
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "ci_playbook.py"), "playbooks/verify.yml", "-i", str(host.inventory),
         "--artifacts", str(host.workdir / "ci"), "--ident", "verify", "--redact-env", "DEPLOY_SECRET",
         "--extra-vars-file", str(secrets_file)],
        capture_output=True, text=True, check=False, cwd=REPO, env={**os.environ, **CI_ENVIRONMENT}, timeout=900,
    )
    secrets_file.unlink()
    assert result.returncode == 0, play_failure(result.stdout)
    recorded_env = json.loads((host.workdir / "ci" / "verify" / "command").read_text())["env"]
    assert "GITHUB_TOKEN" not in recorded_env and recorded_env["HF_TOKEN"] == "********", recorded_env.keys()
    reports = sorted((host.workdir / "ci" / "verify" / "reports" / host.name).glob("*/report.json"))
    report = json.loads(reports[-1].read_text())
    assert report["engine_is_test_double"] is False, report["test_double"]
    smoke = report["smoke"]
    assert smoke["answer_field"] == "content" and str(smoke["expected"]) in smoke["preview"], smoke
    # ... and asked again sampled, through the engine's own sampling parameters (SGLang normalises them in its
    # TokenizerManager, vLLM in its SamplingParams): answered the same way.
    sampled = smoke["sampled"]
    assert sampled["request"] == "sampled (temperature 0.6, top_p 0.95)", sampled
    assert sampled["answer_field"] == "content" and str(smoke["expected"]) in sampled["preview"], sampled
    assert smoke["unauthenticated"] == "refused with HTTP 401", smoke
    # Every POST route of the real app's /openapi.json was asked without the key and refused (vLLM: through the
    # role's middleware; its own check leaves /invocations open).
    routes, _, source = smoke["unauthenticated_routes"].partition(" POST routes refused without the key: ")
    assert int(routes) >= 10 and source.startswith("the route table (/openapi.json)"), smoke
    assert report["gate"]["passed"] is True, report["gate"]
    # Acceptance from the engine's own /metrics counters over the benchmark window
    # (plugins/module_utils/engine/metrics.py).
    acceptance = report["levels"][0]["acceptance"]
    assert acceptance["problem"] is None and 0 < acceptance["rate"] < 1, acceptance


def failed_gate_rolls_back(host: EngineHost, runs: list, engine: str) -> None:
    """A release whose model answers garbage fails its gate, the reply named; the release before it serves again,
    restarted. (The light double's lifecycle tests leave this case to these hosts.)
    Leaves: release 1 serving (a new process)."""
    before, pid = host.state()["current"], main_pid(host, unit(engine))
    run = deploy(host, runs, f"deploy_{engine}.yml",
                 **{f"{engine}_extra_environment": {"SCRIPTED_ENGINE_FAULT": "garbage-output"}})
    assert run.status == "failed", run.stdout[-4000:]
    flat = " ".join(run.stdout.split())
    # (quotes come doubled where the message is quoted again in the rollback's; the engines' detokenizers put a space
    # before the first word)
    assert re.search(r"the smoke answer is wrong: asked '+What is \d{3} \+ \d{3}\? Reply with the number only\.'+, "
                     r"expected \d+; the greedy \(temperature 0\) request got HTTP 200 .* content '+ ?foss foss foss",
                     flat), flat[-3000:]
    assert_rolled_back(flat, before)
    assert host.state()["current"] == before and host.state()["status"] == "serving"
    assert host.health() == 200
    assert main_pid(host, unit(engine)) not in (pid, "0")


# The smoke's timeout for the sampler-hang deploy: the failure names it.
SAMPLER_HANG_SMOKE_TIMEOUT_S = 40


def task_results(run, name_part: str) -> list[dict]:
    """The ok and failed results of the play's tasks whose name holds name_part, in order (ansible-runner's job
    events)."""
    events = [json.loads(path.read_text()) for path in (Path(run.artifact_dir) / "job_events").glob("*.json")]
    return [event for event in sorted(events, key=lambda event: event.get("counter", 0))
            if event.get("event") in ("runner_on_ok", "runner_on_failed")
            and name_part in (event.get("event_data", {}).get("task") or "")]


def task_times(run, name_part: str) -> tuple[datetime, datetime]:
    """When the play's task whose name holds name_part started and ended."""
    done = [event["event_data"] for event in task_results(run, name_part)]
    assert len(done) == 1, f"{len(done)} results of a task named like {name_part!r}"
    return datetime.fromisoformat(done[0]["start"]), datetime.fromisoformat(done[0]["end"])


def sampler_hang_after_ready_rolls_back_at_the_smoke_timeout(host: EngineHost, runs: list, engine: str) -> None:
    """An engine whose sampler hangs (FlashInfer's top-k/top-p sampler on SM120, vllm#43885): it starts, reports
    ready and answers the greedy smoke (greedy decoding skips the sampler); the sampled smoke blocks its scheduler for
    ever. The deploy fails on the sampled request, which did not generate within the smoke's timeout (the failure
    says so, and that the greedy request was answered), and rolls back.
    Leaves: release 1 serving (a new process)."""
    before = host.state()["current"]
    run = deploy(host, runs, f"deploy_{engine}.yml", verify_smoke_timeout_s=SAMPLER_HANG_SMOKE_TIMEOUT_S,
                 **{f"{engine}_extra_environment": {"SCRIPTED_ENGINE_FAULT": "sampler-hang"}})
    assert run.status == "failed", run.stdout[-4000:]
    flat = " ".join(run.stdout.split())
    stuck = re.search(rf"did not generate within {SAMPLER_HANG_SMOKE_TIMEOUT_S} s: {engine} at \S+ reported ready, yet "
                      r"the sampled \(temperature 0\.6, top_p 0\.95\) smoke completion \(\d+ tokens at most\) got no "
                      r"reply \(Request failed: timed out[^,)]*\)?, after ([\d.]+) s\)", flat)
    assert stuck, flat[-3000:]
    greedy = re.search(r"or in the sampler: the greedy request was answered in ([\d.]+) s", flat)
    assert greedy, flat[-3000:]
    assert_rolled_back(flat, before)
    assert host.state()["current"] == before and host.health() == 200
    print(f"{engine} sampler hang after ready: the sampled request gave up after {stuck.group(1)} s (smoke timeout "
          f"{SAMPLER_HANG_SMOKE_TIMEOUT_S} s; greedy answer {greedy.group(1)} s)")


def teardown_stops_the_engine(host: EngineHost, runs: list, engine: str) -> None:
    """From a terminal teardown.yml shows what it would stop and, answered "no", stops with nothing changed; without
    a terminal (ansible-runner, as CI runs it) it refuses, nothing changed, unless -e teardown_confirm=yes answers
    ahead; then it stops the engine.
    Leaves: nothing serving, no process of the front end left."""
    before, pid = host.state(), host.unit(unit(engine))["MainPID"]
    rc, printed = run_at_a_terminal(REPO / "teardown.yml", host.inventory, "no", wait_for="Type yes to go on")
    assert rc != 0, printed[-3000:]
    assert f"{host.name}: stops {unit(engine)}; release {before['current']} ({engine}, serving)" in printed, \
        printed[-3000:]
    assert "Not confirmed (the answer was 'no', not yes): stopped before anything changed." in printed, printed[-3000:]
    assert host.state() == before and host.unit(unit(engine))["MainPID"] == pid and host.health() == 200
    unasked = host.run_playbook("playbooks/teardown.yml")
    runs.append(unasked)
    assert unasked.status == "failed", unasked.stdout[-4000:]
    assert ("Nobody to ask: run by ansible-runner, whose terminal nobody types at. Refusing to go on unasked: give -e "
            "teardown_confirm=yes") in " ".join(unasked.stdout.split()), unasked.stdout[-4000:]
    assert host.state() == before and host.unit(unit(engine))["MainPID"] == pid and host.health() == 200
    run = host.run_playbook("playbooks/teardown.yml", {"teardown_confirm": "yes"})
    runs.append(run)
    assert run.status == "successful", run.stdout[-4000:]
    assert "Confirmed by teardown_confirm=yes." in " ".join(run.stdout.split()), run.stdout[-4000:]
    assert host.unit(unit(engine))["ActiveState"] in ("inactive", "failed")
    # (the bracket keeps pgrep from matching the shell that runs it)
    assert host.sh(f"pgrep -f '[{engine[0]}]{engine[1:]}_serve.py' || true") == ""
    assert host.health() is None


def secret_forms(secret: str) -> dict[str, str]:
    """The ways a secret shows up in text: as it is, JSON-escaped, Python-repr-escaped (SGLang logs its
    server_args with repr) and base64 (ansible's slurp of a file that holds it) at each of the three byte
    alignments the secret can have inside the encoded file: the characters that encode only its own bytes."""
    forms = {"verbatim": secret, "json": json.dumps(secret)[1:-1], "repr": repr(secret)[1:-1]}
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + secret.encode()).decode()
        forms[f"base64+{shift}"] = encoded[4 if shift else 0:-4]
    return forms


def host_made_secrets(host: EngineHost, engine: str) -> dict[str, str]:
    """The secrets the host made itself: SGLang's admin key (plugins/modules/host_secret.py: 32 bytes kept root 0600,
    used as
    their URL-safe base64 without padding)."""
    if engine != "sglang":
        return {}
    raw = base64.b64decode(host.sh("base64 -w0 /var/lib/llm-serving/sglang-admin-api-key").strip())
    assert len(raw) == 32, "the host made no admin key"
    return {"SGLang admin key": base64.urlsafe_b64encode(raw).decode().rstrip("=")}


def secret_forms_the_controller_keeps(host: EngineHost, runs: list, engine: str) -> list[str]:
    """Where the controller keeps a secret after the scenario's runs: verify's report folders (report, inputs,
    bench results), the CI run's artifacts and ansible-runner's (play output, events, environment), in any form."""
    kept = [path for folder in ("reports", "ci") for path in (host.workdir / folder).rglob("*") if path.is_file()]
    kept += [path for run in runs for path in Path(run.artifact_dir).rglob("*") if path.is_file()]
    assert len(kept) > 20, kept
    secrets = {**SECRETS, **host_made_secrets(host, engine)}
    hits = []
    for path in kept:
        text = path.read_text(errors="replace")
        hits += [f"{path.relative_to(host.workdir)}: {name} ({form})" for name, value in secrets.items()
                 for form, secret in secret_forms(value).items() if secret in text]
    return hits


def secret_forms_in_journal(host: EngineHost, engine: str) -> list[str]:
    journal = host.sh(f"journalctl -u {unit(engine)} --no-pager -o cat")
    return [f"{name} ({form})" for name, value in {**SECRETS, **host_made_secrets(host, engine)}.items()
            for form, text in secret_forms(value).items() if text in journal]


# --- stall detection against the real front end (engine_wait's sources of progress) -----------------------------
# Systemd in a container on a hybrid cgroup host (cgroup v1 controllers) cannot give its units the io controller:
# they have no io.stat, engine_wait reports it unavailable and reads the bytes in /proc/<pid>/io, which root reads
# with CAP_SYS_PTRACE (the vLLM host is booted with it, as root on a real host has it). On a cgroup v2 host whose
# io controller reaches the container, the unit has io.stat (IOAccounting=yes) and that is read instead. The test
# hosts have no nvidia-smi: no GPU memory source.
STALL_FLOOR_S, STALL_CAP_S = 30, 150


def wait_results(run) -> list[tuple[bool, dict]]:
    """The serve check's engine_wait results of a play (ansible-runner's job events), in order: (whether the wait
    succeeded, the module's return values)."""
    return [(event["event"] == "runner_on_ok", event["event_data"]["res"])
            for event in task_results(run, "Serve check | wait for readiness")]


def stall_timeout_for(runs: list) -> int:
    """The stall bound of the stall scenarios: twice the longest time without progress of this host's healthy real
    starts so far (engine_wait's own report: the front end writes nothing while it imports, from the page cache
    once warm, and longer under load), within [STALL_FLOOR_S, STALL_CAP_S]. A start must not stall before the fault
    under test begins."""
    silences = [result["progress"]["longest_silent_s"] for run in runs for ok, result in wait_results(run)
                if ok and result.get("progress")]
    return int(min(STALL_CAP_S, max(STALL_FLOOR_S, 2 * max(silences, default=STALL_FLOOR_S))))


def stall_vars(engine: str, stall_s: int, environment: dict[str, str]) -> dict:
    return {f"{engine}_stall_timeout_s": stall_s, "engine_service_stall_timeout_s": stall_s,
            f"{engine}_extra_environment": environment}


def byte_source(result: dict) -> dict:
    """The byte counter engine_wait read (io.stat where the unit has one, else /proc/<pid>/io), the other saying why
    it was not read; no GPU memory claimed where there is no nvidia-smi."""
    sources = result["progress"]["sources"]
    assert set(sources) == {"journal", "io_stat", "proc_io", "gpu_memory", "compilers"}, sources
    if sources["io_stat"]["read"]:
        assert sources["proc_io"]["problem"] == "not read: io.stat counts these bytes", sources["proc_io"]
        read = sources["io_stat"]
    else:
        assert "the io controller is not enabled for it" in sources["io_stat"]["problem"], sources["io_stat"]
        read = sources["proc_io"]
    assert read["read"] is True and read["value"] is not None, sources
    gpu = sources["gpu_memory"]
    # Where the sandbox's simulated GPUs answer (the nvidia-smi TEST DOUBLE), the scripted engine holds none of them:
    # read, 0 MiB, never a new high; elsewhere not read at all.
    assert (gpu["read"] is False and gpu["value"] is None) or (gpu["read"] is True and gpu["value"] == 0), gpu
    return read


def startup_hang_is_stalled_and_rolls_back(host: EngineHost, runs: list, engine: str) -> None:
    """A start that hangs after the front end's own start-up lines, logging only vLLM's "No available shared memory
    broadcast block found" every 2 s (a worker waiting on a stuck peer): no progress, so the deploy fails as stalled
    at the stall timeout, the byte counter named among what did not grow, and the release before serves again.
    Leaves: release 1 serving (a new process)."""
    before, pid = host.state()["current"], main_pid(host, unit(engine))
    stall_s = stall_timeout_for(runs)
    run = deploy(host, runs, f"deploy_{engine}.yml", **stall_vars(
        engine, stall_s, {"SCRIPTED_ENGINE_FAULT": "startup-hang", "SCRIPTED_ENGINE_WARN_S": "2"}))
    assert run.status == "failed", run.stdout[-4000:]
    ok, failed = wait_results(run)[0]
    assert not ok
    assert failed["stalled"] is True, failed["msg"]
    # The hang was reached (the front end had started and its backend said it still waits), not a slow import.
    assert any("No available shared memory broadcast block found in 2 seconds" in line for line in failed["journal"]), \
        failed["journal"]
    assert re.search(rf"stalled: {engine}\.service wrote no journal line and was not ready for \d+\.\d s \(stall "
                     rf"timeout {stall_s} s; last answer: .*?\), nor read bytes, ", failed["msg"]), failed["msg"]
    # The hang read nothing from disk: the stall's verdict names the byte counter engine_wait read, at the value the
    # wait ended with.
    read = byte_source(failed)
    name = "io_stat" if failed["progress"]["sources"]["io_stat"]["read"] else "proc_io"
    assert f"{name}: {read['value']} bytes read, last grew " in failed["msg"], (read, failed["msg"])
    flat = " ".join(run.stdout.split())
    assert_rolled_back(flat, before)
    assert host.state()["current"] == before and host.state()["status"] == "serving"
    assert host.health() == 200 and main_pid(host, unit(engine)) not in (pid, "0")
    print(f"{engine} start-up hang: stalled {failed['silent_s']:.1f} s after its last progress "
          f"(stall timeout {stall_s} s), {failed['elapsed_s']:.1f} s after the wait began")


def slow_load_that_reads_bytes_is_not_rolled_back(host: EngineHost, runs: list, engine: str) -> None:
    """A load that writes no journal line for longer than the stall timeout but keeps reading its file from disk:
    the bytes its process reads are progress, so the start is not stalled and the release serves.
    Leaves: the slow-load release serving."""
    before = host.state()["current"]
    stall_s = stall_timeout_for(runs)
    load_s = stall_s + 5  # the journal stays silent at least this long, longer than the stall timeout
    run = deploy(host, runs, f"deploy_{engine}.yml", **stall_vars(
        engine, stall_s, {"SCRIPTED_ENGINE_FAULT": "slow-load", "SCRIPTED_ENGINE_LOAD_S": str(load_s)}))
    assert run.status == "successful", run.stdout[-4000:]
    ok, ready = wait_results(run)[0]
    assert ok
    read = byte_source(ready)
    # The scenario's precondition: the journal alone would have stalled the start (the scripted load writes nothing
    # for stall_s + 5 s, and engine_wait saw that silence); the only other source read is the bytes its processes read.
    journal = ready["progress"]["sources"]["journal"]
    assert journal["longest_silent_s"] > stall_s, journal
    assert read["value"] > 0, read
    assert ready["stalled"] is False, ready
    assert host.state()["current"] != before and host.state()["status"] == "serving" and host.health() == 200
    print(f"{engine} slow load: ready after {ready['elapsed_s']:.1f} s, the journal silent for "
          f"{journal['longest_silent_s']:.1f} s, at most {ready['progress']['longest_silent_s']:.1f} s without "
          f"progress (stall timeout {stall_s} s), {read['value']} bytes read from disk")
