"""model_store_entries (plugins/filter/model_store.py) against the Jinja loop it replaced in
roles/model_store/tasks/main.yml, rendered by Ansible's own templar on the same profiles."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

REPO = Path(__file__).resolve().parents[4]
_SPEC = importlib.util.spec_from_file_location("model_store_filters",
                                               REPO / "plugins/filter/model_store.py")
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
OLD_BATCHES = """
{%- set out = [] -%}
{%- for plan in plans -%}
{%-   set index = loop.index0 -%}
{%-   for batch in plan.batches -%}
{%-     set _ = out.append({'plan': index, 'dest': plan.dest, 'paths': batch.paths, 'label': batch.label}) -%}
{%-   endfor -%}
{%- endfor -%}
{{ out }}"""
PLANS = [  # model_fetch plan results, as the role registers them (only the keys the batching reads)
    {"dest": "/srv/models/a", "complete": False, "batches": [
        {"paths": ["model-00001-of-00002.safetensors"], "label": "1 file, 5.0 GiB"},
        {"paths": ["model-00002-of-00002.safetensors", "config.json"], "label": "2 files, 4.1 GiB"}]},
    {"dest": "/srv/models/b", "complete": True, "batches": []},
    {"dest": "/srv/models/c", "complete": False, "batches": [{"paths": ["x.safetensors"], "label": "1 file, 1 B"}]},
]
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


@pytest.mark.parametrize("plans", [PLANS, [], PLANS[1:]])
def test_batches_as_the_jinja_loop_grouped_them(plans):
    expected = Templar(loader=DataLoader(), variables={"plans": plans}).template(trust_as_template(OLD_BATCHES))
    assert filters.model_store_batches(plans) == expected
