"""A profile's parallel layout (plugins/plugin_utils/parallel_layout.py, the filter parallel_layout and the input
check's engine rules): the one source of the GPU count, the proof's world and the release document's layout."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.blackwell.serving.plugins.filter.parallel_layout import parallel_layout
from ansible_collections.blackwell.serving.plugins.plugin_utils import parallel_layout as pl
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import load_roster

from tests.unit.test_input_check import CATALOG, _kimi, ic

ROSTER = load_roster()


def layout(tp: int, dp: int = 1, attn: int = 1, ep: int = 1) -> dict:
    return {"tensor_parallel_size": tp, "data_parallel_size": dp, "attention_data_parallel_size": attn,
            "expert_parallel_size": ep}


@pytest.mark.parametrize(("engine", "sizes", "world"), [
    ("sglang", layout(8), 8),
    ("sglang", layout(8, ep=8), 8),
    ("sglang", layout(8, ep=4), 8),  # strided expert groups, each expert over tp/ep = 2 ranks
    ("sglang", layout(8, attn=2, ep=8), 8),  # attention groups are inside the tensor group: no more GPUs
    ("sglang", layout(4, dp=2), 8),  # two replicas of TP4
    ("vllm", layout(8, ep=8), 8),
    ("vllm", layout(4, dp=2, ep=8), 8),  # vLLM's EP spans tensor x data
    ("vllm", layout(1, dp=8, ep=8), 8),
])
def test_a_layout_the_engine_runs_gives_its_world_and_gpus_per_node(engine: str, sizes: dict, world: int) -> None:
    result = parallel_layout(sizes, engine)
    assert result == {**sizes, "world_size": world, "nnodes": 1, "gpus_per_node": world}


def test_a_multi_node_group_spreads_the_world_over_its_nodes() -> None:
    assert parallel_layout(layout(16, ep=16), "sglang", 2)["gpus_per_node"] == 8
    with pytest.raises(AnsibleFilterError, match="do not spread evenly over the 3 nodes"):
        parallel_layout(layout(8), "sglang", 3)


def test_the_layout_keys_default_to_one_and_the_tensor_size_is_required() -> None:
    assert parallel_layout({"tensor_parallel_size": 2, "data_parallel_size": None}, "vllm")["world_size"] == 2
    assert pl.general_problems({}) == ["tensor_parallel_size must be a whole number, got None"]


@pytest.mark.parametrize(("engine", "sizes", "said"), [
    ("sglang", layout(8, ep=3), "expert_parallel_size 3 does not divide tensor_parallel_size 8; sglang refuses it "
                                "(sglang/srt/model_executor/model_runner_components/moe_ep_setup.py"),
    ("sglang", layout(4, dp=2, attn=2), "data_parallel_size 2 with attention_data_parallel_size 2: replicas and "
                                        "attention data parallelism together; sglang refuses it"),
    ("vllm", layout(8, ep=4), "expert_parallel_size 4: vllm's expert parallelism is on or off, and on it spans every "
                              "rank (tensor_parallel_size x data_parallel_size = 8); set 1 or 8"),
    ("vllm", layout(8, attn=2), "attention_data_parallel_size 2: vllm has no attention data parallelism inside a "
                                "tensor parallel group"),
])
def test_a_layout_the_engine_refuses_is_refused_naming_its_rule(engine: str, sizes: dict, said: str) -> None:
    (problem,) = pl.engine_problems(sizes, ROSTER[engine])
    assert problem.startswith(said), problem
    with pytest.raises(AnsibleFilterError, match="parallel_layout of " + engine):
        parallel_layout(sizes, engine)


@pytest.mark.parametrize(("sizes", "said"), [
    (layout(8, attn=3), "attention_data_parallel_size 3 does not divide tensor_parallel_size 8"),
    (layout(8, ep=16), "expert_parallel_size 16 is more than the 8 ranks of the layout"),
    (layout(8, dp=0), "data_parallel_size must be at least 1, got 0"),
    ({**layout(8), "expert_parallel_size": True}, "expert_parallel_size must be a whole number, got True"),
])
def test_what_no_engine_runs_is_refused_for_every_profile(sizes: dict, said: str) -> None:
    (problem,) = pl.general_problems(sizes)
    assert problem.startswith(said), problem
    _, errors = ic.check_profile("kimi", _kimi() | sizes, CATALOG.profile_schema, ROSTER)
    assert any(e.startswith("profile kimi: " + said) for e in errors), errors


def test_the_input_check_applies_the_serving_engines_rules_to_its_profile() -> None:
    """The same profile may be SGLang's and not vLLM's: the rules of the engine that serves it apply at its role's
    first check, before anything changes."""
    profile, _ = ic.check_profile("k", _kimi() | layout(8, attn=2, ep=8), CATALOG.profile_schema, ROSTER)
    assert ic.engine_profile_problems("k", profile, "sglang", ROSTER) == []
    (problem,) = ic.engine_profile_problems("k", profile, "vllm", ROSTER)
    assert problem.startswith("profile k on vllm: attention_data_parallel_size 2: vllm has no attention data")
    assert ic.engine_profile_problems("k", profile, "trtllm", ROSTER) == [
        "engine trtllm is not in the engine roster (known: sglang, vllm)"]


@pytest.mark.parametrize(("engine", "key", "setter"), [
    ("sglang", "ep", "expert_parallel_size"),
    ("sglang", "expert-parallel-size", "expert_parallel_size"),
    ("sglang", "tensor_parallel_size", "tensor_parallel_size"),
    ("sglang", "attn-dp-size", "attention_data_parallel_size"),
    ("sglang", "dp-size", "data_parallel_size"),
    ("vllm", "enable-expert-parallel", "expert_parallel_size"),
    ("vllm", "data-parallel-size", "data_parallel_size"),
])
def test_a_layout_flag_in_options_is_refused_naming_the_profile_key(engine: str, key: str, setter: str) -> None:
    _, errors = ic.check_profile("kimi", _kimi() | {f"{engine}_options": {key: 8}}, CATALOG.profile_schema, ROSTER)
    assert len(errors) == 1 and f"{engine}_options.{key}: " in errors[0], errors
    assert f"is set by the profile's {setter}, never by an option" in errors[0], errors


@pytest.mark.parametrize(("key", "said"), [
    ("enable-dp-attention", "use --attn-dp-size <dp-size> instead (set by the profile's attention_data_parallel_size)"),
    ("disable_cuda_graph", "use --cuda-graph-backend-{decode,prefill}=disabled instead"),
    ("enable-tf32-matmul", "no key of the file sets it: leave it out"),
])
def test_a_key_sglangs_config_reader_refuses_is_refused_naming_what_to_write(key: str, said: str) -> None:
    """The sglang role serves from a --config file whose reader refuses some flags of the parser (deprecated store-true
    switches, BooleanOptionalAction flags): refused before anything changes, not by a crash-looping unit."""
    _, errors = ic.check_profile("k", _kimi() | {"sglang_options": {key: True}}, CATALOG.profile_schema, ROSTER)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"profile k: sglang_options.{key}: sglang 0.5.23 reads its flags from the --config "
                                "file the role renders, and that reader refuses this key"), errors
    assert errors[0].endswith(said), errors
    assert "server_args_config_parser.py" in errors[0]
