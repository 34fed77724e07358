"""The scripted model builds kernels on first use as the engines do (tests/scripted_engine/script.py, with the
compiler TEST DOUBLE): before ready and at the first sampled generation, with an empty kernel cache only; greedy
generations never build; unset, nothing is built. (The stall fault leaves an idle compiler for ever: it is tested
through the engine double, in a PID namespace, tests/unit/test_engine_double_compile.py.)

Which call built is read from the compiler double's build log (COMPILER_DOUBLE_LOG, inherited by the compiler it
starts) and the kernel cache, never from how long a call took: the tests hold on a loaded machine."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "scripted_engine"))
import script  # noqa: E402

SAFETY_S = 120.0  # how long a build may take on a loaded machine before the test gives up: not an asserted bound


def build_log(tmp_path: Path, monkeypatch) -> Path:
    """The compiler double's build log for this test (its jobs inherit this process's environment)."""
    log = tmp_path / "builds.log"
    monkeypatch.setenv("COMPILER_DOUBLE_LOG", str(log))
    return log


def builds(log: Path) -> list[tuple[str, str]]:
    """(event, module) for each whole line of the build log (a job may be writing one now): ("start", "start.so"),
    ("published", "start.so"), ..."""
    if not log.exists():
        return []
    lines = [line for line in log.read_text().split("\n")[:-1] if line]
    return [(e["event"], e["module"]) for e in map(json.loads, lines)]


def built_by(log: Path, call) -> list[tuple[str, str]]:
    """The build-log lines the call wrote (the builds it ran, start to publication)."""
    before = len(builds(log))
    call()
    return builds(log)[before:]


def test_unset_nothing_is_built_and_the_cache_is_the_service_users(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    log = build_log(tmp_path, monkeypatch)
    script_ = script.Script.from_env(env={})
    assert script_.kernel_cache == str(tmp_path / ".cache" / "sglang" / "jit")  # as SGLang 0.5.23's
    assert script.Script.from_env(env={}, engine="vllm").kernel_cache == str(tmp_path / ".cache" / "vllm")
    assert built_by(log, script_.on_start) == [] and built_by(log, lambda: script_.before_generate(sampled=True)) == []
    assert not log.exists(), "the compiler ran"
    assert not (tmp_path / ".cache").exists()


def test_a_cold_cache_builds_at_start_and_at_the_first_sampled_generation_only(tmp_path, monkeypatch):
    log = build_log(tmp_path, monkeypatch)
    env = {"SCRIPTED_ENGINE_COMPILE_START_S": "1", "SCRIPTED_ENGINE_COMPILE_SAMPLED_S": "1.5",
           "SCRIPTED_ENGINE_KERNEL_CACHE": str(tmp_path / "kernels")}
    script_ = script.Script.from_env(env=env)
    assert built_by(log, script_.on_start) == [("start", "start.so"), ("published", "start.so")]
    assert built_by(log, lambda: script_.before_generate(sampled=False)) == []  # greedy: no sampler, no build
    assert built_by(log, lambda: script_.before_generate(sampled=True)) == [
        ("start", "sampling.so"), ("published", "sampling.so")]
    assert built_by(log, lambda: script_.before_generate(sampled=True)) == []  # built once
    cache = tmp_path / "kernels"
    assert sorted(p.name for p in cache.iterdir()) == ["sampling.so", "start.so"]
    files = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.iterdir()}
    warm = script.Script.from_env(env=env)
    assert built_by(log, warm.on_start) == [] and built_by(log, lambda: warm.before_generate(sampled=True)) == []
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.iterdir()} == files, "a warm cache rebuilt"


def test_the_sampler_hangs_after_its_compile(tmp_path, monkeypatch):
    log = build_log(tmp_path, monkeypatch)
    env = {"SCRIPTED_ENGINE_FAULT": "sampler-hang", "SCRIPTED_ENGINE_COMPILE_SAMPLED_S": "1",
           "SCRIPTED_ENGINE_KERNEL_CACHE": str(tmp_path / "kernels")}
    script_ = script.Script.from_env(env=env)
    blocked = threading.Thread(target=script_.before_generate, kwargs={"sampled": True}, daemon=True)
    blocked.start()
    give_up = time.monotonic() + SAFETY_S
    while ("published", "sampling.so") not in builds(log) and blocked.is_alive() and time.monotonic() < give_up:
        time.sleep(0.05)
    assert builds(log) == [("start", "sampling.so"), ("published", "sampling.so")]
    blocked.join(0.5)  # a sampler that did not hang returns at once once its build is published
    assert blocked.is_alive() and (tmp_path / "kernels" / "sampling.so").exists()
