"""plugins/filter/release_document.py: the release document's schema check as playbooks use it."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.blackwell.serving.plugins.filter.release_document import release_document

VALID = {
    "schema": 1, "id": "e-abc", "engine": "e", "engine_version": "1.0", "profile": "p", "unit": "e.service",
    "port": 30000, "listen_address": "127.0.0.1", "base_url": "http://127.0.0.1:30000",
    "health_url": "http://127.0.0.1:30000/health", "ready_timeout_s": 900, "stall_timeout_s": 600, "gate": "smoke",
    "exec_start": ["/opt/e/venv/bin/e", "serve"], "interconnect_proof": {}, "venv": "/opt/e/venv",
    "executable": "/opt/e/venv/bin/e", "served_model_name": "m", "speculative": False, "tokenizer": "/models/m",
    "trust_remote_code": False, "speculative_num_steps": 0, "speculative_settings": {}, "model_paths": ["/models/m"],
    "tensor_parallel_size": 8, "max_running_requests": None, "bench": {"module": "e.bench"},
}


def test_the_filter_names_the_key_the_schema_and_the_docs() -> None:
    with pytest.raises(AnsibleFilterError, match=r"^/x/release.json: port must be an integer, got string '30000' "
                                                 r"\(release document schema 1, docs/release-document.md\)$"):
        release_document({**VALID, "port": "30000"}, "/x/release.json")


def test_the_filter_fills_in_the_optional_keys() -> None:
    assert release_document(VALID) == {**VALID, "node_rank": 0, "nnodes": 1, "engine_facts": {}, "layout": {}}
