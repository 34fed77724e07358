# SPDX-License-Identifier: Apache-2.0
"""The parallel_layout filter: a checked profile's layout as its engine runs it, the one source of its GPU count.

``profile | blackwell.serving.parallel_layout(engine, nnodes)`` returns the profile's ``tensor_parallel_size``,
``data_parallel_size``, ``attention_data_parallel_size`` and ``expert_parallel_size`` with ``world_size`` (tensor x
data ranks), ``nnodes`` and ``gpus_per_node``, by the rules of the engine's roster entry
(plugins/plugin_utils/parallel_layout.py). A layout the engine refuses fails naming the engine's rule: the input
check refuses the same before anything changes, so this fails only where a role is called around it.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import RosterError, load_roster
from ansible_collections.blackwell.serving.plugins.plugin_utils.parallel_layout import layout_of


def parallel_layout(profile: Mapping, engine: str, nnodes: object = 1) -> dict[str, int]:
    if not isinstance(profile, Mapping):
        raise AnsibleFilterError("parallel_layout: the profile must be a mapping")
    try:
        roster = load_roster()
    except RosterError as exc:
        raise AnsibleFilterError(f"parallel_layout: {exc}") from exc
    if engine not in roster:
        raise AnsibleFilterError(f"parallel_layout: engine {engine} is not in the engine roster ({', '.join(roster)})")
    try:
        nodes = int(str(nnodes))
    except ValueError:
        nodes = 0
    layout, problems = layout_of(profile, roster[engine], nodes)
    if layout is None:
        raise AnsibleFilterError(f"parallel_layout of {engine}: " + "; ".join(problems))
    return layout


class FilterModule:
    def filters(self) -> dict:
        return {"parallel_layout": parallel_layout}
