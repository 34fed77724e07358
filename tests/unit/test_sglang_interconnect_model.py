"""roles/sglang/files/interconnect_engine.py: what SGLang 0.5.23 sets in its own process, as the proof applies it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "roles" / "sglang" / "files" / "interconnect_engine.py"
_spec = importlib.util.spec_from_file_location("sglang_interconnect_engine", PATH)
model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model)


@pytest.mark.parametrize(("flags", "graphs"), [
    ([], True),
    (["disable-cuda-graph"], False),
    (["disable-decode-cuda-graph"], True),  # prefill keeps its graph
    (["disable-decode-cuda-graph", "disable-prefill-cuda-graph"], False),
    (["cuda-graph-backend-decode=disabled", "cuda-graph-backend-prefill=disabled"], False),
    (["cuda-graph-backend-decode=disabled", "disable-prefill-cuda-graph"], False),
    # the backend flag wins over the switches (sglang/srt/arg_groups/cuda_graph_hook.py parse_cuda_graph_config)
    (["disable-cuda-graph", "cuda-graph-backend-decode=full"], True),
    (["cuda-graph-backend-decode=disabled"], True),
])
def test_a_phase_keeps_its_graph_unless_every_spelling_turns_it_off(flags: list[str], graphs: bool) -> None:
    assert model.graphs_in_some_phase(flags) is graphs
    applied = model.process_environment({}, flags, world_size=8)
    assert ("NCCL_GRAPH_REGISTER" in applied) is graphs


def test_the_valued_flags_are_declared_for_the_proofs_check_of_its_arguments() -> None:
    assert model.VALUED_FLAGS == ("cuda-graph-backend-decode", "cuda-graph-backend-prefill")
    assert model.process_environment({}, [], world_size=1).get("NCCL_GRAPH_REGISTER") is None
