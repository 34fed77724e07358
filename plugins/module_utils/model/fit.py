# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""Whether a checkpoint fits the GPUs of a layout: weights and the KV cache of one full context per GPU.

Standard library only (runs on the target). The numbers come from the checkpoint itself, never from a constant:

- the weights: every tensor's bytes from the safetensors headers of the shards (the index's ``weight_map``, or
  ``model.safetensors``), read without reading the tensors. Routed experts (``.experts.`` in the name, shared experts
  not) are split over the larger of the tensor and expert parallel widths (the experts of a layer over ``ep`` ranks,
  each over ``tp / ep``; vLLM's expert parallelism over tensor x data). Everything else is split over the attention
  tensor group (``tp / attention_dp``: under attention data parallelism the attention weights are split over fewer
  ranks), an upper bound for the layers that stay split over ``tp``;
- the KV cache: ``config.json`` (its ``text_config`` for a multimodal checkpoint). MLA (``kv_lora_rank``): the latent
  and the rope key, ``(kv_lora_rank + qk_rope_head_dim) x layers`` values a token, held whole by every rank of an
  attention group. Otherwise ``2 x kv_heads x head_dim x layers`` values, the heads split over the attention group
  (replicated where it is wider than the heads). One request of ``context_length`` tokens must fit on each rank;
- the budget: each GPU's memory times the share the engine takes (SGLang ``mem-fraction-static``, vLLM
  ``gpu-memory-utilization``).

A checkpoint without safetensors (or without a config) is not computed, and the report says so.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from typing import Any

GIB = 1024**3
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
HEADER_LIMIT = 100 * 1024 * 1024  # safetensors caps its JSON header at 100 MB
EXPERT = re.compile(r"\.experts\.")
SHARED_EXPERT = re.compile(r"shared_expert")


class FitError(ValueError):
    """The checkpoint's config, index or a shard's header is not what the check reads."""


@dataclass(frozen=True)
class Weights:
    expert_bytes: int
    other_bytes: int
    files: int


def safetensors_sizes(path: str) -> dict[str, int]:
    """Each tensor's byte size in one safetensors file, from its header only."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(8)
            if len(raw) != 8:
                raise FitError(f"{path}: shorter than a safetensors header")
            (length,) = struct.unpack("<Q", raw)
            if length > HEADER_LIMIT:
                raise FitError(f"{path}: a safetensors header of {length} bytes (the format caps it at 100 MB)")
            header = json.loads(handle.read(length))
    except OSError as exc:
        raise FitError(f"{path}: {exc.strerror or exc}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise FitError(f"{path}: the safetensors header is not JSON ({exc})") from exc
    sizes = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = entry["data_offsets"]
            sizes[name] = int(end) - int(start)
        except (KeyError, TypeError, ValueError) as exc:
            raise FitError(f"{path}: tensor {name} has no data_offsets") from exc
    return sizes


def shard_files(model_dir: str) -> list[str] | None:
    """The safetensors files of a checkpoint (the index's shards, or the single file), or None without either."""
    index = os.path.join(model_dir, INDEX)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as handle:
                weight_map = json.load(handle)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise FitError(f"{index}: no weight_map ({exc})") from exc
        if not isinstance(weight_map, dict):
            raise FitError(f"{index}: weight_map is not a mapping")
        return sorted({os.path.join(model_dir, str(shard)) for shard in weight_map.values()})
    single = os.path.join(model_dir, SINGLE)
    return [single] if os.path.isfile(single) else None


def checkpoint_weights(model_dir: str) -> Weights | None:
    files = shard_files(model_dir)
    if files is None:
        return None
    expert = other = 0
    for path in files:
        for name, size in safetensors_sizes(path).items():
            if EXPERT.search(name) and not SHARED_EXPERT.search(name):
                expert += size
            else:
                other += size
    return Weights(expert, other, len(files))


def text_config(model_dir: str) -> dict[str, Any] | None:
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise FitError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise FitError(f"{path}: not a JSON object")
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else config


def _int(config: dict[str, Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FitError(f"config.json: {key} is {value!r}, not a whole number")
    return value


def kv_bytes_per_token_per_rank(config: dict[str, Any], attention_tp: int, kv_bytes: int) -> tuple[int, str]:
    """Bytes of KV cache one token takes on one rank of an attention group of `attention_tp` ranks, and how."""
    layers = _int(config, "num_hidden_layers")
    if config.get("kv_lora_rank"):
        values = _int(config, "kv_lora_rank") + _int(config, "qk_rope_head_dim")
        how = f"MLA: ({config['kv_lora_rank']} + {config['qk_rope_head_dim']}) x {layers} layers"
        return values * layers * kv_bytes, how
    heads = _int(config, "num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or _int(config, "hidden_size") // max(heads, 1)
    per_rank = max(1, -(-int(kv_heads) // attention_tp))  # heads replicate where the group is wider than them
    return 2 * per_rank * int(head_dim) * layers * kv_bytes, f"{per_rank} of {kv_heads} KV heads x {layers} layers"


@dataclass(frozen=True)
class Fit:
    weights_gib: float
    kv_gib: float
    needed_gib: float
    budget_gib: float
    gpu_gib: float
    fraction: float
    detail: str

    @property
    def fits(self) -> bool:
        return self.needed_gib <= self.budget_gib


def memory_fit(model_dirs: list[str], layout: dict[str, int], context_length: int, gpu_memory_mib: int,
               fraction: float, *, kv_bytes: int = 2) -> Fit | None:
    """Weights of every model directory (target first, then a drafter) and the KV of one full context, per GPU,
    against `fraction` of `gpu_memory_mib`; None when the target has no safetensors or no config."""
    tp, ep = layout["tensor_parallel_size"], layout["expert_parallel_size"]
    attention_tp = max(1, tp // layout["attention_data_parallel_size"])
    expert_split = max(tp, ep)
    per_gpu = 0.0
    files = 0
    for index, model_dir in enumerate(model_dirs):
        weights = checkpoint_weights(model_dir)
        if weights is None:
            if index == 0:
                return None
            continue
        files += weights.files
        per_gpu += weights.expert_bytes / expert_split + weights.other_bytes / attention_tp
    config = text_config(model_dirs[0])
    if config is None:
        return None
    if context_length <= 0:  # the engine then serves the checkpoint's own length
        context_length = _int(config, "max_position_embeddings")
    per_token, how = kv_bytes_per_token_per_rank(config, attention_tp, kv_bytes)
    kv = per_token * context_length
    gpu = gpu_memory_mib * 1024 * 1024
    detail = (f"experts split {expert_split} ways, the rest {attention_tp} ways, from {files} safetensors file(s); "
              f"KV {per_token} B a token ({how}, {kv_bytes} B a value) for {context_length} tokens")
    return Fit(per_gpu / GIB, kv / GIB, (per_gpu + kv) / GIB, gpu * fraction / GIB, gpu / GIB, fraction, detail)


def size_text(gib: float) -> str:
    """GiB with one decimal, MiB below 1 GiB (a small model's numbers would all read 0.0 GiB)."""
    return f"{gib:.1f} GiB" if gib >= 1 else f"{gib * 1024:.1f} MiB"


def fit_message(fit: Fit) -> str:
    verdict = "fits" if fit.fits else "does NOT fit"
    return (f"the profile {verdict} each GPU: weights {size_text(fit.weights_gib)} + KV for one full context "
            f"{size_text(fit.kv_gib)} = {size_text(fit.needed_gib)} against {size_text(fit.budget_gib)} "
            f"({fit.fraction:g} of {size_text(fit.gpu_gib)}); {fit.detail}")
