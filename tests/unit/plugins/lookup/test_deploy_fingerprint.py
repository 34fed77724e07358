"""The deploy fingerprint lookup: the same inputs give the same digest run after run; any variable of the deploy's
namespaces, the lock file or a file of the checkout that changes gives another; variables outside them do not count."""

from __future__ import annotations

import importlib

import pytest

from tests.module_utils_loader import use_repository_module_utils

use_repository_module_utils()
fp = importlib.import_module("ansible_collections.blackwell.serving.plugins.lookup.deploy_fingerprint")

PREFIXES = ["sglang_", "engine_"]
NAMES = ["groups"]


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "roles" / "r" / "__pycache__").mkdir(parents=True)
    (tmp_path / "roles" / "r" / "main.yml").write_text("a: 1\n")
    (tmp_path / "roles" / "r" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    lock = tmp_path / "lock.yml"
    lock.write_text("requirements: [sglang==0.5.23]\n")
    fp.tree_digest.cache_clear()
    return tmp_path


def digest(checkout, variables, **kwargs):
    fp.tree_digest.cache_clear()
    return fp.fingerprint(variables, PREFIXES, NAMES, trees=["roles"], files=[str(checkout / "lock.yml")],
                          root=checkout, **kwargs)


VARS = {"sglang_api_key": "k", "engine_profile": "kimi", "engine_profiles": {"kimi": {"b": 1, "a": [1, 2]}},
        "groups": {"gpu_servers": ["h1"]}, "sglang_port": "{{ 30000 + 1 }}", "omit": "__omit_place_holder__123",
        "ansible_host": "10.0.0.1"}


def test_the_same_inputs_give_the_same_digest(checkout):
    assert digest(checkout, VARS) == digest(checkout, dict(reversed(list(VARS.items()))))
    assert len(digest(checkout, VARS)) == 64


@pytest.mark.parametrize("change", [
    {"sglang_api_key": "rotated"}, {"engine_profile": "other"}, {"engine_profiles": {"kimi": {"b": 2, "a": [1, 2]}}},
    {"groups": {"gpu_servers": ["h1", "h2"]}}, {"sglang_new_option": True}, {"sglang_port": "{{ 30000 + 2 }}"},
])
def test_a_variable_of_the_deploy_changes_the_digest(checkout, change):
    assert digest(checkout, {**VARS, **change}) != digest(checkout, VARS)


@pytest.mark.parametrize("change", [{"omit": "__omit_place_holder__456"}, {"ansible_host": "10.0.0.2"},
                                    {"other_role_var": 1}])
def test_variables_outside_the_deploy_do_not_count(checkout, change):
    assert digest(checkout, {**VARS, **change}) == digest(checkout, VARS)


def test_an_excluded_variable_does_not_count(checkout):
    assert digest(checkout, {**VARS, "engine_service_noop_check": False}, exclude=("engine_service_noop_check",)) \
        == digest(checkout, VARS)


def test_the_checkout_and_the_lock_file_count_but_not_compiled_python(checkout):
    before = digest(checkout, VARS)
    (checkout / "roles" / "r" / "__pycache__" / "x.pyc").write_bytes(b"\1")
    assert digest(checkout, VARS) == before
    (checkout / "roles" / "r" / "main.yml").write_text("a: 2\n")
    changed_code = digest(checkout, VARS)
    assert changed_code != before
    (checkout / "lock.yml").write_text("requirements: [sglang==0.5.24]\n")
    assert digest(checkout, VARS) != changed_code


def test_a_missing_lock_file_fails_naming_it(checkout):
    (checkout / "lock.yml").unlink()
    with pytest.raises(Exception, match=r"lock\.yml cannot be read"):
        digest(checkout, VARS)
