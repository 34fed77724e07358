# SPDX-License-Identifier: Apache-2.0
"""A profile's parallel layout, by its engine's rules: the one source of how many GPUs a release uses.

A profile names its layout with four keys: ``tensor_parallel_size``, ``data_parallel_size`` (replicas, each a tensor
parallel group of its own), ``attention_data_parallel_size`` (attention groups inside the tensor parallel group,
which the MoE layers still span) and ``expert_parallel_size`` (how many ranks the routed experts are split over).
What each engine accepts comes from its roster entry's ``layout`` (meta/engines.yml):

- ``expert_parallel``: ``divides_tensor`` (a width of its own that divides the tensor parallel size) or
  ``whole_world`` (a switch: on, the experts are split over every rank, tensor x data);
- ``attention_data_parallel``: ``divides_tensor`` or ``unsupported``;
- ``data_with_attention_data``: whether replicas and attention data parallelism go together;
- ``upstream``: where the engine of the pinned version has these rules (the messages name it).

The world is ``tensor x data`` ranks; attention data parallelism runs inside the tensor group and adds none. A
multi-node group spreads the world evenly over its nodes: the preflight's GPU count, the MIG check, the GPUs a
release scopes and the interconnect proof's world are ``gpus_per_node``, and the release document keeps the layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LAYOUT_KEYS = ("tensor_parallel_size", "data_parallel_size", "attention_data_parallel_size", "expert_parallel_size")
EXPERT_MODES = ("divides_tensor", "whole_world")
ATTENTION_MODES = ("divides_tensor", "unsupported")
LAYOUT_FIELDS = {"expert_parallel": str, "attention_data_parallel": str, "data_with_attention_data": bool,
                 "upstream": str}


def roster_layout_problems(name: str, layout: Any) -> list[str]:
    """What is wrong with one roster entry's `layout` (empty when nothing is)."""
    if not isinstance(layout, Mapping):
        return [f"{name}.layout must be a mapping"]
    problems = [f"{name}.layout.{key} is missing" for key in LAYOUT_FIELDS if key not in layout]
    problems += [f"{name}.layout.{key} is not a layout key (known: {', '.join(LAYOUT_FIELDS)})"
                 for key in layout if key not in LAYOUT_FIELDS]
    problems += [f"{name}.layout.{key} must be a {kind.__name__}" for key, kind in LAYOUT_FIELDS.items()
                 if key in layout and not isinstance(layout[key], kind)]
    if layout.get("expert_parallel") not in EXPERT_MODES:
        problems.append(f"{name}.layout.expert_parallel must be one of {', '.join(EXPERT_MODES)}")
    if layout.get("attention_data_parallel") not in ATTENTION_MODES:
        problems.append(f"{name}.layout.attention_data_parallel must be one of {', '.join(ATTENTION_MODES)}")
    return problems


def _sizes(profile: Mapping) -> tuple[dict[str, int], list[str]]:
    sizes, problems = {}, []
    for key in LAYOUT_KEYS:
        value = profile.get(key)
        if value is None and key != "tensor_parallel_size":  # the others default to 1
            value = 1
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{key} must be a whole number, got {value!r}")
        elif value < 1:
            problems.append(f"{key} must be at least 1, got {value}")
        else:
            sizes[key] = value
    return sizes, problems


def general_problems(profile: Mapping) -> list[str]:
    """The rules of every engine: sizes are whole numbers of at least 1, attention and expert widths fit the
    tensor and data groups they split."""
    sizes, problems = _sizes(profile)
    if problems:
        return problems
    tp, dp = sizes["tensor_parallel_size"], sizes["data_parallel_size"]
    attn, ep = sizes["attention_data_parallel_size"], sizes["expert_parallel_size"]
    if tp % attn:
        problems.append(f"attention_data_parallel_size {attn} does not divide tensor_parallel_size {tp}: the "
                        "attention groups split the tensor parallel group evenly")
    if ep > tp * dp:
        problems.append(f"expert_parallel_size {ep} is more than the {tp * dp} ranks of the layout "
                        f"(tensor_parallel_size {tp} x data_parallel_size {dp})")
    return problems


def engine_problems(profile: Mapping, entry: Mapping) -> list[str]:
    """The engine's own rules (its roster entry's `layout`), each message naming where the engine has it."""
    sizes, problems = _sizes(profile)
    if problems:
        return problems
    rules, engine = entry["layout"], entry["name"]
    where = f"{engine} refuses it ({rules['upstream']})"
    tp, dp = sizes["tensor_parallel_size"], sizes["data_parallel_size"]
    attn, ep = sizes["attention_data_parallel_size"], sizes["expert_parallel_size"]
    if attn > 1 and rules["attention_data_parallel"] == "unsupported":
        problems.append(f"attention_data_parallel_size {attn}: {engine} has no attention data parallelism inside a "
                        f"tensor parallel group; use data_parallel_size (each replica's attention on its own requests) "
                        f"with expert_parallel_size for the MoE layers")
    if attn > 1 and dp > 1 and not rules["data_with_attention_data"]:
        problems.append(f"data_parallel_size {dp} with attention_data_parallel_size {attn}: replicas and attention "
                        f"data parallelism together; {where}")
    if ep > 1 and rules["expert_parallel"] == "divides_tensor" and tp % ep:
        problems.append(f"expert_parallel_size {ep} does not divide tensor_parallel_size {tp}; {where}")
    if ep > 1 and rules["expert_parallel"] == "whole_world" and ep != tp * dp:
        problems.append(f"expert_parallel_size {ep}: {engine}'s expert parallelism is on or off, and on it spans "
                        f"every rank (tensor_parallel_size x data_parallel_size = {tp * dp}); set 1 or {tp * dp} "
                        f"({rules['upstream']})")
    return problems


def layout_of(profile: Mapping, entry: Mapping, nnodes: int = 1) -> tuple[dict[str, int] | None, list[str]]:
    """The layout a release of `profile` by the engine of `entry` runs, over `nnodes` nodes, or the problems."""
    problems = general_problems(profile) or engine_problems(profile, entry)
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        problems.append(f"the number of nodes must be a whole number of at least 1, got {nnodes!r}")
    if problems:
        return None, problems
    sizes, _ = _sizes(profile)
    world = sizes["tensor_parallel_size"] * sizes["data_parallel_size"]
    if world % nnodes:
        return None, [f"the layout's {world} ranks (tensor_parallel_size x data_parallel_size) do not spread evenly "
                      f"over the {nnodes} nodes of the group"]
    return {**sizes, "world_size": world, "nnodes": nnodes, "gpus_per_node": world // nnodes}, []
