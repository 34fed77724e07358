"""vLLM 0.33.0's REAL front end (tests/scripted_engine/) on a systemd test host: deploy -> verify -> a failed
gate that rolls back -> a start-up hang that stalls and rolls back -> a silent slow load that is not -> teardown,
with the production unit, config and key files (real_engine_host.py)."""

from __future__ import annotations

import json
import re

import pytest

from tests.integration import real_engine_scenario as scenario
from tests.integration.engine_host import podman
from tests.integration.lifecycle_helpers import API_KEY, CONTAINER_MARKS, assert_api_key_nowhere
from tests.integration.real_engine_host import booted_real_engine_host

pytestmark = CONTAINER_MARKS
ENGINE = "vllm"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    # CAP_SYS_PTRACE: engine_wait reads /proc/<pid>/io of the engine's processes as root on a real host can (the
    # host's cgroups give the unit no io.stat); the stall scenarios' slow load shows progress only there.
    yield from booted_real_engine_host(ENGINE, "bws-it-real-vllm", tmp_path_factory.mktemp("real-vllm"),
                                       caps=["SYS_PTRACE"], engine_profile="sandbox-tiny-eagle3")


@pytest.fixture(scope="module")
def runs() -> list:
    return []


def test_deploy_serves_from_the_real_front_end(host, runs):
    scenario.deploy_serves_from_the_real_front_end(host, runs, ENGINE)


def test_the_api_key_reaches_the_api_server_alone_as_its_credential(host, runs):
    """The key is a root-only file of the release that systemd hands the API server (LoadCredential=); it is in no
    process's environment (vLLM's engine core inherits the API server's, the pre-build the unit's), and the gate's
    keyed requests passed, so the release's key guard read it."""
    unit_text = host.sh("cat /etc/systemd/system/vllm.service")
    credential = r"^LoadCredential=api-key:/var/lib/llm-serving/releases/[^/]+/api-key$"
    assert re.search(credential, unit_text, re.MULTILINE), unit_text
    assert "EnvironmentFile=" not in unit_text and "VLLM_API_KEY" not in unit_text
    assert host.sh("find /var/lib/llm-serving/releases -name 'api-key*' -printf '%f %u:%g %m\\n' | sort -u") == \
        "api-key root:root 600"
    seen = json.loads(podman("exec", host.name, "python3", "-c", ENVIRON_SCAN, API_KEY).stdout)
    # Every process of the engine user was read (an unreadable environment would pass any search), the key in none.
    assert seen["engine_processes"] >= 1 and seen["engine_environments_read"] == seen["engine_processes"], seen
    assert seen["holding"] == [], seen


# Run on the host as root: how many processes the engine user runs, and which processes' environments hold the key.
ENVIRON_SCAN = """
import json, os, pwd, sys
key, uid = sys.argv[1].encode(), pwd.getpwnam("vllm").pw_uid
pids = [p for p in os.listdir("/proc") if p.isdigit()]
def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read()
    except OSError:
        return b""
def owner(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1
engine = [p for p in pids if owner(p) == uid]
print(json.dumps({"engine_processes": len(engine),
                  "engine_environments_read": sum(b"CREDENTIALS_DIRECTORY=" in environ(p) for p in engine),
                  "holding": [open(f"/proc/{p}/comm").read().strip() for p in pids if key in environ(p)]}))
"""


def test_verify_passes_with_the_real_parsers(host, runs):
    scenario.verify_passes_with_the_real_parsers(host, runs, ENGINE)


def test_failed_gate_rolls_back(host, runs):
    scenario.failed_gate_rolls_back(host, runs, ENGINE)


def test_a_startup_hang_that_only_says_it_still_waits_is_stalled_and_rolls_back(host, runs):
    scenario.startup_hang_is_stalled_and_rolls_back(host, runs, ENGINE)


def test_a_slow_load_whose_only_progress_is_bytes_read_is_not_rolled_back(host, runs):
    scenario.slow_load_that_reads_bytes_is_not_rolled_back(host, runs, ENGINE)


def test_the_api_key_reaches_no_journal_argv_unit_or_runner_artifact(host, runs):
    """vLLM's key guard reads the key from its credential, never from argv."""
    assert scenario.secret_forms_in_journal(host, ENGINE) == []
    assert_api_key_nowhere(host, runs)


def test_the_controller_keeps_no_secret(host, runs):
    """The API key, and the secrets set for the CI run of verify (scenario.SECRETS), in no form anywhere."""
    assert scenario.secret_forms_the_controller_keeps(host, runs, ENGINE) == []


def test_teardown_stops_the_engine(host, runs):
    scenario.teardown_stops_the_engine(host, runs, ENGINE)
