"""plugins/filter/engine_guards.py: the guards every engine role runs on its effective flags, from its roster entry."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.blackwell.serving.plugins.filter.engine_guards import (
    engine_environment_problems,
    engine_guard_problems,
    is_loopback,
)
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import load_roster

ROSTER = load_roster()
SGLANG, VLLM = ROSTER["sglang"], ROSTER["vllm"]
# What each role sets its layout flags to (a tensor parallel group of 8), as its flags and as the reserved values.
LAYOUT = {"sglang": {"tp-size": 8, "dp-size": 1, "attn-dp-size": 1, "ep-size": 1},
          "vllm": {"tensor-parallel-size": 8, "data-parallel-size": 1}}
LAYOUT_EXPECTED = {"sglang": LAYOUT["sglang"], "vllm": {**LAYOUT["vllm"], "enable-expert-parallel": False}}


def expected(engine: str = "sglang", **values: object) -> dict:
    return {"host": "127.0.0.1", "port": 30000, "trust-remote-code": False, **LAYOUT_EXPECTED[engine], **values}


def flags(engine: str = "sglang", **values: object) -> dict:
    """The merged flags of a role that kept every reserved flag, with `values` over them."""
    return {"host": "127.0.0.1", "port": 30000, **LAYOUT[engine], **values}


EXPECTED = expected()


def test_flags_that_keep_the_reserved_values_on_loopback_pass_without_a_key() -> None:
    assert engine_guard_problems(flags(), SGLANG, EXPECTED, False) == []
    assert engine_guard_problems(flags(host="::1", port="30000"), SGLANG, {**EXPECTED, "host": "::1"}, False) == []


def test_an_option_that_moved_the_port_or_the_host_is_named_with_what_sets_it() -> None:
    problems = engine_guard_problems(flags("vllm", port=8000), VLLM, expected("vllm"), True)
    assert problems == ["vllm would get port 8000 after the options are merged, not 30000 (the profile's port): set it "
                        "with the profile's port, never in the engine's options (a profile's vllm_options, or the "
                        "role's default or extra options)."]
    moved = engine_guard_problems({k: v for k, v in flags().items() if k != "host"}, SGLANG, EXPECTED, True)
    assert moved[0].startswith("sglang would get host (none: its default) after the options are merged, not "
                               "127.0.0.1 (sglang_listen_address)")


def test_an_address_beyond_loopback_needs_the_rosters_key_variable() -> None:
    wide = flags(host="0.0.0.0")
    (problem,) = engine_guard_problems(wide, SGLANG, {**EXPECTED, "host": "0.0.0.0"}, False)
    assert problem.startswith("sglang would bind 0.0.0.0 but sglang_api_key is empty")
    assert engine_guard_problems(wide, SGLANG, {**EXPECTED, "host": "0.0.0.0"}, True) == []


def test_an_engine_without_a_host_flag_binds_its_default_and_needs_a_key() -> None:
    entry = {**VLLM, "name": "other", "reserved_flags": {"port": "the profile's port"}, "flag_aliases": {}}
    (problem,) = engine_guard_problems({"port": 30000}, entry, EXPECTED, False)
    assert problem.startswith("other would bind (no host flag: the engine's default address) but vllm_api_key")


def test_a_role_that_gives_no_value_for_a_reserved_flag_is_a_programming_error() -> None:
    with pytest.raises(AnsibleFilterError, match="gives no value for the reserved flag port"):
        engine_guard_problems({"host": "127.0.0.1"}, SGLANG, {"host": "127.0.0.1"}, True)
    with pytest.raises(AnsibleFilterError, match="gives no value for the reserved flag trust-remote-code"):
        engine_guard_problems({"host": "127.0.0.1"}, VLLM, {"host": "127.0.0.1", "port": 1}, True)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LocalHost",
                                  "::ffff:127.0.0.1", "0:0:0:0:0:0:0:1"])
def test_loopback_is_an_address_in_a_loopback_network_or_localhost(host: str) -> None:
    assert is_loopback(host)
    assert engine_guard_problems(flags(host=host), SGLANG, {**EXPECTED, "host": host}, False) == []


@pytest.mark.parametrize("host", ["127.0.0.1.nip.io", "127.evil.example", "localhost.example.com", "::1.example",
                                  "0.0.0.0", "::", "", "10.0.0.7", "::ffff:10.0.0.7", "127.0.0.1:30000", "[::1"])
def test_a_name_that_only_starts_like_loopback_needs_a_key(host: str) -> None:
    assert not is_loopback(host)
    (problem,) = engine_guard_problems(flags(host=host), SGLANG, {**EXPECTED, "host": host}, False)
    assert "but sglang_api_key is empty" in problem


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_remote_code_runs_only_as_the_profile_says(engine: str) -> None:
    entry, want = ROSTER[engine], expected(engine)
    remote = flags(engine, **{"trust-remote-code": True})
    (problem,) = engine_guard_problems(remote, entry, want, True)
    assert problem.startswith(f"{engine} would get trust-remote-code True after the options are merged, not False "
                              "(the profile's trust_remote_code)"), problem
    assert engine_guard_problems(remote, entry, {**want, "trust-remote-code": True}, True) == []
    assert engine_guard_problems({**remote, "trust-remote-code": "false"}, entry, want, True) == []
    spelled = flags(engine, trust_remote_code="yes")  # the parsers take `_` too
    (problem,) = engine_guard_problems(spelled, entry, want, True)
    assert problem.startswith(f"{engine} would get trust_remote_code yes after the options are merged"), problem
    (moved,) = engine_guard_problems(flags(engine, PORT=8000), entry, want, True)
    assert moved.startswith(f"{engine} would get PORT 8000"), moved
    del remote["trust-remote-code"]  # false switches are dropped from the merged flags
    assert engine_guard_problems(remote, entry, want, True) == []
    (missing,) = engine_guard_problems(remote, entry, {**want, "trust-remote-code": True}, True)
    assert "trust-remote-code (none: its default)" in missing


def test_an_effective_flag_that_takes_a_guard_away_is_refused_wherever_it_came_from() -> None:
    given = flags(tokenizer_worker_num=2, **{"enable-http2": False})
    (problem,) = engine_guard_problems(given, SGLANG, EXPECTED, True)
    assert problem.startswith("sglang's effective flag tokenizer_worker_num is 2: SGLang adds its API-key and "
                              "admin-key middleware only in single-tokenizer mode"), problem
    assert "way out: leave it at 1" in problem
    assert engine_guard_problems({**given, "tokenizer_worker_num": 1}, SGLANG, EXPECTED, True) == []


def test_an_option_that_moved_the_layout_in_any_spelling_is_named_with_the_profile_key() -> None:
    """SGLang's `ep` and `expert-parallel-size` are its `ep-size`: an option in either spelling must not widen the
    experts past the profile's expert_parallel_size, which the GPU count, the proof and the release document read."""
    (problem,) = engine_guard_problems(flags(ep=8), SGLANG, EXPECTED, True)
    assert problem.startswith("sglang would get ep 8 after the options are merged, not 1 (the profile's "
                              "expert_parallel_size)"), problem
    assert engine_guard_problems(flags(ep=8, **{"ep-size": 8}), SGLANG, {**EXPECTED, "ep-size": 8}, True) == []
    (dropped,) = engine_guard_problems({k: v for k, v in flags().items() if k != "tp-size"}, SGLANG, EXPECTED, True)
    assert "tp-size (none: its default)" in dropped  # an option set to null took the role's flag away
    (switched,) = engine_guard_problems(flags("vllm", **{"enable-expert-parallel": True}), VLLM, expected("vllm"), True)
    assert switched.startswith("vllm would get enable-expert-parallel True after the options are merged, not False "
                               "(the profile's expert_parallel_size)"), switched


@pytest.mark.parametrize(("engine", "environment", "said"), [
    ("sglang", {"SGLANG_LOG_REQUEST_HEADERS": "authorization", "HOME": "/x"}, "SGLANG_LOG_REQUEST_HEADERS is set"),
    ("sglang", {"SGLANG_OLLAMA_CHAT_ROUTE": "/health/chat"}, 'SGLANG_OLLAMA_CHAT_ROUTE is "/health/chat"'),
    ("vllm", {"VLLM_SERVER_DEV_MODE": "1"}, 'VLLM_SERVER_DEV_MODE is "1"'),
])
def test_an_environment_variable_that_takes_a_guard_away_is_refused(engine: str, environment: dict,
                                                                       said: str) -> None:
    (problem,) = engine_environment_problems(environment, ROSTER[engine])
    assert problem.startswith(f"{engine}'s environment {said}"), problem


def test_the_same_variables_at_their_safe_values_pass() -> None:
    assert engine_environment_problems({"VLLM_SERVER_DEV_MODE": "0", "HOME": "/x"}, VLLM) == []
    assert engine_environment_problems({"SGLANG_OLLAMA_CHAT_ROUTE": "/ollama/chat"}, SGLANG) == []
    fake = {**VLLM, "name": "fake", "role": "no-such-role"}  # an engine whose role has no guard file
    assert engine_environment_problems({"VLLM_SERVER_DEV_MODE": "1"}, fake) == []
