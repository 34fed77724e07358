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
from ansible_collections.blackwell.serving.plugins.plugin_utils import engine_inputs as ei

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
              "deploy_max_fail_percentage", "model_store_hosts", "teardown_confirm"]
    assert ic.unknown_variables(inputs, CATALOG) == []
    assert ic.unknown_variables(["engine_profil", "deploy_batch_sise", "engine_unit", "teardown_confrim"], CATALOG) == [
        "unknown variable deploy_batch_sise: not a playbook input (did you mean deploy_batch_size?)",
        "unknown variable engine_profil: not a playbook input (did you mean engine_profile?)",
        "unknown variable engine_unit: not a playbook input (did you mean engine_units?)",
        "unknown variable teardown_confrim: not a playbook input (did you mean teardown_confirm?)",
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
        for name in PROFILES["production"] if PROFILES["production"][name]["trust_remote_code"]
        for kind, repo in [(kind, PROFILES["production"][name][kind]["source"]["repo"]) for kind in ("model", "drafter")
                           if PROFILES["production"][name][kind]]]
    assert len(errors) == 9  # 7 Kimi profiles, 2 of them with a drafter


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
        "kimi-k25-int4-attndp2-ep8, kimi-k25-int4-eagle3, kimi-k25-int4-ep8, kimi-k25-int4-ep8-eagle3, kimi-k25-nvfp4, "
        "kimi-k25-nvfp4-ep8, qwen3-0.6b-smoke); did you mean kimi-k25-int4-eagle3?"]


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
                 if PROFILE_KEY_DEFAULT.search(line)]
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


# --- the effective configuration: option keys, reserved and guarded flags, the engines' environment ------------

INPUTS = ic.default_engine_inputs(ROSTER)
GUARDS = {engine: yaml.safe_load((ROLES / entry["role"] / "files" / "guarded_inputs.yml").read_text())
          for engine, entry in ROSTER.items()}


def _refusals(options: dict) -> list[str]:
    """A profile's errors with `options` (engine name -> its options) in place of its own."""
    profile = _kimi() | {f"{engine}_options": value for engine, value in options.items()}
    return ic.check_profile("kimi", profile, CATALOG.profile_schema, ROSTER, INPUTS)[1]


@pytest.mark.parametrize(("options", "message"), [
    ({"sglang": {"host": "0.0.0.0"}},
     "profile kimi: sglang_options.host: host is set by sglang_listen_address, never by an option (the unit, the "
     "no-key refusal off loopback and verify read that): set it there"),
    ({"sglang": {"port": 30001}},
     "profile kimi: sglang_options.port: port is set by the profile's port, never by an option"),
    ({"vllm": {"host": "::"}},
     "profile kimi: vllm_options.host: host is set by vllm_listen_address, never by an option"),
    ({"vllm": {"port": False}},
     "profile kimi: vllm_options.port: port is set by the profile's port, never by an option"),
    # Remote code is the profile's key only, where the commit-pin rule holds it: an option would skip that rule.
    ({"sglang": {"trust-remote-code": True}},
     "profile kimi: sglang_options.trust-remote-code: trust-remote-code is set by the profile's trust_remote_code, "
     "never by an option"),
    ({"vllm": {"trust_remote_code": True}},
     "profile kimi: vllm_options.trust_remote_code: trust-remote-code is set by the profile's trust_remote_code"),
])
def test_host_and_port_are_never_options(options: dict, message: str) -> None:
    (error,) = _refusals(options)
    assert error.startswith(message), error


def test_host_and_port_are_refused_in_the_option_variables_too() -> None:
    given = {"sglang_extra_options": {"host": "0.0.0.0"}, "vllm_default_options": {"port": 8001, "max-num-seqs": 8}}
    assert [m.split(":")[0] for m in ic.option_problems(given, ROSTER, INPUTS)] == [
        "sglang_extra_options.host", "vllm_default_options.port"]


def test_a_secret_flag_is_refused_in_either_spelling() -> None:
    tail = "(from a vault) instead; options are kept in the profile, the release metadata and the reports"
    assert _refusals({"vllm": {"api_key": "x"}, "sglang": {"admin_api_key": "y"}}) == [
        f"profile kimi: sglang_options.admin_api_key is a secret: set sglang_admin_api_key {tail}",
        f"profile kimi: vllm_options.api_key is a secret: set vllm_api_key {tail}"]
    assert ic.keys_in_options({"vllm_extra_options": {"API_KEY": "x"}}, "the inventory", ROSTER)[0].startswith(
        "vllm_extra_options.API_KEY is a secret: set vllm_api_key")


def test_a_line_separator_in_an_option_key_is_refused_naming_it() -> None:
    profile = _kimi()
    profile["sglang_options"] = {"log-level\u2028api-key": "x", "served-model-name": "a\u2029b"}
    _, errors = ic.check_profiles({"kimi": profile}, CATALOG.profile_schema, ROSTER, INPUTS)
    assert errors == ["profile kimi: sglang_options key holds control characters (U+2028)",
                      "profile kimi: sglang_options.served-model-name holds control characters (U+2029)"]
    assert ic.control_characters("a\u0085b", "sglang_extra_environment.X") == [
        "sglang_extra_environment.X holds control characters (U+0085)"]


def test_an_unknown_option_key_names_the_closest_flag_of_the_engines_version() -> None:
    assert _refusals({"sglang": {"speculative-num-step": 3}, "vllm": {"max-num-seq": 8}}) == [
        "profile kimi: sglang_options.speculative-num-step is not a flag of sglang 0.5.23 "
        "(roles/sglang/files/flags-0.5.23.txt); did you mean speculative-num-steps?",
        "profile kimi: vllm_options.max-num-seq is not a flag of vllm 0.33.0 (roles/vllm/files/flags-0.33.0.txt); did "
        "you mean max-num-seqs?"]


def test_keys_are_checked_against_their_own_engines_flags_only() -> None:
    # max-num-seqs is vLLM's, max-running-requests SGLang's: each is known only to its own engine.
    errors = _refusals({"sglang": {"max-num-seqs": 8}, "vllm": {"max-running-requests": 8}})
    assert [e.split(" is not a flag of ")[0] for e in errors] == [
        "profile kimi: sglang_options.max-num-seqs", "profile kimi: vllm_options.max-running-requests"]
    assert "sglang 0.5.23" in errors[0] and "vllm 0.33.0" in errors[1]


def test_keys_are_compared_as_the_parsers_read_them() -> None:
    """`_` and `-` alike, a false value (which drops a flag) or a list value changes nothing, vLLM's dotted keys set
    one field of a JSON flag."""
    assert _refusals({"vllm": {"max_num_seqs": 8, "compilation-config.mode": 3, "enable-prefix-caching": False,
                               "middleware": ["a.B"]},
                      "sglang": {"enable-metrics": False, "cuda-graph-max-bs-decode": 16}}) == []


def test_without_a_flag_list_for_the_version_the_keys_are_left_to_the_engines_parser() -> None:
    inputs = ei.load_engine_inputs(ROSTER, {"sglang": "9.9.9"})
    assert inputs.flags == {"sglang": None, "vllm": None}
    given = {"sglang_extra_options": {"some-future-flag": 1, "tokenizer-worker-num": 2}}
    (error,) = ic.option_problems(given, ROSTER, inputs)
    assert error.startswith("sglang_extra_options.tokenizer-worker-num is 2:")


@pytest.mark.parametrize(("key", "value", "why", "upstream", "way_out"), [
    ("tokenizer-worker-num", 2, "adds its API-key and admin-key middleware only in single-tokenizer mode",
     "sglang/srt/entrypoints/http_server.py", "leave it at 1"),
    ("tokenizer_worker_num", "4", "only in single-tokenizer mode", "http_server.py", "leave it at 1"),
    ("enable-http2", True, "Granian instead of uvicorn", "sglang/srt/entrypoints/http_server.py (_run_granian_server)",
     "leave it off"),
    ("crash-dump-folder", "/var/tmp/dumps", "the API key and the admin key unredacted",
     "sglang/srt/managers/tokenizer_manager.py", "leave it unset"),
    ("grpc-port", 31000, "native gRPC server", "_start_native_grpc_server_for_runtime", "leave it unset"),
    ("grpc-mode", True, "legacy SMG gRPC server", "sglang/srt/entrypoints/grpc_server.py", "leave it off"),
    ("enable-custom-logit-processor", True, "dill-pickled Python callable",
     "sglang/srt/sampling/custom_logit_processor.py", "leave it off"),
])
def test_an_sglang_option_that_removes_a_guard_is_refused_naming_it_why_and_the_way_out(
        key: str, value: object, why: str, upstream: str, way_out: str) -> None:
    (error,) = _refusals({"sglang": {key: value}})
    assert error.startswith(f"profile kimi: sglang_options.{key} is "), error
    assert why in error and upstream in error and f"way out: {way_out}" in error


@pytest.mark.parametrize(("key", "value"), [("tokenizer-worker-num", 1), ("enable-http2", False),
                                            ("crash-dump-folder", None), ("grpc-port", None), ("smg-grpc-mode", False),
                                            ("enable-custom-logit-processor", "false")])
def test_a_guarded_option_at_its_safe_value_passes(key: str, value: object) -> None:
    assert _refusals({"sglang": {key: value}}) == []


@pytest.mark.parametrize(("engine", "key", "value", "why"), [
    ("vllm", "allowed-local-media-path", "/var/lib", "read the image and video files under that directory"),
    ("vllm", "enable_prompt_embeds", True, "deserializes with torch.load"),
    ("vllm", "trust-request-chat-template", "yes", "send its own Jinja chat template"),
    ("vllm", "config", "/etc/vllm.yaml", "flags that no check of this collection sees"),
    ("sglang", "trust-request-chat-template", True, "send its own Jinja chat template"),
    ("sglang", "config", "/tmp/other.yaml", "a second file would bring flags"),
])
def test_options_that_open_files_code_or_unchecked_flags_to_clients_are_refused(engine, key, value, why) -> None:
    (error,) = _refusals({engine: {key: value}})
    assert error.startswith(f"profile kimi: {engine}_options.{key} is "), error
    assert why in error and "; way out: " in error, error
    assert _refusals({engine: {key: None if key in ("config", "allowed-local-media-path") else False}}) == []


def _refusing_value(condition: object) -> str:
    if condition in ("present", "truthy"):
        return "1"
    (kind, argument), = condition.items()  # type: ignore[union-attr]
    return str(argument + 1) if kind == "greater_than" else "/health_generate2"


ENVIRONMENT_CASES = [(engine, entry["name"].replace("*", "CHAT"), _refusing_value(entry["refused_when"]))
                     for engine, guards in GUARDS.items() for entry in guards["environment"]]


@pytest.mark.parametrize(("engine", "variable", "value"), ENVIRONMENT_CASES, ids=[c[1] for c in ENVIRONMENT_CASES])
def test_each_vetted_environment_variable_is_refused_naming_it(engine: str, variable: str, value: str) -> None:
    for mapping in (f"{engine}_environment", f"{engine}_extra_environment"):
        (error,) = ic.environment_problems({mapping: {"HOME": "/var/lib/x", variable: value}}, ROSTER, INPUTS)
        assert error.startswith(f"{mapping}.{variable} is "), error
        assert "; see " in error and "/" in error.split("; see ", 1)[1] and "; way out: " in error, error


def test_the_vetted_variables_are_the_ones_the_issue_names() -> None:
    names = {entry["name"] for guards in GUARDS.values() for entry in guards["environment"]}
    assert {"VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "SGLANG_LOG_REQUEST_HEADERS",
            "AIP_PREDICT_ROUTE", "SGLANG_OLLAMA_*_ROUTE"} <= names


@pytest.mark.parametrize(("variable", "value", "refused"), [
    ("AIP_PREDICT_ROUTE", "/health/predict", True), ("AIP_PREDICT_ROUTE", "/predict", False),
    ("SGLANG_OLLAMA_GENERATE_ROUTE", "/metrics_x", True), ("SGLANG_OLLAMA_ROOT_ROUTE", "/ollama", False),
    ("SGLANG_LOG_REQUEST_HEADERS", "x-request-id", True), ("SGLANG_RUST_SERVER", "0", False),
    ("SGLANG_RUST_SERVER", "true", True), ("DUMPER_SERVER_PORT", "reuse", False), ("DUMPER_SERVER_PORT", "-1", False),
])
def test_route_and_switch_variables_are_refused_only_where_they_take_a_guard_away(variable, value, refused) -> None:
    errors = ic.environment_problems({"sglang_extra_environment": {variable: value}}, ROSTER, INPUTS)
    assert bool(errors) is refused, errors


def test_the_jit_cache_variables_and_the_role_defaults_pass() -> None:
    admitted = {"FLASHINFER_WORKSPACE_BASE": "/var/cache/x/flashinfer", "SGLANG_JIT_CACHE_DIR": "/var/cache/x/jit",
                "SGLANG_DG_CACHE_DIR": "/var/cache/x/dg", "TORCH_CUDA_ARCH_LIST": "12.0",
                "FLASHINFER_CUDA_ARCH_LIST": "12.0f", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1",
                "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1", "SGLANG_PLUGINS": "x", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    given = {**{f"{engine}_extra_environment": admitted for engine in ROSTER},
             **{f"{engine}_environment": _role_defaults(engine, "environment") for engine in ROSTER}}
    assert ic.environment_problems(given, ROSTER, INPUTS) == []
    options = {f"{engine}_default_options": _role_defaults(engine, "default_options") for engine in ROSTER}
    assert ic.option_problems(options, ROSTER, INPUTS) == []


def _role_defaults(engine: str, kind: str) -> dict:
    return load(ROLES / ROSTER[engine]["role"] / "defaults" / "main.yml")[f"{engine}_{kind}"]


def test_vllm_reports_no_usage_by_default() -> None:
    environment = _role_defaults("vllm", "environment")
    assert environment["VLLM_NO_USAGE_STATS"] == "1" and environment["DO_NOT_TRACK"] == "1"


@pytest.mark.parametrize("inventory", sorted(PROFILES))
def test_the_inventories_profiles_pass_the_effective_checks(inventory: str) -> None:
    for profile in pinned(PROFILES[inventory]).values():
        options = {f"{engine}_options": profile.get(f"{engine}_options") or {} for engine in ROSTER}
        assert ic.option_problems(options, ROSTER, INPUTS) == []
        assert ic.keys_in_options(options, "the profile", ROSTER) == []


@pytest.mark.parametrize(("content", "message"), [
    ("options: [{name: x, refused_when: always, why: w, upstream: u, way_out: o}]", "options x: refused_when must be"),
    ("options: [{name: x, refused_when: {greater_than: many}, why: w, upstream: u, way_out: o}]",
     "greater_than needs a number"),
    ("environment: [{name: X, refused_when: present, why: w, upstream: u}]", "environment X: way_out must be"),
    ("environment: [{name: X, refused_when: present, why: w, upstream: u, way_out: o, cite: c}]", "unknown key cite"),
    ("options: [{refused_when: present}]", "each entry is a mapping with a non-empty `name`"),
    ("flags: []", "a mapping with `options` and `environment` lists"),
])
def test_a_broken_guard_file_is_refused_naming_the_entry(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "guarded_inputs.yml"
    path.write_text(content)
    with pytest.raises(ei.GuardFileError, match=re.escape(message)):
        ei.read_guards(path)


# --- the roster's key variables ------------------------------------------------------------------------


def test_the_rosters_key_variables_are_no_log_options_of_their_engines_roles() -> None:
    assert ic.roster_secret_problems(ROSTER, CATALOG) == []


@pytest.mark.parametrize(("change", "said"), [
    (lambda r: r["vllm"].update(api_key_variable="vllm_listen_address"),
     "vllm.api_key_variable names vllm_listen_address, which is not an option of role vllm marked no_log"),
    (lambda r: r["vllm"].update(api_key_variable="sglang_api_key"),
     "vllm.api_key_variable names sglang_api_key, which is not an option of role vllm marked no_log"),
    (lambda r: r["sglang"].update(distinct_secrets=["sglang_api_key", "sglang_admin_api_kye"]),
     "sglang.distinct_secrets names sglang_admin_api_kye, which is not an option of role sglang marked no_log"),
])
def test_a_roster_key_variable_that_is_not_a_no_log_option_of_its_role_is_refused(change, said) -> None:
    roster = copy.deepcopy(ROSTER)
    change(roster)
    assert [problem for problem in ic.roster_secret_problems(roster, CATALOG) if said in problem], \
        ic.roster_secret_problems(roster, CATALOG)


@pytest.mark.parametrize(("path", "said"), [
    ("/var/lib/llm-serving", "is under /var/lib/llm-serving"),
    ("/var/lib/llm-serving/releases/x", "is under /var/lib/llm-serving"),
    ("/var/lib/vllm/models", "is under /var/lib/vllm"),  # a service user's home (the roster's service_user)
    ("/etc", "is under /etc"), ("/usr/share/models", "is under /usr"), ("/", "is a system directory"),
    ("/var/lib", "is a system directory"), ("/home", "is a system directory"), ("/root", "is a system directory"),
    ("/srv/models/../../etc", "is not a plain path"), ("/srv//models", "is not a plain path"),
    ("//srv/models", "is not a plain path"), ("srv/models", "must be absolute"),
])
def test_a_model_path_that_would_chmod_the_system_or_the_releases_is_refused(path: str, said: str) -> None:
    """The model store makes a model directory root-owned and engine-readable, recursively, as root: a state
    directory as a model path would make every release's key file readable."""
    profile = _kimi()
    profile["model"] = {**profile["model"], "path": path}
    _, errors = ic.check_profile("kimi", profile, CATALOG.profile_schema, ROSTER, INPUTS)
    assert (len(errors) == 1 and said in errors[0] and errors[0].startswith(f"profile kimi: model.path {path}")) \
        or (said == "must be absolute" and errors == [f"profile kimi: model.path must be absolute, got {path}"]), errors


@pytest.mark.parametrize("path", ["/srv/models/kimi", "/data/models/kimi-k2.5", "/var/lib/models/kimi", "/tmp/m/x",
                                  "/srv/models/kimi/"])
def test_a_model_directory_of_its_own_passes(path: str) -> None:
    profile = _kimi()
    profile["model"] = {**profile["model"], "path": path}
    assert ic.check_profile("kimi", profile, CATALOG.profile_schema, ROSTER, INPUTS)[1] == []
