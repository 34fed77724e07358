"""Every root-level playbook refuses unknown and mistyped inputs before any task runs on the host.

Runs the real entry points (deploy_sglang.yml, ..., site.yml) with ansible-playbook against localhost. The
input check runs on the controller as the first task of every play, so a refusal leaves nothing changed
and no role task started. The same refusals on a serving host, with its MainPID unchanged, are in
tests/integration/test_engine_lifecycle.py.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.playbook_run import PlaybookRun, run_playbook

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINTS = sorted(p.name for p in REPO.glob("*.yml") if "import_playbook: playbooks/" in p.read_text())
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "meta" / "argument_specs.yml").is_file())
SANDBOX_PROFILES = yaml.safe_load((REPO / "inventory" / "sandbox" / "group_vars" / "all" / "models.yml").read_text())[
    "engine_profiles"]
REFUSED = {
    **{f"{role}_bogus": 1 for role in ROLES},
    "sglang_api_kye": "x",
    "engine_profil": "sandbox-tiny",
    "deploy_batch_sise": 2,
    "vllm_ready_timeout_s": "soon",
    # A newline that would start a line of its own in the unit file (tried on a test host before the check: systemd
    # ran the injected ExecStartPre= as root).
    "engine_profile": "x\n[Service]\nExecStartPre=+/bin/touch /tmp/pwned",
    "sglang_extra_environment": {"X": "1\nExecStartPre=+/bin/true"},
    "sglang_api_key": "same-Key-1",
    "sglang_admin_api_key": "same-Key-1",
    # What the engine finally runs with: options the roles' variables own, that drop a guard, or that carry a key.
    "sglang_extra_options": {"host": "0.0.0.0", "tokenizer-worker-num": 2},
    "vllm_extra_options": {"api_key": "x"},
    "vllm_extra_environment": {"VLLM_SERVER_DEV_MODE": "1"},
    "engine_profiles": {**SANDBOX_PROFILES, "guarded": {**SANDBOX_PROFILES["sandbox-tiny"],
                                                        "sglang_options": {"enable-http2": True},
                                                        "vllm_options": {"host": "::"}}},
}
EXPECTED = [
    *(f"unknown variable {role}_bogus: not an option of role {role}" for role in ROLES),
    "unknown variable sglang_api_kye: not an option of role sglang (did you mean sglang_api_key?)",
    "unknown variable engine_profil: not a playbook input (did you mean engine_profile?)",
    "unknown variable deploy_batch_sise: not a playbook input (did you mean deploy_batch_size?)",
    "variable vllm_ready_timeout_s (role vllm): argument 'vllm_ready_timeout_s' is of type str",
    "engine_profile holds control characters (U+000A)",
    "profile name 'x\\n[Service]\\nExecStartPre=+/bin/touch /tmp/pwned' is not a plain name",
    "sglang_extra_environment.X holds control characters (U+000A)",
    "sglang_api_key equals sglang_admin_api_key: sglang needs them to differ",
    "sglang_extra_options.host: host is set by sglang_listen_address, never by an option",
    "sglang_extra_options.tokenizer-worker-num is 2: SGLang adds its API-key and admin-key middleware only in "
    "single-tokenizer mode",
    "vllm_extra_options.api_key is a secret: set vllm_api_key",
    'vllm_extra_environment.VLLM_SERVER_DEV_MODE is "1": vLLM then adds its development routes',
    "profile guarded: sglang_options.enable-http2 is true: SGLang then serves HTTP through Granian",
    "profile guarded: vllm_options.host: host is set by vllm_listen_address, never by an option",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, PlaybookRun]:
    work = tmp_path_factory.mktemp("input-check")
    inventory = work / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "group_vars" / "all").symlink_to(REPO / "inventory" / "sandbox" / "group_vars" / "all")
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_become": False}
    (inventory / "hosts.yml").write_text(
        yaml.safe_dump({"all": {"children": {"gpu_servers": {"hosts": {"localhost": local}}}}}))
    (work / "refused.json").write_text(json.dumps(REFUSED))

    def run(playbook: str) -> PlaybookRun:
        return run_playbook(playbook, inventory, extra_args=["-e", f"@{work / 'refused.json'}"], workdir=work,
                            envvars={"ANSIBLE_LOCAL_TEMP": str(work / "tmp")}, timeout=300)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(ENTRY_POINTS, pool.map(run, ENTRY_POINTS), strict=True))


def test_the_entry_points_are_the_ten_playbooks() -> None:
    assert ENTRY_POINTS == ["deploy_sglang.yml", "deploy_vllm.yml", "fetch_models.yml", "launch.yml",
                            "provision.yml", "rollback.yml", "site.yml", "status.yml", "teardown.yml", "verify.yml"]


@pytest.mark.parametrize("playbook", ENTRY_POINTS)
def test_refused_before_any_task_on_the_host(runs, playbook: str) -> None:
    result = runs[playbook]
    text = " ".join(result.stdout.split())
    assert result.rc == 2, text[-3000:]
    for message in EXPECTED:
        assert message in text, message
    assert "same-Key-1" not in result.stdout, "a key given as a no_log variable is never shown"
    tasks = result.tasks_started
    assert tasks[-1] == "input_check : Inputs | refuse unknown and mistyped variables and invalid model profiles"
    assert set(tasks[:-1]) <= {"Gathering Facts"} | {t for t in tasks if t.startswith("input_check : Validating")}
    assert result.recap("localhost")["failed"] == 1 and result.recap("localhost")["changed"] == 0, text[-2000:]


@pytest.fixture(scope="module")
def unedited(tmp_path_factory) -> dict[str, PlaybookRun]:
    """Each entry point run as the README's first command would be without -i: ansible.cfg's default inventory,
    the example one, whose host is a placeholder that resolves nowhere."""
    work = tmp_path_factory.mktemp("unedited")

    def run(playbook: str) -> PlaybookRun:
        return run_playbook(playbook, workdir=work, envvars={"ANSIBLE_LOCAL_TEMP": str(work / "tmp")}, timeout=300)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(ENTRY_POINTS, pool.map(run, ENTRY_POINTS), strict=True))


@pytest.mark.parametrize("playbook", ENTRY_POINTS)
def test_the_unedited_example_inventory_stops_at_once_naming_it_and_how_to_point_at_ones_own(unedited, playbook):
    result = unedited[playbook]
    text = " ".join(result.stdout.split())
    assert result.rc == 2, text[-3000:]
    example = REPO / "inventory" / "production" / "hosts.yml"
    assert (f"gpu01.example.internal is a placeholder of the example inventory ({example}, the default of "
            "ansible.cfg): run with -i") in text, text[-2000:]
    # That is the one error said: the example's profiles (revisions not pinned) are not the point here.
    assert "1 input error, nothing was changed:" in text and "revision" not in text, text[-2000:]
    assert "Could not resolve hostname" not in text and "UNREACHABLE" not in text, text[-2000:]
    tasks = result.tasks_started
    assert tasks[-1] == "input_check : Inputs | refuse unknown and mistyped variables and invalid model profiles"
