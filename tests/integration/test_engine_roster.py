"""A third engine is an entry of the engine roster, its role and nothing else.

In a scratch copy of the checkout the test adds a fake engine, `fakeinfer`, to meta/engines.yml and writes its role
(roles/fakeinfer: an argument spec with a variable and a profile key of its own, and tasks that run the verify role's
input validation for it). No other file of the copy changes. Then the real entry point launch.yml, with
`-e engine=fakeinfer` against localhost, gets through the input check (the engine choice, the role's variable and
its profile key are known; a mistyped variable of the role is refused naming the role) into the fake role, where the
engine-neutral verify role accepts the engine and takes its readiness bound from the roster. The same run against
a copy without the roster entry is refused by the input check before anything runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.playbook_run import PlaybookRun, run_playbook

REPO = Path(__file__).resolve().parents[2]
ENGINE = "fakeinfer"
ROSTER_ENTRY = {
    "role": ENGINE, "playbook": "launch.yml", "unit": f"{ENGINE}.service", "service_user": ENGINE,
    "process_patterns": [f"{ENGINE}::*", f"{ENGINE} serve"], "shm_patterns": [f"{ENGINE}_shm_*"],
    "env_prefixes": ["FAKEINFER_"],
    "secret_flags": ["api-key"], "reserved_flags": {"port": "the profile's port"}, "distinct_secrets": [],
    "nodes_group_variable": "", "readiness_timeout_s": 123,
    "generating_routes": ["/v1/chat/completions"], "reasoning_field": "reasoning", "server_info": False,
    "unguarded_route_hint": "", "drain_program": "",
    "metrics": {"prefix": f"{ENGINE}:", "acceptance": "draft_counters", "generation_tokens": f"{ENGINE}:gen_total",
                "drafts": f"{ENGINE}:drafts_total", "draft_tokens": f"{ENGINE}:draft_tokens_total",
                "accepted_tokens": f"{ENGINE}:accepted_total"},
}
ROLE_FILES = {
    "meta/argument_specs.yml": {"argument_specs": {
        "main": {"short_description": "A fake engine of the roster test", "options": {
            "fakeinfer_greeting": {"type": "str", "default": "hello", "description": "What the role says."}}},
        "profile": {"short_description": "The fake engine's profile keys", "options": {
            "fakeinfer_options": {"type": "dict", "default": {}, "description": "Its flags."}}}}},
    "defaults/main.yml": {"fakeinfer_greeting": "hello"},
    "tasks/main.yml": [
        {"name": "Fake engine | reached", "ansible.builtin.debug": {
            "msg": "FAKEINFER ROLE REACHED {{ fakeinfer_greeting }} profile={{ engine_profile }}"}},
        {"name": "Fake engine | the verify role's input validation accepts it",
         "ansible.builtin.include_role": {"name": "verify", "tasks_from": "validate"},
         "vars": {"verify_engine": ENGINE, "verify_mode": "smoke", "verify_base_url": "http://127.0.0.1:1",
                  "verify_served_model_name": "fake"}},
        {"name": "Fake engine | what verify takes from the roster", "ansible.builtin.debug": {
            "msg": "READINESS {{ lookup('blackwell.serving.engine_roster')[engine].readiness_timeout_s }} "
                   "UNITS {{ query('blackwell.serving.engine_roster', 'unit') | join(',') }}"}},
    ],
}


def tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            check=True, capture_output=True, text=True).stdout
    return [path for path in listed.split("\0") if (path and (REPO / path).exists()) or (REPO / path).is_symlink()]


def scratch_copy(destination: Path) -> Path:
    """The checkout's files as they are now (links kept as links: the collection link points at the copy)."""
    for relative in tracked_files():
        source, target = REPO / relative, destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, target)
    return destination


def add_engine(copy: Path) -> None:
    roster_file = copy / "meta" / "engines.yml"
    roster = yaml.safe_load(roster_file.read_text())
    roster["engines"][ENGINE] = ROSTER_ENTRY
    roster_file.write_text("---\n" + yaml.safe_dump(roster, sort_keys=False))
    for relative, content in ROLE_FILES.items():
        path = copy / "roles" / ENGINE / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("---\n" + yaml.safe_dump(content, sort_keys=False))


def changed_files(copy: Path) -> list[str]:
    """Paths of the copy that differ from the checkout or are new there."""
    changed = []
    for path in sorted(p for p in copy.rglob("*") if p.is_file() and not p.is_symlink()):
        relative = path.relative_to(copy)
        original = REPO / relative
        if not original.is_file() or original.read_bytes() != path.read_bytes():
            changed.append(str(relative))
    return changed


def launch(copy: Path, work: Path, *extra: str) -> PlaybookRun:
    inventory = work / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_become": False}
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_servers": {"hosts": {"localhost": local}}}}}))
    profiles = yaml.safe_load((REPO / "inventory" / "sandbox" / "group_vars" / "all" / "models.yml").read_text())
    profile = {key: value for key, value in profiles["engine_profiles"]["sandbox-tiny"].items()
               if not key.endswith("_options")} | {"fakeinfer_options": {"some-flag": 1}}
    extra_vars = work / "vars.yml"
    extra_vars.write_text(yaml.safe_dump({"engine": ENGINE, "engine_profile": "fake",
                                          "engine_profiles": {"fake": profile}, "fakeinfer_greeting": "hi"}))
    return run_playbook("launch.yml", inventory, extra_args=["-e", f"@{extra_vars}", "-e", "ansible_become=false",
                                                             *extra],
                        project_dir=copy, workdir=work, timeout=300,
                        envvars={"ANSIBLE_LOCAL_TEMP": str(work / "tmp"), "ANSIBLE_BECOME": "false"})


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("roster")
    with_engine = scratch_copy(root / "with")
    add_engine(with_engine)
    without = scratch_copy(root / "without")
    return {"with": with_engine, "without": without, "work": root}


def test_only_the_roster_and_the_new_role_change(copies) -> None:
    changed = changed_files(copies["with"])
    assert changed and all(path == "meta/engines.yml" or path.startswith(f"roles/{ENGINE}/") for path in changed), \
        changed
    assert changed_files(copies["without"]) == []


def test_a_deploy_path_reaches_the_new_engine_role(copies, tmp_path) -> None:
    result = launch(copies["with"], tmp_path)
    out = " ".join(result.stdout.split())
    assert result.rc == 0, out[-3000:]
    assert "FAKEINFER ROLE REACHED hi profile=fake" in out
    assert "verify : Verify inputs are consistent" in out, "the engine-neutral role's checks ran for it"
    assert f"READINESS 123 UNITS sglang.service,vllm.service,{ENGINE}.service" in out
    tasks = result.tasks_started
    assert tasks.index("Deploy the engine with its role (the engine roster's `role`)") < tasks.index(
        f"{ENGINE} : Fake engine | reached")


def test_the_new_role_prefix_is_checked_like_the_others(copies, tmp_path) -> None:
    result = launch(copies["with"], tmp_path, "-e", "fakeinfer_greting=x")
    out = " ".join(result.stdout.split())
    assert result.rc == 2, out[-3000:]
    assert ("unknown variable fakeinfer_greting: not an option of role fakeinfer (did you mean fakeinfer_greeting?)"
            in out)
    assert "FAKEINFER ROLE REACHED" not in out


def test_without_the_roster_entry_the_engine_is_refused_before_anything_runs(copies, tmp_path) -> None:
    result = launch(copies["without"], tmp_path)
    out = " ".join(result.stdout.split())
    assert result.rc == 2, out[-3000:]
    assert f"value of engine must be one of: sglang, vllm, got: {ENGINE}" in out, out[-3000:]
    assert "FAKEINFER ROLE REACHED" not in out
    tasks = result.tasks_started
    assert all(task.startswith("input_check : ") for task in tasks), tasks
