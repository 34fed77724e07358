"""The engine roster (meta/engines.yml) and its reader: a broken entry fails naming the engine and the key."""

from __future__ import annotations

import copy
import re

import pytest
from ansible_collections.blackwell.serving.plugins.plugin_utils import engine_roster as er

ROSTER = er.load_roster()


def raw() -> dict:
    return {"engines": {name: {k: v for k, v in entry.items() if k != "name"} for name, entry in ROSTER.items()}}


def test_the_roster_names_both_engines_with_their_units_users_and_patterns():
    assert list(ROSTER) == ["sglang", "vllm"]
    assert er.field_values(ROSTER, "unit") == ["sglang.service", "vllm.service"]
    assert er.field_values(ROSTER, "service_user") == ["sglang", "vllm"]
    assert "sglang::*" in er.field_values(ROSTER, "process_patterns")
    assert "VLLM::*" in er.field_values(ROSTER, "process_patterns")
    assert {"multi_tokenizer_*", "sgl_shm_*", "sglang_loads_*"} <= set(er.field_values(ROSTER, "shm_patterns"))
    assert er.field_values(ROSTER, "name") == ["sglang", "vllm"]


@pytest.mark.parametrize(("change", "message"), [
    (lambda e: e["vllm"].pop("unit"), "vllm.unit is missing"),
    (lambda e: e["vllm"].update(units=["x"]), "vllm.units is not a roster key"),
    (lambda e: e["sglang"].update(readiness_timeout_s="900"), "sglang.readiness_timeout_s must be a int, got str"),
    (lambda e: e["sglang"].update(process_patterns=[]), "sglang.process_patterns must name at least one pattern"),
    (lambda e: e["sglang"].update(process_patterns=[1]), "sglang.process_patterns must be a list of strings"),
    (lambda e: e["vllm"].pop("shm_patterns"), "vllm.shm_patterns is missing"),
    (lambda e: e["sglang"].update(shm_patterns="sgl_shm_*"), "sglang.shm_patterns must be a list, got str"),
    (lambda e: e["sglang"].update(shm_patterns=["*"]), "sglang.shm_patterns: '*' must start with a name prefix"),
    (lambda e: e["sglang"].update(shm_patterns=["sgl*"]), "sglang.shm_patterns: 'sgl*' must start with a name prefix"),
    (lambda e: e["sglang"].update(shm_patterns=["../etc*"]), "sglang.shm_patterns: '../etc*' must start with"),
    (lambda e: e["vllm"].update(unit="sglang.service"), "unit sglang.service is named by more than one engine"),
    (lambda e: e["vllm"]["metrics"]["counters"].pop("drafts"),
     "vllm.metrics.acceptance.length.ratio names 'drafts', which is not a key of counters"),
    (lambda e: e["vllm"]["metrics"].update(acceptance="magic"), "vllm.metrics.acceptance must say how length"),
    (lambda e: e["vllm"]["metrics"].update(scheme="x"), "vllm.metrics.scheme is not a key"),
    (lambda e: e.update({"Bad-Name": {}}), "engine name 'Bad-Name' must be lower-case"),
    (lambda e: e["vllm"].pop("reserved_flags"), "vllm.reserved_flags is missing"),
    (lambda e: e["vllm"].update(reserved_flags=["host"]), "vllm.reserved_flags must be a dict, got list"),
    (lambda e: e["sglang"]["reserved_flags"].update(host=""),
     "sglang.reserved_flags.host must name what sets the flag"),
])
def test_a_broken_entry_is_refused_naming_engine_and_key(change, message):
    data = copy.deepcopy(raw())
    change(data["engines"])
    with pytest.raises(er.RosterError, match=re.escape(message)):
        er.check_roster(data)


def test_an_unknown_field_query_is_refused():
    with pytest.raises(er.RosterError, match="'units' is not a roster key"):
        er.field_values(ROSTER, "units")


def test_an_empty_or_missing_roster_is_refused(tmp_path):
    with pytest.raises(er.RosterError, match="non-empty `engines`"):
        er.check_roster({"engines": {}})
    with pytest.raises(er.RosterError, match="cannot read the engine roster"):
        er.load_roster(tmp_path / "absent.yml")


def test_every_engine_reserves_its_bind_address_port_and_remote_code_to_variables():
    """An option must not move the engine off the address and port that the unit, the no-key refusal and verify read,
    nor run the checkpoint's code where the profile (held to a reviewed commit) does not say so."""
    for name, entry in ROSTER.items():
        kept = {flag: what for flag, what in entry["reserved_flags"].items() if "parallel_size" not in what}
        assert kept == {"host": f"{name}_listen_address", "port": "the profile's port",
                        "trust-remote-code": "the profile's trust_remote_code"}, name


LAYOUT_KEYS = {"tensor_parallel_size", "data_parallel_size", "expert_parallel_size"}


def test_every_engine_reserves_the_flags_of_the_parallel_layout_to_the_profile_keys():
    """The preflight's GPU count, the proof's world and the release document follow the profile's layout keys: no
    option may set the engine's tensor, data or expert parallel flags past them, in any spelling the parser takes."""
    for name, entry in ROSTER.items():
        setters = {what.removeprefix("the profile's ") for what in entry["reserved_flags"].values()}
        assert setters >= LAYOUT_KEYS, name
    assert ROSTER["sglang"]["flag_aliases"]["ep-size"] == ["expert-parallel-size", "ep"]
    assert er.reserved_spellings(ROSTER["sglang"])["ep"] == "ep-size"


def test_aliases_of_flags_that_are_not_reserved_or_named_twice_are_refused():
    entry = {**ROSTER["sglang"], "flag_aliases": {"tp-size": ["tp"], "nnodes": ["n"], "ep-size": ["tp"]}}
    entry.pop("name")
    problems = er.check_entry("sglang", entry)
    assert "sglang.flag_aliases.nnodes is not a reserved flag" in " ".join(problems)
    assert "sglang.flag_aliases: tp is named twice" in " ".join(problems)


def test_a_layout_rule_the_layout_code_does_not_know_is_refused():
    entry = {**ROSTER["vllm"], "layout": {**ROSTER["vllm"]["layout"], "expert_parallel": "sometimes"}}
    entry.pop("name")
    assert any("layout.expert_parallel must be one of divides_tensor, whole_world" in p
               for p in er.check_entry("vllm", entry))


def test_the_server_info_layout_names_layout_keys_only():
    assert set(ROSTER["sglang"]["server_info_layout"]) == {"tensor_parallel_size", "data_parallel_size",
                                                          "attention_data_parallel_size", "expert_parallel_size"}
    entry = {**ROSTER["sglang"], "server_info_layout": {"tp": "tp_size"}}
    entry.pop("name")
    assert any("sglang.server_info_layout.tp must be a layout key" in p for p in er.check_entry("sglang", entry))
