"""The scripted model builds kernels on first use as the engines do (tests/scripted_engine/script.py, with the
compiler TEST DOUBLE): before ready and at the first sampled generation, with an empty kernel cache only; greedy
generations never build; unset, nothing is built. (The stall fault leaves an idle compiler for ever: it is tested
through the engine double, in a PID namespace, tests/unit/test_engine_double_compile.py.)"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "scripted_engine"))
import script  # noqa: E402


def timed(call) -> float:
    start = time.monotonic()
    call()
    return time.monotonic() - start


def test_unset_nothing_is_built_and_the_cache_is_the_service_users(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    script_ = script.Script.from_env(env={})
    assert script_.kernel_cache == str(tmp_path / ".cache" / "sglang" / "jit")  # as SGLang 0.5.23's
    assert script.Script.from_env(env={}, engine="vllm").kernel_cache == str(tmp_path / ".cache" / "vllm")
    assert timed(script_.on_start) < 0.5 and timed(lambda: script_.before_generate(sampled=True)) < 0.5
    assert not (tmp_path / ".cache").exists()


def test_a_cold_cache_builds_at_start_and_at_the_first_sampled_generation_only(tmp_path):
    env = {"SCRIPTED_ENGINE_COMPILE_START_S": "1", "SCRIPTED_ENGINE_COMPILE_SAMPLED_S": "1.5",
           "SCRIPTED_ENGINE_KERNEL_CACHE": str(tmp_path / "kernels")}
    script_ = script.Script.from_env(env=env)
    assert 1.0 <= timed(script_.on_start) < 2.5
    assert timed(lambda: script_.before_generate(sampled=False)) < 0.5  # greedy: no sampler, no build
    assert 1.5 <= timed(lambda: script_.before_generate(sampled=True)) < 3.0
    assert timed(lambda: script_.before_generate(sampled=True)) < 0.5
    assert sorted(p.name for p in (tmp_path / "kernels").iterdir()) == ["sampling.so", "start.so"]
    warm = script.Script.from_env(env=env)
    assert timed(warm.on_start) < 0.5 and timed(lambda: warm.before_generate(sampled=True)) < 0.5


def test_the_sampler_hangs_after_its_compile(tmp_path):
    env = {"SCRIPTED_ENGINE_FAULT": "sampler-hang", "SCRIPTED_ENGINE_COMPILE_SAMPLED_S": "1",
           "SCRIPTED_ENGINE_KERNEL_CACHE": str(tmp_path / "kernels")}
    script_ = script.Script.from_env(env=env)
    blocked = threading.Thread(target=script_.before_generate, kwargs={"sampled": True}, daemon=True)
    blocked.start()
    blocked.join(3.0)
    assert blocked.is_alive() and (tmp_path / "kernels" / "sampling.so").exists()
