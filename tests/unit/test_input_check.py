"""The one input check (plugins/action/input_check.py) against the repository's real argument specs and profiles.

The playbook-level proof that it runs before any task on the host is tests/integration/test_input_check_playbooks.py;
the MainPID proof on a serving host is in tests/integration/test_engine_lifecycle.py.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"


def _load_plugin():
    name = "bws_input_check_plugin"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "plugins" / "action" / "input_check.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


ic = _load_plugin()
CATALOG = ic.load_catalog(ROLES)
ROSTER = ic.load_roster()
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if (p / "meta" / "argument_specs.yml").is_file())
PROFILES = {
    inventory: yaml.safe_load((REPO / "inventory" / inventory / "group_vars" / "all" / "models.yml").read_text())[
        "engine_profiles"
    ]
    for inventory in ("production", "sandbox")
}
REVIEWED = "0123456789abcdef0123456789abcdef01234567"  # a commit id, as an edited inventory names one


def pinned(profiles: dict) -> dict:
    """The profiles with each Hub source of a trust_remote_code profile at a commit, as the example asks."""
    profiles = copy.deepcopy(profiles)
    for profile in profiles.values():
        for kind in ("model", "drafter"):
            source = (profile.get(kind) or {}).get("source") or {}
            if profile.get("trust_remote_code") and source.get("type") == "hf":
                source["revision"] = REVIEWED
    return profiles


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


# --- unknown variables --------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_a_bogus_variable_of_every_role_is_refused_naming_it(role: str) -> None:
    messages = ic.unknown_variables([f"{role}_bogus"], CATALOG)
    assert messages == [f"unknown variable {role}_bogus: not an option of role {role}"] or (
        len(messages) == 1 and messages[0].startswith(f"unknown variable {role}_bogus: not an option of role {role}")
    )


def test_a_misspelled_option_names_the_closest_known_one() -> None:
    assert ic.unknown_variables(["sglang_api_kye", "nvidia_driver_brnach"], CATALOG) == [
        "unknown variable nvidia_driver_brnach: not an option of role nvidia_driver"
        " (did you mean nvidia_driver_branch?)",
        "unknown variable sglang_api_kye: not an option of role sglang (did you mean sglang_api_key?)",
    ]


def test_unprefixed_playbook_inputs_are_known_and_their_typos_are_not() -> None:
    inputs = ["engine", "engine_profile", "engine_profiles", "engine_units", "deploy_batch_size",
              "deploy_max_fail_percentage", "model_store_hosts"]
    assert ic.unknown_variables(inputs, CATALOG) == []
    assert ic.unknown_variables(["engine_profil", "deploy_batch_sise", "engine_unit"], CATALOG) == [
        "unknown variable deploy_batch_sise: not a playbook input (did you mean deploy_batch_size?)",
        "unknown variable engine_profil: not a playbook input (did you mean engine_profile?)",
        "unknown variable engine_unit: not a playbook input (did you mean engine_units?)",
    ]


def test_facts_the_roles_set_and_names_outside_our_namespaces_pass() -> None:
    names = ["cuda_toolkit_home", "nvidia_driver_status", "verify_result", "gpu_release_result", "python_env_uv",
             "input_check_result", "ansible_host", "__sglang_flags", "sandbox_test_double_source", "inventory_dir"]
    assert ic.unknown_variables(names, CATALOG) == []


def test_every_option_of_every_spec_is_known() -> None:
    """Options other roles add later are accepted without touching the check: the specs are the source."""
    for role in ROLE_NAMES:
        specs = load(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]
        for entry_point, spec in specs.items():
            if entry_point == "profile":  # profile keys, not variables (input_check and the engine roles)
                continue
            assert ic.unknown_variables(list(spec.get("options", {})), CATALOG) == [], (role, entry_point)


def test_the_catalogue_reads_a_new_option_from_a_spec(tmp_path: Path) -> None:
    role = tmp_path / "roles" / "newrole"
    (role / "meta").mkdir(parents=True)
    (role / "meta" / "argument_specs.yml").write_text(yaml.safe_dump(
        {"argument_specs": {"main": {"options": {"newrole_knob": {"type": "int", "description": "x"}}}}}))
    catalog = ic.load_catalog(tmp_path / "roles")
    assert ic.unknown_variables(["newrole_knob"], catalog) == []
    assert ic.unknown_variables(["newrole_knbo"], catalog) == [
        "unknown variable newrole_knbo: not an option of role newrole (did you mean newrole_knob?)"]
    mistyped = ic.mistyped_variables({"newrole_knob": "many"}, catalog, ROSTER)
    assert mistyped[0].startswith("variable newrole_knob (role newrole)")


# --- mistyped variables -------------------------------------------------------------------------------


def test_a_mistyped_option_is_refused_naming_it() -> None:
    messages = ic.mistyped_variables(
        {"sglang_ready_timeout_s": "soon", "sglang_gate": "always", "vllm_ready_timeout_s": "60", "engine": "tgi"},
        CATALOG, ROSTER)
    assert len(messages) == 3, messages
    assert messages[0].startswith("variable engine (role input_check): value of engine must be one of: sglang, vllm")
    assert messages[1].startswith("variable sglang_gate (role sglang): value of sglang_gate must be one of")
    assert messages[2].startswith("variable sglang_ready_timeout_s (role sglang):") and "int" in messages[2]


def test_a_secret_value_is_not_echoed_in_a_type_error() -> None:
    catalog = ic.Catalog(options={"x_pin": ("x", {"type": "int", "no_log": True, "description": "a secret"})})
    messages = ic.mistyped_variables({"x_pin": "s3cret-value"}, catalog, ROSTER)
    assert len(messages) == 1 and messages[0].startswith("variable x_pin (role x):")
    assert "s3cret-value" not in messages[0] and "********" in messages[0]


# --- model profiles -----------------------------------------------------------------------------------


@pytest.mark.parametrize("inventory", sorted(PROFILES))
def test_the_example_profiles_pass_and_come_back_complete(inventory: str) -> None:
    profiles = pinned(PROFILES[inventory])
    normalized, errors = ic.check_profiles(profiles, CATALOG.profile_schema, ROSTER)
    assert errors == []
    for name, profile in normalized.items():
        assert set(profile) == set(CATALOG.profile_schema), name
        assert profile["tokenizer"] == profiles[name].get("tokenizer") or profile["model"]["path"]
        assert profile["model"]["source"] == profiles[name]["model"]["source"], "source keys kept as given"


def test_the_example_remote_code_profiles_wait_for_a_reviewed_commit() -> None:
    _, errors = ic.check_profiles(PROFILES["production"], CATALOG.profile_schema, ROSTER)
    assert errors == [
        f"profile {name}: trust_remote_code is true, so the Python files of {repo} run on the host, but {kind}.source"
        ".revision is not set (main), not a commit id (a branch or tag can move under the same name): set it to the "
        "40-character commit id whose code you reviewed (the Hub's 'Files and versions' history)"
        for name, kind, repo in [("kimi-k25-int4-eagle3", "model", "moonshotai/Kimi-K2.5"),
                                 ("kimi-k25-int4-eagle3", "drafter", "AQ-MedAI/Kimi-K25-eagle3"),
                                 ("kimi-k25-int4", "model", "moonshotai/Kimi-K2.5")]]


@pytest.mark.parametrize(("revision", "refused"), [("main", True), ("v1.0", True), (REVIEWED.upper(), True),
                                                    (REVIEWED[:12], True), (REVIEWED, False)])
def test_remote_code_from_the_hub_runs_only_at_a_commit(revision: str, refused: bool) -> None:
    profile = _kimi()
    profile["model"]["source"]["revision"] = revision
    _, errors = ic.check_profile("kimi", profile, CATALOG.profile_schema, ROSTER)
    assert bool(errors) is refused, errors
    if refused:
        assert errors == [f"profile kimi: trust_remote_code is true, so the Python files of moonshotai/Kimi-K2.5 "
                          f"run on the host, but model.source.revision is '{revision}', not a commit id (a branch or "
                          "tag can move under the same name): set it to the 40-character commit id whose code you "
                          "reviewed (the Hub's 'Files and versions' history)"]
    # Without remote code, or from a source the operator controls, any revision will do.
    assert ic.check_profile("kimi", profile | {"trust_remote_code": False}, CATALOG.profile_schema, ROSTER)[1] == []
    profile["model"]["source"] = {"type": "http", "url": "https://mirror.internal/kimi"}
    assert ic.check_profile("kimi", profile, CATALOG.profile_schema, ROSTER)[1] == []


def _kimi() -> dict:
    return pinned(PROFILES["production"])["kimi-k25-int4-eagle3"]


def test_an_engine_key_in_a_profiles_options_is_refused_naming_the_variable_to_use() -> None:
    profile = _kimi() | {"sglang_options": {"api-key": "sk-1", "admin-api-key": "adm-2"},
                         "vllm_options": {"api-key": "sk-3"}}
    _, errors = ic.check_profile("kimi", profile, CATALOG.profile_schema, ROSTER)
    tail = "(from a vault) instead; options are kept in the profile, the release metadata and the reports"
    assert errors == [f"profile kimi: sglang_options.api-key is a secret: set sglang_api_key {tail}",
                      f"profile kimi: sglang_options.admin-api-key is a secret: set sglang_admin_api_key {tail}",
                      f"profile kimi: vllm_options.api-key is a secret: set vllm_api_key {tail}"]
    assert not any(value in " ".join(errors) for value in ("sk-1", "adm-2", "sk-3"))


def test_an_engine_key_in_the_option_variables_is_refused_naming_the_variable_to_use() -> None:
    given = {"sglang_extra_options": {"admin-api-key": "adm-2", "log-level": "info"},
             "vllm_extra_options": {"api-key": "sk-3"}, "sglang_default_options": {"enable-metrics": True}}
    tail = "(from a vault) instead; options are kept in the inventory, the release metadata and the reports"
    assert ic.keys_in_options(given, "the inventory", ROSTER) == [
        f"sglang_extra_options.admin-api-key is a secret: set sglang_admin_api_key {tail}",
        f"vllm_extra_options.api-key is a secret: set vllm_api_key {tail}"]


@pytest.mark.parametrize(("admin", "refused"), [("same-Key-1", True), ("", False), ("other-Key-2", False)])
def test_sglang_admin_key_must_not_be_the_api_key(admin: str, refused: bool) -> None:
    errors = ic.same_secrets({"sglang_api_key": "same-Key-1", "sglang_admin_api_key": admin}, ROSTER)
    assert errors == (["sglang_api_key equals sglang_admin_api_key: sglang needs them to differ (one unlocks more "
                       "than the other); leave the second empty where the host makes one, or give it a value of its "
                       "own"] if refused else [])


def test_templated_choices_other_than_the_roster_query_are_refused() -> None:
    assert ic.resolve_choices({"type": "str", "choices": ic.ROSTER_NAMES}, ROSTER)["choices"] == list(ROSTER)
    with pytest.raises(ValueError, match="the only templated choices"):
        ic.resolve_choices({"type": "str", "choices": "{{ ['a'] }}"}, ROSTER)


def test_tensor_parallel_size_eight_as_a_word_is_refused_naming_profile_and_key() -> None:
    profile = _kimi() | {"tensor_parallel_size": "eight"}
    normalized, errors = ic.check_profile("kimi", profile, CATALOG.profile_schema, ROSTER)
    assert normalized is None
    assert len(errors) == 1 and errors[0].startswith("profile kimi: argument 'tensor_parallel_size'")
    assert "int" in errors[0]


def test_a_misspelled_profile_key_is_refused_with_the_closest_key() -> None:
    profile = _kimi()
    profile["tensor_paralel_size"] = profile.pop("tensor_parallel_size")
    profile["speculative"]["num_step"] = profile["speculative"].pop("num_steps")
    _, errors = ic.check_profile("kimi", profile, CATALOG.profile_schema, ROSTER)
    assert "profile kimi: unknown key tensor_paralel_size (did you mean tensor_parallel_size?)" in errors
    assert "profile kimi: unknown key speculative.num_step (did you mean speculative.num_steps?)" in errors
    assert any("missing required arguments: tensor_parallel_size" in e for e in errors), errors


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"port": None}, "port"),
        ({"served_model_name": None}, "served_model_name"),
        ({"drafter": None}, "speculative is set but drafter is null"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be at least 1"),
        ({"port": 70000}, "port must be between 1 and 65535"),
        ({"model": {"path": "models/kimi"}}, "model.path must be absolute"),
        ({"speculative": {"algorithm": "MEDUSA", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}},
         "value of algorithm must be one of: EAGLE, EAGLE3"),
        ({"model": {"path": "/m", "source": {"type": "hf"}}}, "type is hf but all of the following are missing: repo"),
        ({"trust_remote_code": "perhaps"}, "trust_remote_code"),
    ],
)
def test_profile_errors_name_the_profile_and_the_key(change: dict, message: str) -> None:
    profile = _kimi() | change
    profile = {k: v for k, v in profile.items() if v is not None or k in ("drafter",)}
    normalized, errors = ic.check_profile("kimi", profile, CATALOG.profile_schema, ROSTER)
    assert normalized is None
    assert any(e.startswith("profile kimi: ") and message in e for e in errors), errors


def test_a_profile_name_that_is_not_in_the_catalogue_names_the_closest() -> None:
    assert ic.missing_profile("kimi-k25-int4-eagle", PROFILES["production"], "engine_profile") == [
        "engine_profile kimi-k25-int4-eagle is not a profile of engine_profiles (known: kimi-k25-int4, "
        "kimi-k25-int4-eagle3, qwen3-0.6b-smoke); did you mean kimi-k25-int4-eagle3?"]


INJECTED = "x\n[Service]\nExecStartPre=+/bin/touch /tmp/pwned"  # tried on a test host: systemd ran it as root


@pytest.mark.parametrize("name", [INJECTED, "a b", "-x", "kimi/../../etc", "", "k" * 65, "tab\tname"])
def test_a_profile_name_that_is_not_a_plain_name_is_refused_before_anything(name: str) -> None:
    normalized, errors = ic.check_profiles({name: _kimi(), "kimi": _kimi()}, CATALOG.profile_schema, ROSTER)
    assert list(normalized) == ["kimi"]
    assert errors == [f"profile name {name!r} is not a plain name: letters, digits, '.', '_' and '-', at most 64, "
                      "starting with a letter or digit (it names the unit's description, the release and the report "
                      "folders)"]


def test_a_control_character_in_any_string_of_a_profile_is_refused_naming_where() -> None:
    profile = _kimi()
    profile["served_model_name"] = "kimi\r\nExecStartPre=/bin/true"
    profile["model"]["source"] = {**profile["model"]["source"], "revision": "main\x1b[2J"}
    _, errors = ic.check_profiles({"kimi": profile}, CATALOG.profile_schema, ROSTER)
    assert "profile kimi: served_model_name holds control characters (U+000A, U+000D)" in errors
    assert "profile kimi: model.source.revision holds control characters (U+001B)" in errors


def test_control_characters_are_found_in_nested_variables_and_keys() -> None:
    assert ic.control_characters({"A\nB": "1", "ok": ["x", "y\u0085"]}, "sglang_extra_environment") == [
        "sglang_extra_environment key holds control characters (U+000A)",
        "sglang_extra_environment.ok[1] holds control characters (U+0085)"]
    assert ic.control_characters({"PATH": "/usr/bin", "n": 3, "t": True}, "vllm_environment") == []


# --- specs carry the defaults; playbooks run the check first; no default() on profile keys -------------


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_argument_specs_carry_the_values_of_defaults_main(role: str) -> None:
    """ansible-doc -t role shows the spec's default: it must be the value the role really uses."""
    defaults_file = ROLES / role / "defaults" / "main.yml"
    defaults = load(defaults_file) if defaults_file.is_file() else {}
    specs = load(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]
    for entry_point, spec in specs.items():
        if entry_point == "profile":  # profile keys: their defaults are the profile's (input_check fills them in)
            continue
        for name, option in spec.get("options", {}).items():
            if name in defaults:
                assert "default" in option, f"{role} {entry_point}: {name} has no default in the spec"
                assert option["default"] == defaults[name], f"{role} {entry_point}: {name} spec default differs"
                assert not option.get("required"), f"{role}: {name} is required but has a default"
            else:
                assert option.get("required") or "default" not in option or role == "input_check", (
                    f"{role} {entry_point}: {name} has a spec default but none in defaults/main.yml")
    options = {n for spec in specs.values() for n in spec.get("options", {})}
    assert set(defaults) <= options, f"undocumented defaults: {sorted(set(defaults) - options)}"


PLAYBOOKS = sorted((REPO / "playbooks").glob("*.yml"))


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=lambda p: p.name)
def test_every_play_runs_the_input_check_before_anything_else(playbook: Path) -> None:
    for play in load(playbook):
        if "ansible.builtin.import_playbook" in play:
            continue
        first = (play.get("pre_tasks") or [{}])[0]
        assert first.get("ansible.builtin.import_role", {}).get("name") == "input_check", (playbook.name, play["name"])


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=lambda p: p.name)
def test_every_playbook_has_a_root_level_entry_point(playbook: Path) -> None:
    entry = load(REPO / playbook.name)
    assert [p.get("ansible.builtin.import_playbook") for p in entry] == [f"playbooks/{playbook.name}"]


PROFILE_KEY_DEFAULT = re.compile(
    r"\.(model|drafter|tokenizer|served_model_name|tensor_parallel_size|port|context_length|quantization|"
    r"trust_remote_code|speculative|sglang_options|vllm_options|num_steps|eagle_topk|num_draft_tokens|"
    r"sglang_pcie_ipc_allreduce)\s*\|\s*default\(")


def test_no_default_for_a_profile_key_in_roles_or_playbooks() -> None:
    files = sorted(ROLES.rglob("*.yml")) + PLAYBOOKS
    offenders = [f"{f.relative_to(REPO)}:{n}" for f in files for n, line in enumerate(f.read_text().splitlines(), 1)
                 if PROFILE_KEY_DEFAULT.search(line) and "engine_service_verify" not in line]
    assert offenders == []


def test_the_example_inventorys_hosts_are_placeholders_named_with_the_way_out():
    example = yaml.safe_load((REPO / "inventory" / "production" / "hosts.yml").read_text())
    hosts = list(example["all"]["children"]["gpu_servers"]["hosts"])
    assert hosts
    for host in hosts:
        (message,) = ic.placeholder_host(host, "inventory/production/hosts.yml")
        assert message.startswith(f"{host} is a placeholder of the example inventory (inventory/production/hosts.yml")
        assert "-i <your inventory>" in message and "-i inventory/sandbox" in message


@pytest.mark.parametrize("host", ["gpu01.internal", "gpu01.example.com", "node1", "bws-sandbox",
                                  "xgpu01.example.internal"])
def test_other_hosts_are_not_placeholders(host):
    assert ic.placeholder_host(host, None) == []
