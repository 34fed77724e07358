"""SGLang 0.5.23's REAL front end (tests/scripted_engine/) on a systemd test host: deploy -> verify -> a failed
gate that rolls back -> teardown, with the production unit, config and key files (real_engine_host.py)."""

from __future__ import annotations

import pytest

from tests.integration import real_engine_scenario as scenario
from tests.integration.lifecycle_helpers import CONTAINER_MARKS, assert_api_key_nowhere
from tests.integration.real_engine_host import booted_real_engine_host

pytestmark = CONTAINER_MARKS
ENGINE = "sglang"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    yield from booted_real_engine_host(ENGINE, "bws-it-real-sglang", tmp_path_factory.mktemp("real-sglang"),
                                       engine_profile="sandbox-tiny-eagle3")


@pytest.fixture(scope="module")
def runs() -> list:
    return []


def test_deploy_serves_from_the_real_front_end(host, runs):
    scenario.deploy_serves_from_the_real_front_end(host, runs, ENGINE)


def test_verify_passes_with_the_real_parsers(host, runs):
    scenario.verify_passes_with_the_real_parsers(host, runs, ENGINE)


def test_a_sampler_hang_after_ready_rolls_back_at_the_smoke_timeout(host, runs):
    """The gate's failed-deploy case on this host: a deadlock after ready, in the sampler (a garbage answer's rollback
    runs on the vLLM host; both engines' rollbacks are the same engine_service tasks)."""
    scenario.sampler_hang_after_ready_rolls_back_at_the_smoke_timeout(host, runs, ENGINE)


def test_the_api_key_reaches_no_journal_argv_unit_or_runner_artifact(host, runs):
    """SGLang logs server_args=... with api_key on every start (srt/entrypoints/engine.py): the release's logging
    configuration redacts it (roles/sglang/files/bws_sglang_logging.py)."""
    assert scenario.secret_forms_in_journal(host, ENGINE) == []
    assert_api_key_nowhere(host, runs)


def test_the_controller_keeps_no_secret(host, runs):
    """SGLang's benchmark client saves /server_info in its result: the release's plugin blanks the keys there, and
    verify keeps only the numbers it uses (plugins/modules/bench_result.py), so the report folders and runner artifacts
    hold
    no form of the API key or of the admin key the host made; nor of the other secrets set for the CI run of verify
    (scenario.SECRETS)."""
    assert scenario.secret_forms_the_controller_keeps(host, runs, ENGINE) == []


def test_teardown_stops_the_engine(host, runs):
    scenario.teardown_stops_the_engine(host, runs, ENGINE)
