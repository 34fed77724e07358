"""model_store_entries (roles/model_store/filter_plugins/model_store.py) against the Jinja loop it replaced in
roles/model_store/tasks/main.yml, rendered by Ansible's own templar on the same profiles."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

REPO = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("model_store_filters",
                                               REPO / "roles/model_store/filter_plugins/model_store.py")
filters = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(filters)

OLD_ENTRIES = """
{%- set out = [] -%}
{%- for name in names -%}
{%-   for kind in ['model', 'drafter'] -%}
{%-     set spec = profiles[name][kind] -%}
{%-     if spec is not none -%}
{%-       set _ = out.append({'profile': name, 'kind': kind, 'path': spec.path,
                              'source': spec.source or {}}) -%}
{%-     endif -%}
{%-   endfor -%}
{%- endfor -%}
{{ out }}"""
PROFILES = {
    **yaml.safe_load((REPO / "inventory/production/group_vars/all/models.yml").read_text())["engine_profiles"],
    "no-source": {"model": {"path": "/srv/m", "source": None}, "drafter": None},
}


@pytest.mark.parametrize("names", [list(PROFILES), ["no-source"], [], list(reversed(PROFILES))])
def test_entries_as_the_jinja_loop_listed_them(names):
    expected = Templar(loader=DataLoader(), variables={"profiles": PROFILES, "names": names}).template(
        trust_as_template(OLD_ENTRIES))
    assert filters.model_store_entries(PROFILES, names) == expected


def test_a_profile_without_a_drafter_lists_only_its_model():
    assert [e["kind"] for e in filters.model_store_entries(PROFILES, ["no-source"])] == ["model"]
