"""Thin slice on a real systemd host: the unit deploy_sglang.yml wrote serves, and teardown.yml ends it.

Tests run in file order; the teardown test comes last because it stops what the others look at.
"""

import json
import os
import re
from pathlib import Path

import testinfra.utils.ansible_runner

from tests import playbook_run  # the repository root is on the path (pyproject.toml: pythonpath)
from tests.playbook_run import PlaybookRun

INVENTORY_FILE = os.environ["MOLECULE_INVENTORY_FILE"]
INVENTORY_DIR = str(Path(INVENTORY_FILE).parent)
REPO = Path(__file__).resolve().parents[3]
# testinfra's native podman backend: one `podman exec` per command instead of one Ansible run.
HOSTS = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY_FILE).get_hosts("gpu_servers")
testinfra_hosts = ["podman://" + name for name in HOSTS]
# What the playbook runs take from Molecule's environment: the toolchain, the configuration and the hosts'
# connection plugin (molecule.yml).
PLAYBOOK_ENV = ("PATH", "ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_CONNECTION_PLUGINS")

HEALTH = ("python3 -c \"import urllib.request as u; "
          "print(u.urlopen('http://127.0.0.1:30000/health', timeout=10).status)\"")


def run_playbook(name: str, *, check: bool = False) -> PlaybookRun:
    """A playbook of the repository against the scenario's inventory (tests/playbook_run.py)."""
    return playbook_run.run_playbook(
        f"playbooks/{name}", INVENTORY_DIR, check=check, diff=check, timeout=600,
        envvars={name: os.environ[name] for name in PLAYBOOK_ENV if name in os.environ},
    )


def recap_counts(run: PlaybookRun) -> dict[str, int]:
    """The recap of the scenario's host (one host: the sum over hosts is its recap)."""
    return {key: sum(run.recap(host)[key] for host in HOSTS) for key in ("ok", "changed", "failed")}


def test_01_unit_is_active_and_is_what_the_boot_unit_starts(host):
    service = host.service("sglang.service")
    assert service.is_running
    # No engine unit is enabled: the boot unit is, and starts the release state.json names.
    assert not service.is_enabled
    assert host.run("systemctl is-enabled vllm.service").stdout.strip() != "enabled"  # vLLM was never deployed here
    assert host.service("llm-serving-boot.service").is_enabled
    choice = json.loads(host.check_output(
        "/usr/bin/python3 -I /usr/local/libexec/llm-serving/engine_boot.py --dry-run"))
    state = json.loads(host.file("/var/lib/llm-serving/state.json").content_string)
    assert choice["unit"] == "sglang.service" and choice["release"] == state["current"], choice


def test_02_health_answers_200(host):
    assert host.check_output(HEALTH) == "200"


def test_03_unit_is_exec_hardened_and_bounded(host):
    unit = host.file("/etc/systemd/system/sglang.service")
    assert unit.user == "root" and unit.mode == 0o644
    text = unit.content_string
    for line in ("Type=exec", "KillMode=mixed", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "PrivateTmp=yes", "RemoveIPC=yes", "LimitMEMLOCK=infinity", "User=sglang",
                 "Conflicts=vllm.service", "Restart=on-failure"):
        assert line in text.splitlines(), line
    unit_section = text.split("[Service]")[0]
    assert "StartLimitBurst=" in unit_section and "StartLimitIntervalSec=" in unit_section
    assert re.search(r"^ExecStart=/opt/sglang/venv/bin/sglang serve --config /var/lib/llm-serving/releases/"
                     r"sglang-[0-9a-f]{12}/config.yaml$", text, re.M)


def test_04_engine_runs_as_the_service_user(host):
    main_pid = host.check_output("systemctl show -p MainPID --value sglang.service")
    assert host.check_output(f"ps -o user= -p {main_pid}") == "sglang"


def test_05_config_is_readable_by_root_and_the_service_group_only(host):
    config = host.check_output("ls /var/lib/llm-serving/releases/sglang-*/config.yaml")
    file = host.file(config)
    assert (file.user, file.group, file.mode) == ("root", "sglang", 0o640)
    assert "speculative-algorithm: \"EAGLE3\"" in file.content_string
    assert "tp-size: 1" in file.content_string


def test_05_sglang_logs_through_the_release_logging_configuration(host):
    """SGLang logs its server_args (api_key included) on start: the release's logging.json, on the unit's
    SGLANG_LOGGING_CONFIG_PATH, filters it with the module beside it on PYTHONPATH."""
    text = host.file("/etc/systemd/system/sglang.service").content_string
    release = re.search(r'^Environment="PYTHONPATH=(/var/lib/llm-serving/releases/sglang-[0-9a-f]{12})"$', text, re.M)
    assert release, text
    assert f'Environment="SGLANG_LOGGING_CONFIG_PATH={release.group(1)}/logging.json"' in text.splitlines()
    config = json.loads(host.file(f"{release.group(1)}/logging.json").content_string)
    assert config["filters"]["redact_api_keys"]["()"] == "bws_sglang_logging.RedactApiKeys"
    assert host.file(f"{release.group(1)}/bws_sglang_logging.py").exists


def test_06_state_records_the_serving_release(host):
    state = host.file("/var/lib/llm-serving/state.json").content_string
    assert re.search(r'"current": "sglang-[0-9a-f]{12}"', state)


def test_07_check_diff_on_a_deployed_host_changes_nothing(host):
    # `host` keeps this test in the host-parametrised group, so it runs before the teardown test.
    assert host.service("sglang.service").is_running
    result = run_playbook("deploy_sglang.yml", check=True)
    assert result.rc == 0, result.stdout[-3000:]
    assert recap_counts(result)["changed"] == 0, result.stdout[-3000:]
    assert "--- before" not in result.stdout


def test_99_teardown_leaves_the_unit_inactive_and_disabled(host):
    result = run_playbook("teardown.yml")
    assert result.rc == 0, result.stdout[-3000:]
    service = host.service("sglang.service")
    assert not service.is_running
    assert not service.is_enabled
    assert host.run(HEALTH).rc != 0
    # state.json says stopped: the boot unit starts nothing.
    choice = json.loads(host.check_output(
        "/usr/bin/python3 -I /usr/local/libexec/llm-serving/engine_boot.py --dry-run"))
    assert choice["unit"] is None, choice
