# SPDX-License-Identifier: Apache-2.0
"""Lookup plugin: the engine roster (meta/engines.yml)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: engine_roster
author: the blackwell-llm-serving authors (!UNKNOWN)
short_description: The engines this collection can deploy, and what the engine-neutral roles need to know of each
description:
  - Reads the collection's engine roster, C(meta/engines.yml), and checks its shape (every key present and typed,
    units unique); a broken roster fails naming the entry and the key.
  - Without terms it returns the roster, a mapping of engine name to entry (each entry has its C(name) too).
  - Each term names one key of an entry (C(name), C(unit), C(service_user), C(process_patterns), ...); the result is
    that key over every engine in roster order, lists flattened. Use C(query) (or C(wantlist=true)) for these lists.
options:
  _terms:
    description: Roster keys to collect over every engine.
    required: false
    type: list
    elements: str
seealso:
  - module: blackwell.serving.gpu_release
"""

EXAMPLES = r"""
- name: Every engine's unit
  ansible.builtin.debug:
    msg: "{{ query('blackwell.serving.engine_roster', 'unit') }}"

- name: One engine's readiness bound
  ansible.builtin.debug:
    msg: "{{ lookup('blackwell.serving.engine_roster')[engine].readiness_timeout_s }}"
"""

RETURN = r"""
_raw:
  description: The roster (no terms), or the values of the named keys over every engine.
  type: list
  elements: raw
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import (
    RosterError,
    field_values,
    load_roster,
)


class LookupModule(LookupBase):
    def run(self, terms: list, variables: dict | None = None, **kwargs: object) -> list:
        self.set_options(var_options=variables, direct=kwargs)
        try:
            roster = load_roster()
            if not terms:
                return [roster]
            return [value for term in terms for value in field_values(roster, str(term))]
        except RosterError as exc:
            raise AnsibleLookupError(str(exc)) from exc
