"""Beyond one host, on three booted systemd hosts: a rolling deploy that stops at a failing host, the
CI entry's summary of it, and SGLang multi-node arguments, start order and rank-0 readiness.
The engine is the ENGINE TEST DOUBLE. Tests share the hosts and run in file order.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest
import yaml

from tests.integration.engine_host import REPO, EngineHost, podman_available
from tests.integration.real_engine_scenario import host_made_secrets

pytestmark = [
    pytest.mark.container,
    pytest.mark.skipif(not podman_available(), reason="needs podman and the test-host image (scripts/build-image.sh)"),
]

HOSTS = ["bws-it-fleet1", "bws-it-fleet2", "bws-it-fleet3"]
STATE = "/var/lib/llm-serving/state.json"
PAIR = HOSTS[:2]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    hosts = EngineHost(HOSTS[0], tmp_path_factory.mktemp("fleet"), fleet=HOSTS, groups={"kimi_pair": PAIR})
    hosts.write_inventory({"engine_profile": "sandbox-tiny"})
    hosts.boot_prepared()
    yield hosts
    hosts.destroy()


def release(fleet: EngineHost, host: str) -> str:
    return json.loads(fleet.on(host).sh("cat /var/lib/llm-serving/state.json"))["current"]


def ci_playbook(fleet: EngineHost, playbook: str, artifacts, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts/ci_playbook.py"), playbook, "-i", str(fleet.inventory),
         "--artifacts", str(artifacts), "--ident", "run", *extra],
        capture_output=True, text=True, check=False, cwd=REPO,
    )


def test_first_rollout_serves_everywhere(fleet):
    run = fleet.run_playbook("playbooks/deploy_sglang.yml", extravars={"deploy_batch_size": 3})
    assert run.status == "successful", run.stdout[-3000:]
    assert all(fleet.on(h).health() == 200 for h in HOSTS)


def test_rollout_stops_at_a_failing_host_which_is_rolled_back(fleet, tmp_path):
    before = {h: release(fleet, h) for h in HOSTS}
    fleet.write_inventory({"engine_profile": "sandbox-tiny"},
                          host_vars={HOSTS[1]: {"sglang_extra_environment": {"ENGINE_DOUBLE_FAULT": "crash-at-start"}}})
    result = ci_playbook(fleet, "playbooks/deploy_sglang.yml", tmp_path,
                         "-e", 'sglang_extra_options={"log-level": "warning"}', "-e", "deploy_batch_size=1")
    assert result.returncode == 1, result.stdout[-3000:]
    after = {h: release(fleet, h) for h in HOSTS}
    assert after[HOSTS[0]] != before[HOSTS[0]], "host 1 serves the new release"
    assert after[HOSTS[1]] == before[HOSTS[1]], "host 2 was rolled back to its previous release"
    assert after[HOSTS[2]] == before[HOSTS[2]], "host 3 was not touched"
    assert fleet.on(HOSTS[2]).sh("ls /var/lib/llm-serving/releases | wc -l") == "1"
    assert all(fleet.on(h).health() == 200 for h in HOSTS)

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    hosts = summary["hosts"]
    assert summary["status"] == "failed"
    assert hosts[HOSTS[0]]["status"] == "ok" and hosts[HOSTS[0]]["changed"] > 0
    assert hosts[HOSTS[1]]["status"] == "failed" and hosts[HOSTS[1]]["rescued"] == 1
    assert "Rolled back" in hosts[HOSTS[1]]["failed_tasks"][-1]["msg"]
    assert hosts[HOSTS[2]]["status"] == "not reached"
    junit = ET.parse(tmp_path / "run" / "junit.xml").getroot()
    assert (junit.get("tests"), junit.get("failures"), junit.get("skipped")) == ("3", "1", "1")
    assert f"{HOSTS[1]}: failed" in result.stdout and f"{HOSTS[2]}: not reached" in result.stdout


def test_status_says_what_serves_on_each_host_and_which_could_not_be_read(fleet, tmp_path):
    """After the failed rollout (host 1: the new release, then switched to vLLM; host 2: rolled back, its failed
    release named; host 3: untouched, then torn down), with a fourth inventory host whose state.json was cut in the
    middle of a write (host 3's container, a state directory of its own) and a fifth that does not exist:
    status.yml through the CI entry prints a line per host and the fleet's, changes nothing, writes the report the
    hosts agree with, holds no secret, and fails naming the two it could not read."""
    gone, cut = "bws-it-fleet-gone", "bws-it-fleet-cut"
    cut_dir = "/var/lib/llm-serving-cut"
    inventory = tmp_path / "inventory"
    shutil.copytree(fleet.inventory, inventory)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    members = hosts["all"]["children"]["gpu_servers"]["hosts"]
    members[gone] = dict(members[HOSTS[0]])
    members[cut] = {**members[HOSTS[2]], "ansible_host": HOSTS[2], "engine_service_state_dir": cut_dir}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    switched = fleet.run_playbook("playbooks/deploy_vllm.yml", limit=HOSTS[0])
    assert switched.status == "successful", switched.stdout[-3000:]
    stopped = fleet.run_playbook("playbooks/teardown.yml", {"teardown_confirm": "yes"}, limit=HOSTS[2])
    assert stopped.status == "successful", stopped.stdout[-3000:]
    serving = {h: release(fleet, h) for h in HOSTS}
    engines = {HOSTS[0]: "vllm", HOSTS[1]: "sglang"}
    third = fleet.on(HOSTS[2])
    third.sh(f"cp -a /var/lib/llm-serving {cut_dir} && head -c 20 /var/lib/llm-serving/state.json"
             f" > {cut_dir}/state.json")
    try:
        result = subprocess.run(
            [sys.executable, str(REPO / "scripts/ci_playbook.py"), "status.yml", "-i", str(inventory),
             "--artifacts", str(tmp_path / "artifacts"), "--ident", "run"],
            capture_output=True, text=True, check=False, cwd=REPO)
    finally:
        third.sh(f"rm -rf {cut_dir}")
    # The play's own output is in the run's artifacts (ansible-runner's stdout file); the CI entry streams task lines.
    printed = [path.read_text(errors="replace") for path in (tmp_path / "artifacts" / "run").rglob("stdout")]
    out = " ".join(" ".join(printed).split())
    assert result.returncode != 0, result.stdout[-3000:]
    for host in HOSTS[:2]:
        assert re.search(rf"{host}: {engines[host]} {serving[host]} serving since \S+, /health 200 in \d+ ms", out), \
            out[-3000:]
    assert re.search(rf"{HOSTS[2]}: sglang {serving[HOSTS[2]]} stopped, ", out), out[-3000:]
    assert f"{cut}: state unreadable: state.json is not valid JSON" in out, out[-3000:]
    assert f"{gone}: did not answer" in out, out[-3000:]
    unreadable = ", ".join(sorted([cut, gone]))
    assert f"5 host(s): 2 serving, 1 stopped; did not answer or state unreadable: {unreadable};" in out, out[-3000:]
    report = json.loads((tmp_path / "artifacts" / "run" / "reports" / "status.json").read_text())
    assert report["broken"] == sorted([cut, gone])
    assert report["hosts"][HOSTS[2]]["state"] == "stopped" and report["hosts"][HOSTS[2]]["boot"]["release"] is None
    for host in HOSTS[:2]:
        assert report["hosts"][host]["release_id"] == serving[host]
        assert report["hosts"][host]["engine"] == engines[host]
        assert report["hosts"][host]["boot"]["release"] == serving[host] and report["hosts"][host]["boot"]["enabled"]
        # The deploy's gate left its verdict on the host (written after the gate passed; no secret in it).
        verdict = report["hosts"][host]["verdict"]
        assert (verdict["release"], verdict["kind"], verdict["mode"], verdict["passed"]) == (
            serving[host], "gate", "smoke", True), verdict
        assert report["hosts"][host]["rollback"] == json.loads(fleet.on(host).sh(f"cat {STATE}"))["previous"]
    failed = json.loads(fleet.on(HOSTS[1]).sh(f"cat {STATE}")).get("failed")
    assert failed and report["hosts"][HOSTS[1]]["failed_release"] == failed
    summary = json.loads((tmp_path / "artifacts" / "run" / "summary.json").read_text())
    assert all(entry.get("changed", 0) == 0 for entry in summary["hosts"].values()), summary["hosts"]
    secrets = [value for host in HOSTS for value in host_made_secrets(fleet.on(host), "sglang").values()]
    leaked = [str(path) for path in (tmp_path / "artifacts").rglob("*") if path.is_file()
              and any(secret in path.read_text(errors="replace") for secret in secrets)]
    assert leaked == [] and not any(secret in result.stdout for secret in secrets)


def test_teardown_of_the_fleet(fleet):
    """Then status.yml says every host stopped, with the release a deploy or rollback would come back to."""
    fleet.write_inventory({"engine_profile": "sandbox-tiny"})
    run = fleet.run_playbook("playbooks/teardown.yml", {"teardown_confirm": "yes"})
    assert run.status == "successful", run.stdout[-3000:]
    assert all(fleet.on(h).unit(unit)["ActiveState"] == "inactive"
               for h in HOSTS for unit in ("sglang.service", "vllm.service"))
    status = fleet.run_playbook("status.yml")
    assert status.status == "successful" and sum(status.count("changed", h) for h in HOSTS) == 0, status.stdout[-3000:]
    for host in HOSTS:
        line = status.result("Status | one line per host", host)["msg"]
        stopped = release(fleet, host)  # host 1 serves vLLM since the status test, the others SGLang
        assert line.startswith(f"{host}: {stopped.split('-')[0]} {stopped} stopped"), line
    assert status.result("Status | the fleet in one line")["msg"].startswith("3 host(s): 3 stopped;")


def test_multi_node_arguments_start_order_and_rank0_readiness(fleet):
    # A tensor parallel group of 2 over the pair: one GPU on each node (the preflight and the proof count per node).
    profiles = yaml.safe_load((REPO / "inventory" / "sandbox" / "group_vars" / "all" / "models.yml").read_text())[
        "engine_profiles"]
    profiles["sandbox-tiny-pair"] = {**profiles["sandbox-tiny"], "tensor_parallel_size": 2}
    fleet.write_inventory({"engine_profile": "sandbox-tiny-pair", "engine_profiles": profiles,
                           "sglang_nodes_group": "kimi_pair"})
    # serial is computed before inventory variables exist: the batch size is an extra variable.
    run = fleet.run_playbook("playbooks/deploy_sglang.yml", extravars={"deploy_batch_size": 2}, limit="kimi_pair")
    assert run.status == "successful", run.stdout[-3000:]
    for rank, host in enumerate(PAIR):
        config = fleet.on(host).sh("cat $(ls -t /var/lib/llm-serving/releases/sglang-*/config.yaml | head -1)")
        assert "nnodes: 2" in config
        assert f"node-rank: {rank}" in config
        assert f'dist-init-addr: "{PAIR[0]}:5000"' in config
        assert 'tp-size: "2"' in config or "tp-size: 2" in config, config
    started = {h: int(fleet.on(h).sh("systemctl show -p ActiveEnterTimestampMonotonic --value sglang.service"))
               for h in PAIR}
    assert started[PAIR[1]] < started[PAIR[0]], "the worker (rank 1) starts before rank 0"
    gated_hosts = {event["event_data"]["host"] for event in run.task_events
                   if event["event_data"].get("role") == "verify" and event["event"] == "runner_on_ok"}
    assert PAIR[0] in gated_hosts and PAIR[1] not in gated_hosts
    assert fleet.on(HOSTS[2]).unit("sglang.service")["ActiveState"] == "inactive"


def test_teardown_stops_all_nodes_together(fleet):
    # Load on rank 0 as a balancer sends it: a 10 s request every second until /health answers 503 (the drain
    # began). Rank 0's stop then lasts seconds (see the next test); stopped together, the worker's would begin in it.
    client = ("import json, threading, time, urllib.request as u\n"
              "body = json.dumps({'model': 'tiny-sandbox', 'prompt': 'go', 'max_tokens': 4000}).encode()\n"
              "one = lambda: u.urlopen(u.Request('http://127.0.0.1:30000/v1/completions', data=body, "
              "headers={'Content-Type': 'application/json'}), timeout=60).read()\n"
              "while True:\n"
              "    try: u.urlopen('http://127.0.0.1:30000/health', timeout=30)\n"
              "    except Exception: break\n"
              "    threading.Thread(target=one, daemon=False).start()\n"
              "    time.sleep(1)\n")
    subprocess.run(["podman", "exec", "-d", PAIR[0], "python3", "-c", client], check=True)
    time.sleep(2)
    run = fleet.run_playbook("playbooks/teardown.yml", {"teardown_confirm": "yes"})
    assert run.status == "successful", run.stdout[-3000:]
    assert all(fleet.on(h).unit("sglang.service")["ActiveState"] == "inactive" for h in PAIR)


def test_multi_node_teardown_stopped_rank0_before_the_worker(fleet):
    """SGLang's ranks > 0 wait for rank 0 on SIGTERM: the teardown (test before) stopped rank 0 first, although rank 0
    drained its requests for seconds (stopped together, the worker's stop would begin during that). Both hosts share
    the kernel's monotonic clock, so the units' timestamps compare across them."""
    stops = {h: {p: int(fleet.on(h).sh(f"systemctl show -p {p} --value sglang.service"))
                 for p in ("ActiveExitTimestampMonotonic", "InactiveEnterTimestampMonotonic")} for h in PAIR}
    assert all(stops[h]["InactiveEnterTimestampMonotonic"] > 0 for h in PAIR), stops
    assert stops[PAIR[0]]["InactiveEnterTimestampMonotonic"] <= stops[PAIR[1]]["ActiveExitTimestampMonotonic"], (
        f"rank 0 ({PAIR[0]}) had stopped before the worker's ({PAIR[1]}) stop began: {stops}")
