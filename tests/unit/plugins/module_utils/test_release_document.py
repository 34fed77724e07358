"""plugins/module_utils/release/document.py: the release document's schema, version 1 and the reading of version 0."""

from __future__ import annotations

import json

import pytest

from tests.module_utils_loader import load_module_util

document = load_module_util("release.document")

ENGINE_FACTS = {
    "venv": "/opt/e/venv", "executable": "/opt/e/venv/bin/e", "served_model_name": "m", "speculative": True,
    "tokenizer": "/models/m", "trust_remote_code": False, "speculative_num_steps": 3,
    "speculative_settings": {"speculative-num-draft-tokens": 4}, "model_paths": ["/models/m", "/models/d"],
    "tensor_parallel_size": 8, "max_running_requests": None, "bench": {"module": "e.bench", "workloads": {}},
}
SERVICE = {
    "schema": 1, "id": "e-abc", "engine": "e", "engine_version": "1.0", "profile": "p", "unit": "e.service",
    "port": 30000, "listen_address": "127.0.0.1", "base_url": "http://127.0.0.1:30000",
    "health_url": "http://127.0.0.1:30000/health", "ready_timeout_s": 900, "stall_timeout_s": 600, "gate": "smoke",
    "exec_start": ["/opt/e/venv/bin/e", "serve"], "interconnect_proof": {},
}


def valid() -> dict:
    return json.loads(json.dumps({**ENGINE_FACTS, **SERVICE, "engine_facts": {"pcie_ipc_allreduce": False}}))


def test_a_deploys_document_passes_with_the_optional_keys_filled_in() -> None:
    checked = document.checked_document(valid())
    assert checked == {**valid(), "node_rank": 0, "nnodes": 1, "layout": {}}


@pytest.mark.parametrize(("key", "value", "said"), [
    ("tensor_parallel_size", "8", "tensor_parallel_size must be an integer, got string '8'"),
    ("speculative", "True", "speculative must be a boolean, got string 'True'"),
    ("port", True, "port must be an integer, got boolean"),
    ("max_running_requests", 1.5, "max_running_requests must be an integer or null"),
    ("model_paths", ["/m", 3], "model_paths must be a list of strings"),
    ("gate", "fast", "gate must be one of none, smoke, full, got 'fast'"),
    ("engine_facts", [], "engine_facts must be a mapping, got list"),
])
def test_a_wrong_type_is_refused_naming_the_key(key, value, said) -> None:
    with pytest.raises(document.DocumentError) as caught:
        document.checked_document({**valid(), key: value}, "the release document of e-abc")
    assert str(caught.value).startswith("the release document of e-abc: ")
    assert said in str(caught.value)


def test_missing_and_unknown_keys_are_all_named() -> None:
    broken = {**valid(), "pcie_ipc_allreduce": True}
    del broken["tokenizer"], broken["venv"]
    with pytest.raises(document.DocumentError) as caught:
        document.checked_document(broken)
    message = str(caught.value)
    assert "tokenizer is missing" in message and "venv is missing" in message
    assert "pcie_ipc_allreduce is not a key of the release document" in message
    assert "engine's own facts go under engine_facts" in message


def test_a_document_of_a_newer_schema_is_refused() -> None:
    with pytest.raises(document.DocumentError, match="schema 2, newer than this collection reads"):
        document.checked_document({**valid(), "schema": 2})


def version_0() -> dict:
    old = {key: value for key, value in valid().items()
           if key not in ("schema", "gate", "engine_facts", "stall_timeout_s", "speculative_settings",
                          "interconnect_proof", "bench")}
    return {**old, "patches": "applied", "created": "2026-01-01T00:00:00Z"}


def test_a_version_0_document_is_read_with_the_stated_defaults() -> None:
    checked = document.checked_document(version_0())
    assert checked["schema"] == 1
    assert {key: checked[key] for key in document.DEFAULTS_V0 if key != "engine_facts"} == {
        "gate": "smoke", "stall_timeout_s": 0, "speculative_settings": {}, "interconnect_proof": {}, "bench": {}}
    assert checked["engine_facts"] == {"patches": "applied"}, "keys the schema does not know are the engine's own"
    assert checked["created"] == "2026-01-01T00:00:00Z"


def test_a_version_0_document_keeps_what_it_recorded() -> None:
    old = {**version_0(), "gate": "full", "stall_timeout_s": 60}
    checked = document.checked_document(old)
    assert (checked["gate"], checked["stall_timeout_s"]) == ("full", 60)


def test_a_version_0_document_without_a_required_key_is_refused_naming_it() -> None:
    old = version_0()
    del old["tokenizer"]
    old["tensor_parallel_size"] = "8"
    with pytest.raises(document.DocumentError) as caught:
        document.checked_document(old, "/var/lib/llm-serving/releases/e-abc/release.json")
    assert "tokenizer is missing" in str(caught.value)
    assert "tensor_parallel_size must be an integer" in str(caught.value)


@pytest.mark.parametrize("value", [None, [], "release", 3])
def test_a_document_that_is_not_an_object_is_refused(value) -> None:
    with pytest.raises(document.DocumentError, match="must be a JSON object"):
        document.checked_document(value)


def test_subclasses_of_the_json_types_are_named_by_their_json_type() -> None:
    class TaggedStr(str):
        """As Ansible's templating hands strings over (a str subclass carrying its origin)."""

    with pytest.raises(document.DocumentError, match="port must be an integer, got string '30000'"):
        document.checked_document({**valid(), "port": TaggedStr("30000")})
