"""plugins/module_utils/model/fit.py and engine_preflight's memory fit: weights from the checkpoint's safetensors
headers, split by the layout, and one full context's KV cache from its config, against each GPU's share."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests.module_utils_loader import load_library_module, load_module_util

fit = load_module_util("model.fit")
preflight = load_library_module("engine_preflight")

GIB = 1024**3
# Kimi-K2.5's attention as its config says (DeepSeek-V3 shapes): MLA latent 512 + rope key 64, 61 layers.
KIMI_TEXT = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_attention_heads": 64,
             "hidden_size": 7168, "max_position_embeddings": 262144}
RTX_PRO_6000_MIB = 97887


def layout(tp: int, dp: int = 1, attn: int = 1, ep: int = 1) -> dict:
    return {"tensor_parallel_size": tp, "data_parallel_size": dp, "attention_data_parallel_size": attn,
            "expert_parallel_size": ep, "world_size": tp * dp, "nnodes": 1, "gpus_per_node": tp * dp}


def shard(path: Path, tensors: dict[str, int]) -> str:
    """A safetensors file whose header declares tensors of these byte sizes (only the header is written: the check
    reads nothing else, so a checkpoint of a terabyte is a few bytes here)."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, size in tensors.items():
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)
    return path.name


def checkpoint(directory: Path, expert_gib: float, other_gib: float, config: dict, shards: int = 2) -> Path:
    """A checkpoint with `expert_gib` of routed experts and `other_gib` of everything else, over `shards` files."""
    directory.mkdir(parents=True)
    weight_map = {}
    for index in range(shards):
        tensors = {f"language_model.model.layers.{index}.mlp.experts.0.w1.weight": int(expert_gib * GIB / shards),
                   f"language_model.model.layers.{index}.mlp.shared_experts.w1.weight": int(other_gib * GIB / shards)}
        name = shard(directory / f"model-{index}.safetensors", tensors)
        weight_map.update(dict.fromkeys(tensors, name))
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"],
                                                       "text_config": config}))
    return directory


def test_kimi_int4_at_tp8_fits_with_the_mla_cache_of_a_131k_context(tmp_path: Path) -> None:
    # ~554 GiB: the INT4 routed experts (1,014.7 B parameters at 4 bits + scales) and 23.4 GB of BF16 for the rest.
    model = checkpoint(tmp_path / "int4", expert_gib=532.0, other_gib=21.8, config=KIMI_TEXT)
    result = fit.memory_fit([str(model)], layout(8), 131072, RTX_PRO_6000_MIB, 0.85)
    assert result.fits
    assert result.weights_gib == pytest.approx((532.0 + 21.8) / 8, abs=0.01)
    assert result.kv_gib == pytest.approx(70272 * 131072 / GIB)  # (512 + 64) x 61 x 2 bytes a token
    assert "MLA: (512 + 64) x 61 layers" in result.detail and "from 2 safetensors file(s)" in result.detail
    message = fit.fit_message(result)
    assert message.startswith("the profile fits each GPU: weights 69.2 GiB + KV for one full context 8.6 GiB = "
                              "77.8 GiB against 81.3 GiB (0.85 of 95.6 GiB)"), message


def test_an_fp8_kimi_does_not_fit_eight_96_gb_gpus_and_the_message_names_the_numbers(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "fp8", expert_gib=945.0, other_gib=21.8, config=KIMI_TEXT)
    result = fit.memory_fit([str(model)], layout(8, ep=8), 131072, RTX_PRO_6000_MIB, 0.85)
    assert not result.fits
    assert fit.fit_message(result).startswith("the profile does NOT fit each GPU: weights 120.8 GiB + KV for one "
                                              "full context 8.6 GiB = 129.4 GiB against 81.3 GiB")


@pytest.mark.parametrize(("sizes", "expert_split", "other_split"), [
    (layout(8, ep=8), 8, 8),
    (layout(8, ep=4), 8, 8),  # 4 expert groups, each expert over 2 ranks
    (layout(8, attn=2, ep=8), 8, 4),  # the attention weights over each group of 4
    (layout(2, dp=4, ep=8), 8, 2),  # vLLM: the experts over tensor x data
    (layout(4, dp=2), 4, 4),  # replicas without experts split: each holds a TP4 copy
])
def test_the_layout_decides_how_many_ways_each_part_splits(tmp_path: Path, sizes: dict, expert_split: int,
                                                           other_split: int) -> None:
    model = checkpoint(tmp_path / "m", expert_gib=64.0, other_gib=16.0, config=KIMI_TEXT)
    result = fit.memory_fit([str(model)], sizes, 1024, RTX_PRO_6000_MIB, 0.9)
    assert result.weights_gib == pytest.approx(64.0 / expert_split + 16.0 / other_split, abs=0.01)
    assert f"experts split {expert_split} ways, the rest {other_split} ways" in result.detail


def test_a_drafter_adds_its_weights_and_a_context_of_zero_is_the_checkpoints_own(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "m", expert_gib=8.0, other_gib=8.0, config=KIMI_TEXT)
    drafter = checkpoint(tmp_path / "d", expert_gib=0.0, other_gib=2.0, config={"num_hidden_layers": 1,
                         "num_attention_heads": 8, "hidden_size": 1024})
    alone = fit.memory_fit([str(model)], layout(8), 0, RTX_PRO_6000_MIB, 0.9)
    both = fit.memory_fit([str(model), str(drafter)], layout(8), 0, RTX_PRO_6000_MIB, 0.9)
    assert both.weights_gib == pytest.approx(alone.weights_gib + 2.0 / 8, abs=0.01)
    assert alone.kv_gib == pytest.approx(70272 * 262144 / GIB)  # max_position_embeddings


def test_grouped_query_attention_splits_its_kv_heads_and_replicates_past_them(tmp_path: Path) -> None:
    gqa = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}
    model = checkpoint(tmp_path / "qwen", expert_gib=0.0, other_gib=1.0, config=gqa)
    per_token = {tp: fit.memory_fit([str(model)], layout(tp), 1, RTX_PRO_6000_MIB, 0.9).kv_gib * GIB
                 for tp in (1, 2, 8, 16)}
    assert per_token == {1: 2 * 8 * 128 * 28 * 2, 2: 2 * 4 * 128 * 28 * 2, 8: 2 * 1 * 128 * 28 * 2,
                         16: 2 * 1 * 128 * 28 * 2}


def test_a_checkpoint_without_safetensors_is_not_computed_and_a_broken_header_is_named(tmp_path: Path) -> None:
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "config.json").write_text("{}")
    assert fit.memory_fit([str(tmp_path / "gguf")], layout(1), 1, RTX_PRO_6000_MIB, 0.9) is None
    broken = checkpoint(tmp_path / "broken", expert_gib=1.0, other_gib=1.0, config=KIMI_TEXT)
    (broken / "model-0.safetensors").write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(fit.FitError, match=r"model-0\.safetensors: the safetensors header is not JSON"):
        fit.memory_fit([str(broken)], layout(1), 1, RTX_PRO_6000_MIB, 0.9)


def test_the_preflight_judges_the_smallest_gpu_the_layout_uses_and_fails_naming_the_numbers(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "m", expert_gib=64.0, other_gib=0.0, config=KIMI_TEXT)
    gpus = [{"memory_total_mib": 97887}, {"memory_total_mib": 24576}, {"memory_total_mib": 8192}]
    request = {"layout": layout(2), "context_length": 1024, "fraction": 0.9, "kv_bytes": 2}
    report, problems = preflight.fit_report(request, [str(model)], gpus)
    assert report["computed"] and not report["fits"] and report["budget_gib"] == pytest.approx(21.6)
    assert problems == [f"memory fit: {report['message']}"]
    assert "weights 32.0 GiB" in problems[0]
    report, problems = preflight.fit_report({**request, "layout": layout(1)}, [str(model)], gpus)
    assert report["fits"] and problems == []  # one GPU used, the first (95.6 GiB at 0.9 holds 64 GiB)
    report, problems = preflight.fit_report({**request, "layout": layout(1), "fraction": 0.6}, [str(model)], gpus)
    assert not report["fits"] and problems


def test_the_preflight_says_when_it_could_not_compute(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    request = {"layout": layout(1), "context_length": 1024, "fraction": 0.9, "kv_bytes": 2}
    report, problems = preflight.fit_report(request, [str(tmp_path / "empty")], [{"memory_total_mib": 1024}])
    assert report == {"computed": False, "message": f"memory fit not computed: {tmp_path / 'empty'} has no "
                      "safetensors weights or no config.json"} and problems == []
    report, _ = preflight.fit_report(request, [str(tmp_path / "empty")], [])
    assert report["message"] == "memory fit not computed: no GPUs read or no model path"
