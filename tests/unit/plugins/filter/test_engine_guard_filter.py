"""plugins/filter/engine_guards.py: the guards every engine role runs on its effective flags, from its roster entry."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.blackwell.serving.plugins.filter.engine_guards import engine_guard_problems
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import load_roster

ROSTER = load_roster()
SGLANG, VLLM = ROSTER["sglang"], ROSTER["vllm"]
EXPECTED = {"host": "127.0.0.1", "port": 30000}


def test_flags_that_keep_the_reserved_values_on_loopback_pass_without_a_key() -> None:
    assert engine_guard_problems({"host": "127.0.0.1", "port": 30000, "tp-size": 8}, SGLANG, EXPECTED, False) == []
    assert engine_guard_problems({"host": "::1", "port": "30000"}, SGLANG, {"host": "::1", "port": 30000}, False) == []


def test_an_option_that_moved_the_port_or_the_host_is_named_with_what_sets_it() -> None:
    problems = engine_guard_problems({"host": "127.0.0.1", "port": 8000}, VLLM, EXPECTED, True)
    assert problems == ["vllm would get port 8000 after the options are merged, not 30000 (the profile's port): set it "
                        "with the profile's port, never in the engine's options (a profile's vllm_options, or the "
                        "role's default or extra options)."]
    moved = engine_guard_problems({"port": 30000}, SGLANG, EXPECTED, True)
    assert moved[0].startswith("sglang would get host (none: its default) after the options are merged, not "
                               "127.0.0.1 (sglang_listen_address)")


def test_an_address_beyond_loopback_needs_the_rosters_key_variable() -> None:
    flags = {"host": "0.0.0.0", "port": 30000}
    (problem,) = engine_guard_problems(flags, SGLANG, {**EXPECTED, "host": "0.0.0.0"}, False)
    assert problem.startswith("sglang would bind 0.0.0.0 but sglang_api_key is empty")
    assert engine_guard_problems(flags, SGLANG, {**EXPECTED, "host": "0.0.0.0"}, True) == []


def test_an_engine_without_a_host_flag_binds_its_default_and_needs_a_key() -> None:
    entry = {**VLLM, "name": "other", "reserved_flags": {"port": "the profile's port"}}
    (problem,) = engine_guard_problems({"port": 30000}, entry, EXPECTED, False)
    assert problem.startswith("other would bind (no host flag: the engine's default address) but vllm_api_key")


def test_a_role_that_gives_no_value_for_a_reserved_flag_is_a_programming_error() -> None:
    with pytest.raises(AnsibleFilterError, match="gives no value for the reserved flag port"):
        engine_guard_problems({"host": "127.0.0.1"}, SGLANG, {"host": "127.0.0.1"}, True)
