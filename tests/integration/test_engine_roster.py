"""A third engine is an entry of the engine roster, its role and nothing else.

In a scratch copy of the checkout the test adds a fake engine, `fakeinfer`, to meta/engines.yml and writes its role
(roles/fakeinfer: an argument spec with a variable, a no_log API key and a profile key of its own, a drain entry point,
and tasks that run the verify role's input validation and engine_service's drain step for it). Its roster entry
declares a drain and an acceptance scheme of its own (accepted tokens per verify step, which neither engine has). No
other file of the copy changes. Then the real entry point launch.yml, with `-e engine=fakeinfer` against localhost,
gets through the input check (the engine choice, the role's variable and its profile key are known; a mistyped
variable of the role is refused naming the role) into the fake role, where the engine-neutral verify role accepts the
engine and takes its readiness bound from the roster, and engine_service's drain step runs the fake engine's own drain.
The copy's verify report computes acceptance by the fake engine's scheme. Run through scripts/ci_playbook.py as CI runs
it, the fake engine's API key (printed by its role) is in no artifact: the key is found through its role's no_log
option. The same run against a copy without the roster entry is refused by the input check before anything runs.
"""

from __future__ import annotations

import json
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
    "secret_flags": ["api-key"], "reserved_flags": {"port": "the profile's port"}, "flag_aliases": {},
    "layout": {"expert_parallel": "divides_tensor", "attention_data_parallel": "unsupported",
               "data_with_attention_data": False, "upstream": "fakeinfer/parallel.py"},
    "api_key_variable": f"{ENGINE}_api_key", "distinct_secrets": [],
    "nodes_group_variable": "", "readiness_timeout_s": 123,
    "generating_routes": ["/v1/chat/completions"], "admin_routes": [], "reasoning_field": "reasoning",
    "server_info": False, "server_info_layout": {}, "key_guard_hint": "", "unguarded_route_hint": "",
    # Its own drain (roles/fakeinfer/tasks/drain.yml) and its own acceptance scheme: accepted tokens per verify step.
    "drain": True,
    "metrics": {"prefix": f"{ENGINE}:",
                "counters": {"generation_tokens": f"{ENGINE}:gen_total", "steps": f"{ENGINE}:verify_steps_total",
                             "accepted": f"{ENGINE}:accepted_total"},
                "acceptance": {"length": {"ratio": ["accepted", "steps"], "plus": 1}, "rate": "per_step"}},
}
SECRET = "fk-Secret-Of-The-Fake-Engine-7c21"
ROLE_FILES = {
    "meta/argument_specs.yml": {"argument_specs": {
        "main": {"short_description": "A fake engine of the roster test", "options": {
            "fakeinfer_greeting": {"type": "str", "default": "hello", "description": "What the role says."},
            "fakeinfer_api_key": {"type": "str", "default": "", "no_log": True, "description": "Its API key."}}},
        "drain": {"short_description": "The fake engine's drain", "options": {
            "engine_service_drain_unit": {"type": "str", "required": True, "description": "The unit."},
            "engine_service_drain_timeout_s": {"type": "int", "required": True, "description": "The bound."}}},
        "profile": {"short_description": "The fake engine's profile keys", "options": {
            "fakeinfer_options": {"type": "dict", "default": {}, "description": "Its flags."}}}}},
    "defaults/main.yml": {"fakeinfer_greeting": "hello", "fakeinfer_api_key": ""},
    "tasks/drain.yml": [
        {"name": "Fake engine | its own drain", "ansible.builtin.debug": {
            "msg": "FAKEINFER DRAIN {{ engine_service_drain_unit }} within {{ engine_service_drain_timeout_s }} s"}},
    ],
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
        {"name": "Fake engine | engine_service's drain step, with its unit among those that run",
         "ansible.builtin.include_role": {"name": "engine_service", "tasks_from": "drain"},
         "vars": {"engine_service_drain_units": [f"{ENGINE}.service", "unknown.service"],
                  "engine_service_drain_timeout_s": 7}},
        # A role that shows its key: what CI keeps must not hold it (ci_playbook.py scrubs the no_log options).
        {"name": "Fake engine | a key in the output", "ansible.builtin.debug": {
            "msg": "FAKEINFER KEY [{{ fakeinfer_api_key }}]"}},
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
    # engine_service's drain step ran the fake engine's own drain, for its unit only, with the bound it was given.
    assert out.count("FAKEINFER DRAIN") == 1 and f"FAKEINFER DRAIN {ENGINE}.service within 7 s" in out
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


def test_acceptance_is_measured_by_the_new_engines_own_scheme(copies) -> None:
    """The copy's acceptance code (module_utils/engine/metrics.py, which the verify report calls with the roster entry's
    metrics, roles/verify/tasks/report.yml) computes the fake engine's accept length and rate by its declaration:
    1 + Δaccepted / Δsteps, and the rate through the 3 draft tokens of a step."""
    program = """
import json
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import load_roster
from ansible_collections.blackwell.serving.plugins.module_utils.engine import metrics
counters = load_roster()["fakeinfer"]["metrics"]
before = {"fakeinfer:verify_steps_total": 10, "fakeinfer:accepted_total": 5, "fakeinfer:gen_total": 1}
after = {"fakeinfer:verify_steps_total": 110, "fakeinfer:accepted_total": 205, "fakeinfer:gen_total": 900}
result = metrics.window_acceptance("fakeinfer", counters, before, after, num_draft_tokens=4)
print(json.dumps({**result.as_dict(), "formula": metrics.describe_acceptance(counters)}))
"""
    env = {**os.environ, "PYTHONPATH": str(copies["with"] / "collections")}
    done = subprocess.run([sys.executable, "-c", program], cwd=copies["work"], env=env, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["length"] == pytest.approx(3.0) and result["rate"] == pytest.approx(2 / 3), result
    assert result["detail"] == {"accepted": 200.0, "steps": 100.0, "num_draft_tokens": 4.0}
    assert result["formula"].startswith("length = 1 + Δaccepted / Δverify_steps, rate = (length − 1)")


def test_ci_keeps_the_new_engines_key_out_of_its_artifacts(copies, tmp_path) -> None:
    """launch.yml for the fake engine through the copy's scripts/ci_playbook.py, its API key in a vars file: the role
    prints it, and no file ci_playbook.py keeps holds it (the key is found through the role's no_log option)."""
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_become": False}
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_servers": {"hosts": {"localhost": local}}}}}))
    profiles = yaml.safe_load((REPO / "inventory" / "sandbox" / "group_vars" / "all" / "models.yml").read_text())
    profile = {key: value for key, value in profiles["engine_profiles"]["sandbox-tiny"].items()
               if not key.endswith("_options")}
    secrets = tmp_path / "secrets.yml"
    secrets.write_text(yaml.safe_dump({"engine": ENGINE, "engine_profile": "fake", "engine_profiles": {"fake": profile},
                                       f"{ENGINE}_api_key": SECRET}))
    artifacts = tmp_path / "artifacts"
    done = subprocess.run([sys.executable, str(copies["with"] / "scripts" / "ci_playbook.py"), "launch.yml", "-i",
                           str(inventory), "--artifacts", str(artifacts), "--ident", "run", "--extra-vars-file",
                           str(secrets), "-e", "ansible_become=false"],
                          capture_output=True, text=True, check=False, cwd=tmp_path, timeout=300,
                          env={**os.environ, "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_BECOME": "false"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    kept = [path for path in artifacts.rglob("*") if path.is_file()]
    assert any("FAKEINFER KEY [" in path.read_text(errors="replace") for path in kept), "the role printed its key"
    holding = [str(path.relative_to(artifacts)) for path in kept if SECRET in path.read_text(errors="replace")]
    assert holding == [], f"the fake engine's key is in {holding}"
    assert SECRET not in done.stdout + done.stderr

