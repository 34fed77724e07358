"""The engine roles refuse what takes a guard away however the variables reach them, not only at the playbooks'
input check (which reads the host's variables): a play's ``vars:`` calling the role by its full name, with no input
check before it, meets the same refusal inside the role (roles/engine_service/tasks/guards.yml on the effective flags
and environment), before the role changes anything.

Runs the real roles with ansible-playbook against localhost (local connection), in check mode so that a guard that
failed to refuse could not change this machine either; the refusal comes before any task that reaches the host.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.playbook_run import PlaybookRun, local_inventory, run_playbook

REPO = Path(__file__).resolve().parents[2]
GUARD_TASK = ("engine_service : Guards | the engine keeps its address, port and remote-code setting, takes no guard "
              "away, and serves beyond loopback only with a key")
CASES = {
    "sglang-tokenizer-workers": ("sglang", {"sglang_extra_options": {"tokenizer-worker-num": 2}},
                                 "sglang's effective flag tokenizer-worker-num is 2: SGLang adds its API-key and "
                                 "admin-key middleware only in single-tokenizer mode"),
    "sglang-remote-code": ("sglang", {"sglang_default_options": {"trust_remote_code": True}},
                           "sglang would get trust_remote_code True after the options are merged, not False (the "
                           "profile's trust_remote_code)"),
    "sglang-loopback-lookalike": ("sglang", {"sglang_listen_address": "127.0.0.1.nip.io"},
                                  "sglang would bind 127.0.0.1.nip.io but sglang_api_key is empty"),
    "vllm-dev-routes": ("vllm", {"vllm_extra_environment": {"VLLM_SERVER_DEV_MODE": "1"}},
                        "vllm's environment VLLM_SERVER_DEV_MODE is \"1\": vLLM then adds its development routes"),
    "vllm-remote-code": ("vllm", {"vllm_extra_options": {"trust-remote-code": True}},
                         "vllm would get trust-remote-code True after the options are merged, not False"),
    # SGLang's `ep` is its ep-size: an option in any spelling must not widen the experts past the profile's layout,
    # which the GPU count, the proof and the release document read.
    "sglang-expert-alias": ("sglang", {"sglang_extra_options": {"ep": 2}},
                            "sglang would get ep 2 after the options are merged, not 1 (the profile's "
                            "expert_parallel_size)"),
}
TINY = yaml.safe_load((REPO / "inventory" / "sandbox" / "group_vars" / "all" / "models.yml").read_text())[
    "engine_profiles"]["sandbox-tiny"]
PROFILE_TASK = "vllm : Read the profile as the one profile schema checks it (roles/input_check, entry point profile)"
# A layout the serving engine has not: refused by the engine's own rule at the role's first check of its profile.
PROFILE_CASES = {
    "vllm-attention-groups": ("vllm", {"engine_profiles": {"attn": {**TINY, "tensor_parallel_size": 2,
                                                                   "attention_data_parallel_size": 2}},
                                       "vllm_profile": "attn"},
                              "profile attn on vllm: attention_data_parallel_size 2: vllm has no attention data "
                              "parallelism inside a tensor parallel group"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, PlaybookRun]:
    work = tmp_path_factory.mktemp("role-guards")
    inventory = work / "inventory"
    local_inventory(inventory / "hosts.json", host_vars={"engine_profile": "sandbox-tiny"})
    (inventory / "group_vars").mkdir()
    (inventory / "group_vars" / "all").symlink_to(REPO / "inventory" / "sandbox" / "group_vars" / "all")

    def run(case: str) -> PlaybookRun:
        engine, play_vars, _ = {**CASES, **PROFILE_CASES}[case]
        playbook = work / f"{case}.yml"
        playbook.write_text(yaml.safe_dump([{
            "name": f"Call the {engine} role directly, its inputs in the play's vars",
            "hosts": "gpu_servers", "gather_facts": False, "vars": play_vars,
            "tasks": [{"name": "The engine role",
                       "ansible.builtin.include_role": {"name": f"blackwell.serving.{engine}"}}],
        }], sort_keys=False))
        return run_playbook(playbook, inventory, check=True, workdir=work, timeout=300,
                            envvars={"ANSIBLE_LOCAL_TEMP": str(work / "tmp")})

    cases = [*CASES, *PROFILE_CASES]
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(cases, pool.map(run, cases), strict=True))


def assert_refused_at(result: PlaybookRun, said: str, task: str) -> None:
    """The play failed at `task` (role-qualified), saying `said`, with nothing changed and no other task failed."""
    text = " ".join(result.stdout.split())
    assert result.rc == 2, text[-3000:]
    assert said in text, text[-3000:]
    assert result.tasks_started[-1] == task, result.tasks_started
    assert result.recap("localhost")["failed"] == 1 and result.recap("localhost")["changed"] == 0, text[-2000:]
    failed = [r for r in result.task_events_results() if r["_event"] == "runner_on_failed"]
    assert [r["_task"] for r in failed] == [task.split(" : ", 1)[1]], json.dumps(failed)[:2000]


@pytest.mark.parametrize("case", CASES)
def test_the_role_refuses_what_its_play_vars_bring_before_it_changes_anything(runs, case: str) -> None:
    assert_refused_at(runs[case], CASES[case][2], GUARD_TASK)


@pytest.mark.parametrize("case", PROFILE_CASES)
def test_a_layout_the_engine_has_not_is_refused_at_the_roles_first_check(runs, case: str) -> None:
    assert_refused_at(runs[case], PROFILE_CASES[case][2], PROFILE_TASK)
