"""Engine lifecycle on one booted systemd host: check mode, deploys, engine switches, idempotence,
verify, secrets, teardown, site. The engine is the ENGINE TEST DOUBLE. The fault cases with rollback run
on a host of their own, side by side with these (test_engine_faults.py).

The tests share the host and run in file order; each states the host it leaves behind.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.engine_host import REPO, EngineHost, podman
from tests.integration.lifecycle_helpers import (
    API_KEY,
    CONTAINER_MARKS,
    assert_api_key_nowhere,
    assert_boots,
    booted_engine_host,
    build_profiles,
    deploy,
    inventory_vars,
    main_pid,
    play_failure,
    release,
    what_boots,
)
from tests.integration.real_engine_scenario import secret_forms

pytestmark = CONTAINER_MARKS

@pytest.fixture(scope="module")
def host(tmp_path_factory):
    yield from booted_engine_host("bws-it-engine", tmp_path_factory.mktemp("engine-host"))


@pytest.fixture(scope="module")
def runs() -> list:
    return []


def assert_check_mode_changes_nothing(run) -> None:
    assert run.rc == 0, run.stdout[-3000:]
    assert run.count("changed", "bws-it-engine") == 0, run.stdout[-3000:]
    assert "--- before" not in run.stdout, run.stdout[-3000:]


def test_check_diff_on_a_fresh_host_shows_the_unit_and_skips_start_and_wait(host, runs):
    run = host.run_playbook("playbooks/deploy_sglang.yml", check=True)
    runs.append(run)
    assert run.rc == 0, run.stdout[-3000:]
    assert "ExecStart=/opt/sglang/venv/bin/sglang serve --config /var/lib/llm-serving/releases/sglang-" in run.stdout
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in run.stdout, "the PCIe all-reduce is off unless the profile says so"
    for task in (
        "Activate | stop what serves now and start the release",
        "Activate | wait for readiness and run the post-start gate",
    ):
        results = run.results(f"engine_service : {task}", "bws-it-engine")
        assert [result["_event"] for result in results] == ["runner_on_skipped"], results
    assert host.sh("test -e /etc/systemd/system/sglang.service && echo yes || echo no") == "no"


def test_pcie_ipc_allreduce_setting_reaches_the_unit_environment_and_refuses_a_tp_it_cannot_serve(host, runs):
    """Check mode: the profile switch puts SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 into the unit (the default profile
    leaves it out: previous test); TP 1 is refused."""
    on = host.run_playbook("playbooks/deploy_sglang.yml", check=True,
                           extravars={"engine_profile": "sandbox-pcie-ipc-tp2"})
    runs.append(on)
    assert on.rc == 0, on.stdout[-3000:]
    assert 'Environment="SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1"' in on.stdout
    refused = host.run_playbook("playbooks/deploy_sglang.yml", check=True,
                                extravars={"engine_profile": "sandbox-pcie-ipc-tp1"})
    runs.append(refused)
    assert refused.rc != 0
    assert "serves only a single-node tensor-parallel group of 2, 4 or 8 GPUs" in " ".join(refused.stdout.split())
    assert host.sh("test -e /etc/systemd/system/sglang.service && echo yes || echo no") == "no"


def test_the_preflight_counts_the_gpus_of_the_profiles_layout(host, runs):
    """Check mode: the preflight's GPU count is the layout's (tensor x data, attention groups inside the tensor group),
    said with the layout; vLLM's argv gets the data and expert flags from the profile's keys; a layout wider than the
    host's 8 GPUs stops in the preflight, nothing changed."""
    sglang = host.run_playbook("playbooks/deploy_sglang.yml", check=True,
                               extravars={"engine_profile": "sandbox-attn2-ep2"})
    runs.append(sglang)
    flat = " ".join(sglang.stdout.split())
    assert sglang.rc == 0, play_failure(sglang.stdout)
    assert "the profile needs 2 GPU(s) (tensor 2 x data 1; attention data 2; expert 2)" in flat, flat[-3000:]
    # The memory fit, from the tiny checkpoint's own headers and config on the host (2 layers, float32 zeros).
    assert re.search(r"the profile fits each GPU: weights [\d.]+ MiB \+ KV for one full context [\d.]+ MiB = "
                     r"[\d.]+ MiB against 81\.3 GiB \(0\.85 of 95\.6 GiB\); experts split 2 ways, the rest 1 ways, "
                     r"from \d+ safetensors file\(s\)", flat), flat[-3000:]
    vllm = host.run_playbook("playbooks/deploy_vllm.yml", check=True, extravars={"engine_profile": "sandbox-dp2-ep4"})
    runs.append(vllm)
    flat = " ".join(vllm.stdout.split())
    assert vllm.rc == 0, play_failure(vllm.stdout)
    assert "the profile needs 4 GPU(s) (tensor 2 x data 2; expert 4)" in flat, flat[-3000:]
    assert "against 87.9 GiB (0.92 of 95.6 GiB); experts split 4 ways, the rest 2 ways" in flat, flat[-3000:]
    assert "--tensor-parallel-size 2 --data-parallel-size 2 --enable-expert-parallel --host" in flat, flat[-3000:]
    document = ('"layout": { "attention_data_parallel_size": 1, "data_parallel_size": 2, "expert_parallel_size": 4, '
                '"gpus_per_node": 4, "nnodes": 1, "tensor_parallel_size": 2, "world_size": 4 }')
    assert document in flat.replace("+ ", ""), flat[-3000:]
    wide = host.run_playbook("playbooks/deploy_sglang.yml", check=True, extravars={"engine_profile": "sandbox-tp4-dp4"})
    runs.append(wide)
    flat = " ".join(wide.stdout.split())
    assert wide.rc != 0
    assert "8 GPU(s) with driver" in flat and "the profile needs 16 GPU(s) (tensor 4 x data 4)" in flat, flat[-3000:]
    # A checkpoint that does not fit each GPU's share stops the preflight with the numbers: the tiny model's KV cache
    # for its 8192-token context (4 MiB) against a share of 1 MiB.
    unfit = host.run_playbook("playbooks/deploy_sglang.yml", check=True,
                              extravars={"engine_profile": "sandbox-tiny", "sglang_memory_fit_fraction": 0.00001})
    runs.append(unfit)
    flat = " ".join(unfit.stdout.split())
    assert unfit.rc != 0
    assert re.search(r"memory fit: the profile does NOT fit each GPU: weights 0\.0 MiB \+ KV for one full context "
                     r"4\.0 MiB = 4\.0 MiB against 1\.0 MiB \(1e-05 of 95\.6 GiB\)", flat), flat[-3000:]
    assert host.sh("test -e /etc/systemd/system/sglang.service && echo yes || echo no") == "no"


def test_deploy_sglang_serves(host, runs):
    run = host.run_playbook("deploy_sglang.yml")  # the root-level entry point users type
    runs.append(run)
    assert run.status == "successful", run.stdout[-3000:]
    assert host.unit("sglang.service")["ActiveState"] == "active"
    assert_boots(host, "sglang.service", host.state()["current"])
    assert host.health() == 200
    assert "ENGINE TEST DOUBLE" in run.stdout
    state = host.state()
    assert state["status"] == "serving" and state["previous"] is None
    serving = release(host, state["current"])
    assert serving["engine"] == "sglang" and serving["base_url"] == "http://127.0.0.1:30000"
    assert serving["served_model_name"] == "tiny-sandbox" and serving["tokenizer"] == "/srv/models/sandbox/tiny-model"
    assert serving["trust_remote_code"] is False and serving["speculative"] is True
    assert serving["speculative_num_steps"] == 3
    assert serving["speculative_settings"]["speculative-algorithm"] == "EAGLE3"
    config = host.sh(f"cat /var/lib/llm-serving/releases/{state['current']}/config.yaml")
    assert "NOT checked by SGLang's parser: sglang_argcheck was false" in config
    assert "checked it with the installed SGLang's own parser" not in config
    # SGLang's admin key, made by the host (plugins/modules/host_secret.py), and the plugin that keeps it out of
    # /server_info, found by SGLang through its dist-info directory in the release.
    assert host.sh("stat -c '%U %a %s' /var/lib/llm-serving/sglang-admin-api-key") == "root 600 32"
    assert re.search(r'^admin-api-key: "[A-Za-z0-9_-]{43}"$', config, re.M), config
    dist_info = f"/var/lib/llm-serving/releases/{state['current']}/bws_sglang_guard-1.dist-info"
    assert host.sh(f"stat -c '%U:%G %a' {dist_info}") == "root:sglang 750"
    assert "bws_sglang_guard = bws_sglang_guard:register" in host.sh(f"cat {dist_info}/entry_points.txt")


def test_second_deploy_changes_nothing(host, runs):
    pid = main_pid(host)
    run = deploy(host, runs, "deploy_sglang.yml")
    assert run.status == "successful", run.stdout[-3000:]
    assert run.count("changed", host.name) == 0, run.stdout[-3000:]
    assert main_pid(host) == pid


def test_tags_switch_still_runs_the_preflight_and_the_gate(host, runs):
    pid = main_pid(host)
    run = host.run_playbook("deploy_sglang.yml", tags="switch")
    runs.append(run)
    assert run.status == "successful", run.stdout[-3000:]
    assert run.count("changed", host.name) == 0
    for task in ("engine_service : Preflight | passed", "verify : Check the answer"):
        assert task in run.tasks_started, f"--tags switch must still run {task}"
    assert main_pid(host) == pid


def test_a_tag_selection_that_skips_the_gate_is_refused_before_any_switch(host, runs):
    pid, state = main_pid(host), host.state()
    run = host.run_playbook("deploy_sglang.yml", extravars={"engine_profile": "sandbox-tiny"}, skip_tags="gate")
    runs.append(run)
    assert run.rc != 0
    assert "Refusing to switch bws-it-engine: the tag selection" in " ".join(run.stdout.split())
    assert main_pid(host) == pid and host.health() == 200
    assert host.state() == state


def _profiles_with(name: str, **changes) -> dict:
    profiles = build_profiles()
    profiles[name].update(changes)
    return profiles


ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "meta" / "argument_specs.yml").is_file())
# Each is refused by the input check (plugins/action/input_check.py) that every play runs first. Every
# root-level playbook refuses the same inputs on localhost in tests/integration/test_input_check_playbooks.py.
INJECTED_NAME = "x\n[Service]\nExecStartPre=+/bin/touch /tmp/pwned"
REFUSED_INPUTS = {
    "misspelled api key": (
        {"sglang_api_kye": "x"},
        ["unknown variable sglang_api_kye: not an option of role sglang (did you mean sglang_api_key?)"],
    ),
    "misspelled profile key": (
        {"engine_profiles": _profiles_with("sandbox-tiny-eagle3", trust_remote_cod=True)},
        ["profile sandbox-tiny-eagle3: unknown key trust_remote_cod (did you mean trust_remote_code?)"],
    ),
    "tensor parallel size as a word": (
        {"engine_profiles": _profiles_with("sandbox-tiny-eagle3", tensor_parallel_size="eight")},
        ["profile sandbox-tiny-eagle3: argument 'tensor_parallel_size' is of type str"],
    ),
    # Tried on a test host before the check existed: the name reached the unit's header and Description= as lines
    # of their own, and systemd ran the injected ExecStartPre= as root.
    "a profile name with a newline": (
        {"engine_profile": INJECTED_NAME, "engine_profiles": {INJECTED_NAME: build_profiles()["sandbox-tiny-eagle3"]}},
        ["is not a plain name: letters, digits, '.', '_' and '-'", "engine_profile holds control characters (U+000A)"],
    ),
    "a bogus variable of every role": (
        {f"{role}_bogus": 1 for role in ROLES},
        [f"unknown variable {role}_bogus: not an option of role {role}" for role in ROLES],
    ),
}


@pytest.mark.parametrize("case", REFUSED_INPUTS)
def test_refused_input_fails_before_any_change_and_the_engine_keeps_serving(host, runs, case):
    extravars, messages = REFUSED_INPUTS[case]
    pid = main_pid(host)
    run = host.run_playbook("deploy_sglang.yml", extravars=extravars)  # the root-level entry point
    runs.append(run)
    text = " ".join(run.stdout.split())
    assert run.rc != 0
    for message in messages:
        assert message in text, text[-3000:]
    assert run.count("changed", host.name) == 0
    assert not [task for task in run.tasks_started if task.startswith("sglang :")], "no task of the deploy may run"
    assert main_pid(host) == pid
    assert host.health() == 200
    assert host.sh("ls /tmp/pwned 2>/dev/null || true") == ""  # the injected ExecStartPre= never ran


def test_an_address_other_than_loopback_without_a_key_is_refused_before_any_change(host, runs):
    pid = main_pid(host)
    run = host.run_playbook("deploy_sglang.yml", check=True,
                            extravars={"sglang_listen_address": "0.0.0.0", "sglang_api_key": ""})
    runs.append(run)
    assert run.rc != 0
    assert "sglang would bind 0.0.0.0 but sglang_api_key is empty" in " ".join(run.stdout.split())
    # Refused by engine_service's guards, the first of its tasks the engine role runs: nothing else of it, no venv.
    assert not [task for task in run.tasks_started if task.startswith(("python_env :", "engine_service :"))
                and "Guards |" not in task and "arg spec 'guards'" not in task], run.tasks_started
    assert main_pid(host) == pid and host.health() == 200


def test_check_diff_on_the_serving_sglang_host_changes_nothing(host, runs):
    pid = main_pid(host)
    run = host.run_playbook("playbooks/deploy_sglang.yml", check=True)
    runs.append(run)
    assert_check_mode_changes_nothing(run)
    assert main_pid(host) == pid


def test_check_diff_of_a_changed_profile_value_shows_the_line_and_the_switch_and_no_key(host, runs):
    """--check --diff with one flag changed: the engine config's changed line against the serving release, keys
    masked; which unit would stop and which would start; no key anywhere in the output or the runner's artifacts."""
    pid = main_pid(host)
    serving = host.state()["current"]
    admin_key = host.sh(f"sed -n 's/^admin-api-key: //p' /var/lib/llm-serving/releases/{serving}/config.yaml")
    assert len(admin_key) > 8  # the host made one (the JSON-quoted value)
    profiles = build_profiles()
    profiles["sandbox-tiny-eagle3"]["sglang_options"] = {
        **profiles["sandbox-tiny-eagle3"]["sglang_options"], "mem-fraction-static": 0.8}
    run = host.run_playbook("playbooks/deploy_sglang.yml", check=True, extravars={"engine_profiles": profiles})
    runs.append(run)
    assert run.rc == 0, run.stdout[-3000:]
    out = run.stdout
    assert f"--- before: /var/lib/llm-serving/releases/{serving}/config.yaml (serving)" in out, out[-4000:]
    assert "+mem-fraction-static: 0.8" in out, out[-4000:]
    switch = " ".join(out.split())
    assert re.search(rf"Check mode, nothing is changed: the deploy would switch {host.name}: stop sglang\.service; "
                     rf"start sglang\.service from release sglang-\w+ \(current in state\.json: {serving}\)", switch)
    for secret in (API_KEY, admin_key.strip('"')):
        assert secret not in out
        for artifact in Path(run.artifact_dir).rglob("*"):
            assert not artifact.is_file() or secret not in artifact.read_text(errors="replace"), artifact
    assert main_pid(host) == pid and host.state()["current"] == serving


VERIFY_INPUTS = "engine_service : Verify release | what verify is given (from the release document)"
# What the deploy's gate gave verify (test_deploy_vllm_replaces_sglang), compared with what verify.yml gives it.
GATE_INPUTS: dict = {}


def verify_inputs(run) -> dict:
    return run.result(VERIFY_INPUTS)["ansible_facts"]["__engine_service_verify_inputs"]


def test_deploy_vllm_replaces_sglang(host, runs):
    run = deploy(host, runs, "deploy_vllm.yml")
    assert run.status == "successful", run.stdout[-3000:]
    GATE_INPUTS.update(verify_inputs(run))
    assert host.unit("vllm.service")["ActiveState"] == "active"
    assert_boots(host, "vllm.service", host.state()["current"])
    assert host.unit("sglang.service")["ActiveState"] == "inactive"
    assert host.health() == 200


def test_check_diff_on_the_serving_vllm_host_changes_nothing(host, runs):
    pid = main_pid(host, "vllm.service")
    run = host.run_playbook("playbooks/deploy_vllm.yml", check=True)
    runs.append(run)
    assert_check_mode_changes_nothing(run)
    assert main_pid(host, "vllm.service") == pid


def test_verify_without_extra_vars_verifies_the_vllm_that_serves(host, runs):
    host.sh("install -m 0666 /dev/null /tmp/bench-client-double-runs.log")  # the double says who ran it
    run = host.run_playbook("playbooks/verify.yml")
    runs.append(run)
    assert run.status == "successful", run.stdout[-3000:]
    # The client (it loads the model's tokenizer) ran as the engine unit's user, in its own scratch directory.
    clients = host.sh("cat /tmp/bench-client-double-runs.log; rm -f /tmp/bench-client-double-runs.log").splitlines()
    assert clients and all(re.fullmatch(r"vllm user=vllm home=/var/lib/vllm cwd=/tmp/verify-bench\.\w+", line)
                           for line in clients), clients
    current = host.state()["current"]
    assert current.startswith("vllm-")
    assert re.search(rf"bws-it-engine serves vllm \S+ release {current} \(profile sandbox-tiny-eagle3\)",
                     " ".join(run.stdout.split())), run.stdout[-3000:]
    reports = sorted((host.workdir / "reports" / "bws-it-engine").glob("*/report.json"))
    report = json.loads(reports[-1].read_text())
    assert report["engine"] == "vllm" and report["speculative"] is True, report
    assert "speculation is not running" not in run.stdout
    # One entry into verify: the gate gave it the release document it had just written, verify.yml the one state.json
    # names; both are the same release's, so verify saw the same inputs on both paths.
    assert GATE_INPUTS, "the deploy's gate ran the verify entry"
    assert verify_inputs(run) == GATE_INPUTS
    assert GATE_INPUTS["release"] == current and GATE_INPUTS["engine"] == "vllm"
    assert GATE_INPUTS["bench"] == release(host, current)["bench"] and GATE_INPUTS["bench"]["module"], GATE_INPUTS


def test_an_engine_role_that_produces_a_wrong_type_fails_before_the_switch_naming_the_key(host, runs):
    """The release document is checked against its schema before anything is written: an engine role whose facts
    hold a key of the wrong type (here given as the role's whole engine_service_release_facts) fails the deploy there,
    naming the key, and what serves keeps serving."""
    current = host.state()["current"]
    document = release(host, current)
    facts = {key: document[key] for key in ("venv", "executable", "served_model_name", "speculative", "tokenizer",
                                             "trust_remote_code", "speculative_num_steps", "speculative_settings",
                                             "model_paths", "max_running_requests", "bench", "engine_facts")}
    pid, state = main_pid(host, "vllm.service"), host.sh("cat /var/lib/llm-serving/state.json")
    run = host.run_playbook("deploy_vllm.yml", extravars={
        "engine_service_release_facts": {**facts, "tensor_parallel_size": "one", "port_number": 1}})
    runs.append(run)
    flat = " ".join(run.stdout.split()).replace("''", "'")  # the error is printed as a YAML single-quoted string
    assert run.status == "failed"
    assert "tensor_parallel_size must be an integer, got string 'one'" in flat, flat[-3000:]
    assert "port_number is not a key of the release document (schema 1; an engine's own facts go under " \
           "engine_facts)" in flat
    started = run.tasks_started
    assert "engine_service : Release | the release document has the schema's shape" in started
    assert not [task for task in started if "Switch |" in task or "Release | write the release" in task], started
    assert main_pid(host, "vllm.service") == pid and host.sh("cat /var/lib/llm-serving/state.json") == state
    assert host.health() == 200


def test_a_release_document_of_an_older_deploy_is_read_with_the_stated_defaults(host, runs):
    """release.json as a deploy before the schema field wrote it (no schema, gate, bench or engine_facts): verify.yml
    reads it with the defaults docs/release-document.md states and its smoke passes; its benchmark is refused (no
    recipe: redeploy); one that lacks a required key is refused naming it. The file is put back byte for byte."""
    current = host.state()["current"]
    path = f"/var/lib/llm-serving/releases/{current}/release.json"
    original = host.sh(f"base64 -w0 {path}")
    document = release(host, current)
    old = {key: value for key, value in document.items() if key not in ("schema", "gate", "bench", "engine_facts")}
    old.update(document["engine_facts"])

    def write(content: dict) -> None:
        host.sh(f"printf %s {shlex.quote(json.dumps(content))} > {path}")

    try:
        write(old)
        smoke = host.run_playbook("playbooks/verify.yml", extravars={"verify_mode": "smoke"})
        runs.append(smoke)
        assert smoke.status == "successful", smoke.stdout[-3000:]
        seen = verify_inputs(smoke)
        assert seen["bench"] == {} and seen["release"] == current and seen["tokenizer"] == document["tokenizer"]
        full = host.run_playbook("playbooks/verify.yml")
        runs.append(full)
        assert full.status == "failed"
        assert "verify_bench_recipe gives no recipe (module, workloads)" in " ".join(full.stdout.split())
        write({key: value for key, value in old.items() if key != "tokenizer"})
        broken = host.run_playbook("playbooks/verify.yml", extravars={"verify_mode": "smoke"})
        runs.append(broken)
        flat = " ".join(broken.stdout.split()).replace("''", "'")
        assert broken.status == "failed" and f"{path}: tokenizer is missing" in flat, flat[-3000:]
        assert "docs/release-document.md" in flat
    finally:
        host.sh(f"echo {original} | base64 -d > {path}")
    assert host.sh(f"base64 -w0 {path}") == original


def test_verify_does_not_run_the_client_as_root(host, runs):
    """A unit without User= (the engine runs as root): the benchmark client would load the model's files as root."""
    host.sh("install -m 0666 /dev/null /tmp/bench-client-double-runs.log")
    run = host.run_playbook("playbooks/verify.yml", extravars={"verify_unit": "systemd-journald.service"})
    runs.append(run)
    assert run.status == "failed", run.stdout[-3000:]
    refusal = ("systemd-journald.service runs as root (no User= in its unit), and the benchmark client loads the "
               "model's tokenizer (its files): verify does not run it as root.")
    assert refusal in " ".join(run.stdout.split()), run.stdout[-3000:]
    assert host.sh("cat /tmp/bench-client-double-runs.log; rm -f /tmp/bench-client-double-runs.log") == ""


def test_check_diff_of_verify_changes_nothing(host, runs):
    run = host.run_playbook("playbooks/verify.yml", check=True)
    runs.append(run)
    assert_check_mode_changes_nothing(run)


def test_check_diff_where_sglang_would_replace_vllm_shows_it_and_vllm_keeps_serving(host, runs):
    pid = main_pid(host, "vllm.service")
    run = host.run_playbook("playbooks/deploy_sglang.yml", check=True)
    runs.append(run)
    assert run.rc == 0, run.stdout[-3000:]
    assert run.count("changed", host.name) > 0
    # The SGLang release is already on the host (deployed before vLLM): the diff is state.json's switch.
    assert "--- before: /var/lib/llm-serving/state.json" in run.stdout, run.stdout[-3000:]
    assert '-    "current": "vllm-' in run.stdout and '+    "current": "sglang-' in run.stdout, run.stdout[-3000:]
    assert main_pid(host, "vllm.service") == pid and host.unit("sglang.service")["ActiveState"] == "inactive"


def test_deploy_sglang_again_leaves_exactly_one_engine(host, runs):
    run = deploy(host, runs, "deploy_sglang.yml")
    assert run.status == "successful", run.stdout[-3000:]
    assert host.unit("sglang.service")["ActiveState"] == "active"
    assert host.unit("vllm.service")["ActiveState"] == "inactive"
    assert_boots(host, "sglang.service", host.state()["current"])
    state = host.state()
    assert state["current"].startswith("sglang-") and state["previous"].startswith("vllm-")


def test_the_api_key_is_in_no_argv_unit_journal_or_runner_artifact(host, runs):
    assert_api_key_nowhere(host, runs)
    config = host.sh("ls /var/lib/llm-serving/releases/sglang-*/config.yaml | head -1")
    assert host.sh(f"stat -c '%U:%G %a' {config}") == "root:sglang 640"
    unauthenticated = host.sh(
        "python3 -c \"import urllib.request as u, urllib.error as e\ntry: u.urlopen('http://127.0.0.1:30000/v1/models')"
        '\nexcept e.HTTPError as x: print(x.code)"'
    )
    assert unauthenticated == "401"


def test_check_diff_of_teardown_on_a_serving_host_shows_the_state_change_and_stops_nothing(host, runs):
    pid = main_pid(host)
    run = host.run_playbook("playbooks/teardown.yml", check=True)
    assert run.rc == 0, run.stdout[-3000:]
    assert '+    "status": "stopped"' in run.stdout and '-    "status": "serving"' in run.stdout, run.stdout[-3000:]
    assert main_pid(host) == pid and host.health() == 200


HANDMADE_SESSION = "user.slice/user-1000.slice/session-99.scope"


def start_in_handmade_session(host: EngineHost, title: str) -> str:
    """An engine-titled process of the sglang user in a hand-made login-session cgroup; its PID."""
    script = (
        "P=$(sed -n 's/^[0-9]*:name=systemd://p' /proc/self/cgroup); B=/sys/fs/cgroup/systemd; "
        '[ -d "$B$P" ] && B="$B$P"; '
        f'D="$B/{HANDMADE_SESSION}"; mkdir -p "$D" && echo $$ > "$D/cgroup.procs" && '
        "exec setpriv --reuid=sglang --regid=sglang --init-groups python3 -c "
        f"\"import os; os.execv('/usr/bin/python3', ['{title}', '-c', 'import time; time.sleep(600)'])\""
    )
    podman("exec", "-d", host.name, "sh", "-c", script)
    return host.sh(f"for i in $(seq 50); do pgrep -f '^{title}' && exit 0; sleep 0.1; done")


def test_teardown_stops_everything_and_a_second_teardown_changes_nothing(host, runs):
    engine_pids = host.sh("pgrep -u sglang -d ' ' .")
    assert engine_pids, "the engine serves before the teardown"
    session = start_in_handmade_session(host, "sglang::handmade_TP0")
    current = host.state()["current"]
    run = host.run_playbook("playbooks/teardown.yml", {"teardown_confirm": "yes"})
    assert run.status == "successful", run.stdout[-3000:]
    for unit in ("sglang.service", "vllm.service"):
        assert host.unit(unit)["ActiveState"] == "inactive"
        assert host.unit(unit)["UnitFileState"] == "disabled"
    # The boot unit stays; state.json says stopped, so it starts nothing.
    assert what_boots(host)["unit"] is None and what_boots(host)["why"] == "state.json: stopped (teardown)"
    # the unit's processes are gone; the hand-made session's engine look-alike lives and is named
    assert host.sh(f"pgrep -u sglang -d ' ' . | tr ' ' '\\n' | grep -vx {session} || true") == ""
    assert host.sh(f"kill -0 {session} && echo alive") == "alive"
    assert f"foreign, not signalled: {session} sglang::handmade_TP0" in run.stdout
    assert "in a user session (" in run.stdout and HANDMADE_SESSION in run.stdout
    host.sh(f"kill {session}")
    assert host.state()["status"] == "stopped" and host.state()["current"] == current
    # One summary per host: the role's own is off, the teardown summary names the release it stopped.
    gpu_summary = run.results("gpu_release : Summary of the GPU release", "bws-it-engine")
    assert [result["_event"] for result in gpu_summary] == ["runner_on_skipped"], gpu_summary
    summary = run.result("Teardown | summary", "bws-it-engine")["msg"]
    flat = " ".join((summary if isinstance(summary, str) else " ".join(summary)).split())
    assert f"release {current} (sglang, profile sandbox-tiny-eagle3) is recorded as stopped" in flat, flat
    check = host.run_playbook("playbooks/teardown.yml", check=True)
    assert_check_mode_changes_nothing(check)
    again = host.run_playbook("playbooks/teardown.yml", {"teardown_confirm": "yes"})
    assert again.status == "successful"
    assert again.count("changed", host.name) == 0, again.stdout[-3000:]


# Secrets of the controller's environment during the CI run: a Hub token (passed to the play: the model store's
# default token), a variable named with --redact-env (passed), and a CI token (not named: never passed).
CI_SECRETS = {"HF_TOKEN": "hf_LifecycleFakeToken0001xyz", "DEPLOY_SECRET": "deploy-secret-Lifecycle-0002",
              "GITHUB_TOKEN": "ghp_LifecycleFakeCiToken0003"}


def test_site_with_engine_vllm_in_the_inventory_deploys_and_verifies_vllm_and_ci_reports_it(host, tmp_path):
    host.write_inventory(inventory_vars(host, engine="vllm"))
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/ci_playbook.py"), "playbooks/site.yml", "-i", str(host.inventory),
         "--artifacts", str(tmp_path), "--ident", "site", "--skip-tags", "provision", "--redact-env", "DEPLOY_SECRET"],
        capture_output=True, text=True, check=False, cwd=REPO, env={**os.environ, **CI_SECRETS},
    )
    assert result.returncode == 0, result.stdout[-4000:]
    # Nothing the run keeps holds a secret, in any form; the CI token never reached the play, the others did.
    kept = [path for path in tmp_path.rglob("*") if path.is_file()]
    hits = [f"{path.relative_to(tmp_path)}: {name} ({form})" for path in kept for name, value in
            {**CI_SECRETS, "API key": API_KEY}.items() for form, text in secret_forms(value).items()
            if text in path.read_text(errors="replace")]
    assert hits == [] and len(kept) > 20, hits
    recorded_env = json.loads((tmp_path / "site" / "command").read_text())["env"]
    assert "GITHUB_TOKEN" not in recorded_env
    assert recorded_env["HF_TOKEN"] == recorded_env["DEPLOY_SECRET"] == "********"
    assert host.unit("vllm.service")["ActiveState"] == "active"
    assert host.unit("sglang.service")["ActiveState"] == "inactive"
    assert host.state()["current"].startswith("vllm-") and host.state()["status"] == "serving"
    summary = json.loads((tmp_path / "site" / "summary.json").read_text())
    report_dir = Path(summary["hosts"]["bws-it-engine"]["verify_report"])
    # with the run's artifacts, not where the inventory puts verify reports
    assert report_dir.parent == tmp_path / "site" / "reports" / "bws-it-engine", summary
    assert json.loads((report_dir / "report.json").read_text())["engine"] == "vllm"
