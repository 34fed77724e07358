"""plugins/filter/engine_flags.py: the engine roles' flag layers merged in order, and flags as argv words."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.blackwell.serving.plugins.filter.engine_flags import argv_words, merged_flags


def test_a_later_layer_wins_and_null_or_false_drops_the_flag() -> None:
    base = {"host": "127.0.0.1", "port": 30000, "trust-remote-code": True, "quantization": None}
    defaults = {"enable-metrics": True, "cuda-graph-max-bs": 64}
    profile = {"cuda-graph-max-bs": 128, "trust-remote-code": False}
    extra = {"quantization": "fp8", "enable-metrics": None}
    assert merged_flags([base, {}, defaults, profile, extra]) == {
        "host": "127.0.0.1", "port": 30000, "cuda-graph-max-bs": 128, "quantization": "fp8"}


def test_zero_and_empty_strings_are_values_not_switches() -> None:
    assert merged_flags([{"a": 0, "b": "", "c": False}]) == {"a": 0, "b": ""}


def test_a_layer_that_is_not_a_mapping_is_refused_naming_it() -> None:
    with pytest.raises(AnsibleFilterError, match="layer 1 must be a mapping of flags, got list"):
        merged_flags([{}, ["tp-size", 8]])


def test_flags_become_words_in_order() -> None:
    flags = {"served-model-name": "kimi", "tensor-parallel-size": 8, "trust-remote-code": True,
             "speculative-config": '{"method": "eagle3"}', "allowed-origins": ["a", "b"]}
    assert argv_words(flags) == ["--served-model-name", "kimi", "--tensor-parallel-size", "8", "--trust-remote-code",
                                 "--speculative-config", '{"method": "eagle3"}', "--allowed-origins", "a", "b"]


@pytest.mark.parametrize("key", ["--port", "-p", ""])
def test_a_flag_given_with_dashes_or_no_name_is_refused(key) -> None:
    with pytest.raises(AnsibleFilterError, match="give the flag's full name without leading dashes"):
        argv_words({key: 1})
