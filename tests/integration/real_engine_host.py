"""A systemd test host whose engine is the engine's REAL front end over the scripted backend.

The controller's test-engine venv (tests/scripted_engine/engine_venv.py) and the contract venv it reads are
mounted read-only into the host at /opt/bws-test-engine/; tests/sandbox/prepare_real_engine.yml then puts the
engine at the paths a real install uses (/opt/<engine>/venv/bin/<engine>, .../bin/python), so the deploy, the
unit, the journal, the config and key files, releases and rollback are the production ones, and the process the
unit starts is SGLang's or vLLM's own server, and verify's benchmark client is the engine's own. Used by
test_real_sglang_host.py and test_real_vllm_host.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.engine_host import REPO, EngineHost
from tests.integration.lifecycle_helpers import SMALL_VERIFY, inventory_vars

sys.path.insert(0, str(REPO / "tests" / "scripted_engine"))
import engine_venv

sys.path.insert(0, str(REPO / "tests"))
from engine_locks import load_lock

MOUNT = "/opt/bws-test-engine"
# The real front ends start in 15-30 s on 2 quiet cores (SGLang: three processes importing torch and SGLang, then
# its warm-up), and take minutes beside the other scenario hosts, silent while they import: a start was seen to
# write no journal line for 120 s under load. These hosts test the real start, not stall detection (the fault
# scenarios do): readiness and stall bounds are both 300 s here, against the sandbox's 60 and 30 s.
REAL_ENGINE_VARS = {"sglang_ready_timeout_s": 300, "vllm_ready_timeout_s": 300, "engine_service_ready_timeout_s": 300,
                    "sglang_stall_timeout_s": 300, "vllm_stall_timeout_s": 300, "engine_service_stall_timeout_s": 300}


def real_engine_venv(engine: str) -> Path:
    try:
        return engine_venv.build(engine)
    except SystemExit as failed:
        if os.environ.get("CI"):
            pytest.fail(f"the {engine} test-engine venv cannot be built: {failed}")
        pytest.skip(f"the {engine} test-engine venv cannot be built: {failed}")


def booted_real_engine_host(engine: str, name: str, workdir: Path, caps: list[str] | None = None,
                            **more_vars) -> Iterator[EngineHost]:
    """A sandbox-image host whose /opt/<engine>/venv is the real front end (a module fixture's body); `caps`:
    capabilities its root has besides SYS_ADMIN."""
    venv = real_engine_venv(engine)
    cache = venv.parents[1]
    host = EngineHost(name, workdir, volumes=[f"{cache / 'test-engine'}:{MOUNT}/test-engine:ro",
                                              f"{cache / 'contract'}:{MOUNT}/contract:ro"], caps=caps)
    # verify runs the engine's REAL benchmark client from the release's venv (the lock's bench module), not the
    # sandbox's bench-client double.
    bench = {"verify_bench_command": [f"/opt/{engine}/venv/bin/python", "-m", load_lock(engine)["bench"]["module"]]}
    host.write_inventory(inventory_vars(host, **REAL_ENGINE_VARS, **bench, **more_vars))
    host.boot_prepared()
    try:
        prepared = host.run_playbook("tests/sandbox/prepare_real_engine.yml",
                                     extravars={"real_engine": engine, "real_engine_core": "scripted",
                                                "real_engine_venv_name": venv.name})
        assert prepared.status == "successful", prepared.stdout[-3000:]
        yield host
    finally:
        host.destroy()


sys.path.insert(0, str(REPO / "tests" / "real_core"))
import real_core_venv  # noqa: E402  (tests/real_core/real_core_venv.py)

# The REAL-CORE TEST ENGINE loads a real model on the CPU: its start (imports, the model, its KV cache, the drafter)
# writes journal lines throughout; 300 s bound both the readiness and the stall beside the other scenario hosts.
# The variables the sandbox's opt-in gives too (tests/real_core/deploy-vars.yml), with the lock's path resolved here
# (the copied inventory is elsewhere).
REAL_CORE_VARS = {**yaml.safe_load((REPO / "tests" / "real_core" / "deploy-vars.yml").read_text()),
                  "vllm_lock_file": str(real_core_venv.LOCK)}


def booted_real_core_host(name: str, workdir: Path, caps: list[str] | None = None, **more_vars) -> Iterator[EngineHost]:
    """A sandbox-image host whose /opt/vllm/venv is the REAL-CORE TEST ENGINE, vLLM 0.32.0 CPU build, with the
    REAL-CORE TEST MODEL in /srv/models/real-core (a module fixture's body)."""
    try:
        venv = real_core_venv.build()
    except SystemExit as failed:
        if os.environ.get("CI"):
            pytest.fail(f"the {real_core_venv.LABEL} venv cannot be built: {failed}")
        pytest.skip(f"the {real_core_venv.LABEL} venv cannot be built: {failed}")
    cache = venv.parents[1]
    host = EngineHost(name, workdir, volumes=[f"{cache / 'real-core'}:{MOUNT}/real-core:ro",
                                              f"{cache / 'contract'}:{MOUNT}/contract:ro"], caps=caps,
                      shm_size="512m")  # vLLM's shared-memory message queue takes 160 MiB of /dev/shm
    # (the scenarios' smaller benchmark, SMALL_VERIFY, over the sandbox's)
    host.write_inventory(inventory_vars(host, **{**REAL_CORE_VARS, **SMALL_VERIFY, **more_vars}))
    host.boot_prepared()
    try:
        prepared = host.run_playbook("tests/sandbox/prepare_real_engine.yml",
                                     extravars={"real_engine": "vllm", "real_engine_core": "real",
                                                "real_engine_venv_name": venv.name})
        assert prepared.status == "successful", prepared.stdout[-3000:]
        yield host
    finally:
        host.destroy()
