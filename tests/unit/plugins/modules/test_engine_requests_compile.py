"""engine_requests' bound runs from the last compiler progress (compile_unit): an engine builds kernels on first use,
silently, inside the request that first needs them (with EAGLE-3, SGLang's first sampled request builds FlashInfer's
`sampling` module and SGLang's tree_speculative_sampling_target_only: 90-110 s on 16 cores, against a 120 s smoke
timeout). Such a request fails only once its timeout has passed since the compilers stopped working.

The endpoint is a real local server; the unit's cgroup is a fake tree under tmp_path. Its compiler is either a fake
/proc entry written by a thread, or the compiler TEST DOUBLE (tests/doubles/compiler_double.py) as a real process,
read through the real /proc. Nothing here signals a process.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "tests"))
from module_utils_loader import load_library_module, load_module_util  # noqa: E402

engine_requests = load_library_module("engine_requests")
progress = load_module_util("engine.progress")
sys.path.insert(0, str(REPO / "tests" / "doubles"))
import compiler_double  # noqa: E402
from json_http_double import JsonRoute, serving  # noqa: E402

CONTROL_GROUP = "/system.slice/sglang.service"
COMPILER_PID = 6161


class Sampler(JsonRoute):
    """POST: run `behaviour` (a callable standing in for the engine's first sampled forward), then answer 200;
    one that returns False never answers (a sampler that hangs after its compile)."""

    behaviour: ClassVar = staticmethod(lambda: True)

    def answer(self, body: bytes) -> tuple[int, dict] | None:
        return (200, {"choices": []}) if type(self).behaviour() else None


@pytest.fixture
def endpoint():
    with serving(Sampler) as base_url:
        yield base_url


@pytest.fixture
def unit(tmp_path, monkeypatch):
    """sglang.service runs in CONTROL_GROUP (systemd's answer replaced); its cgroup.procs is returned."""
    monkeypatch.setattr(engine_requests, "unit_properties",
                        lambda unit, names, timeout=None: {"ControlGroup": CONTROL_GROUP})
    monkeypatch.setattr(progress, "CGROUP_ROOT", str(tmp_path / "cgroup"))
    group = tmp_path / "cgroup" / CONTROL_GROUP.strip("/")
    group.mkdir(parents=True)
    procs = group / "cgroup.procs"
    procs.write_text("")
    return procs


class FakeCompiler:
    """/proc/<pid>/{comm,cmdline,stat} of a cicc whose CPU ticks grow while `work` runs (from the handler)."""

    def __init__(self, root: Path, procs: Path) -> None:
        self.dir = root / "proc" / str(COMPILER_PID)
        self.ticks = 0
        procs.write_text(f"{COMPILER_PID}\n")

    def write(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "comm").write_text("cicc\n")
        (self.dir / "cmdline").write_bytes(b"cicc\0")
        (self.dir / "stat").write_text(f"{COMPILER_PID} (cicc) R 1 1 1 0 -1 0 0 0 0 0 {self.ticks} 0 0 0 20 0 1 0 "
                                       "77 1000 100\n")

    def work(self, seconds: float) -> None:
        self.write()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.ticks += 5
            self.write()
            time.sleep(0.1)


def smoke(capsys, endpoint: str, timeout: float, compile_unit: str = "sglang.service") -> tuple[dict, float]:
    from ansible.module_utils.testing import patch_module_args

    args = {"base_url": endpoint, "compile_unit": compile_unit,
            "requests": [{"name": "smoke_sampled", "path": "/v1/chat/completions", "method": "POST",
                          "body": {"temperature": 0.6}, "timeout": timeout, "expect": [200]}]}
    started = time.monotonic()
    with patch_module_args(args), pytest.raises(SystemExit):
        engine_requests.main()
    took = time.monotonic() - started
    return json.loads(capsys.readouterr().out)["results"]["smoke_sampled"], took


def test_a_compile_longer_than_the_timeout_does_not_fail_the_request(endpoint, unit, tmp_path, monkeypatch, capsys):
    """A kernel built at the first sampled request for 3 s, three times the 1 s timeout: answered, and the answer
    says how long it waited on the compiler."""
    monkeypatch.setattr(progress, "PROC_ROOT", str(tmp_path / "proc"))
    compiler = FakeCompiler(tmp_path, unit)
    Sampler.behaviour = staticmethod(lambda: compiler.work(3.0) or True)
    answer, took = smoke(capsys, endpoint, timeout=1.0)
    assert answer["status"] == 200, answer
    assert 3.0 <= took <= 3.0 + 1.0
    assert 2.3 <= answer["compile_wait_s"] <= 3.1, answer["compilers"]
    assert answer["compilers"]["seen"] and answer["compilers"]["names"] == ["cicc"]
    assert answer["compilers"]["extended_s"] > 1.0 and answer["compilers"]["problem"] is None


def test_a_sampler_that_hangs_after_its_compile_fails_within_the_bound_of_the_compiles_end(endpoint, unit, tmp_path,
                                                                                         monkeypatch, capsys):
    monkeypatch.setattr(progress, "PROC_ROOT", str(tmp_path / "proc"))
    compiler = FakeCompiler(tmp_path, unit)
    compile_end: list[float] = []
    Sampler.behaviour = staticmethod(lambda: compiler.work(2.0) or compile_end.append(time.monotonic()) or False)
    timeout = 2.0
    answer, _ = smoke(capsys, endpoint, timeout=timeout)
    failed_at = time.monotonic()
    assert answer["status"] == -1 and "timed out" in answer["msg"], answer
    assert "after the last compiler progress" in answer["msg"]
    after_compile = failed_at - compile_end[0]
    assert timeout - 0.15 <= after_compile <= timeout * 1.1 + 0.05, after_compile  # +0.05: the module's own exit
    assert 1.5 <= answer["compile_wait_s"] <= 2.1


def test_an_idle_compiler_does_not_extend_the_bound(endpoint, unit, tmp_path, monkeypatch, capsys):
    """A wedged build: the compiler lives but does no work. The request fails at its own timeout."""
    monkeypatch.setattr(progress, "PROC_ROOT", str(tmp_path / "proc"))
    compiler = FakeCompiler(tmp_path, unit)
    compiler.ticks = 500
    compiler.write()
    Sampler.behaviour = staticmethod(lambda: False)
    answer, took = smoke(capsys, endpoint, timeout=1.0)
    assert answer["status"] == -1 and "timed out (1 s after its start)" in answer["msg"]
    assert 1.0 <= took <= 1.1 + 0.2
    assert answer["compile_wait_s"] == 0.0 and answer["compilers"]["extended_s"] == 0.0
    assert answer["compilers"]["seen"] and answer["compilers"]["last_progress_s"] is None


def test_the_compiler_double_building_at_the_first_request_passes(endpoint, unit, tmp_path, capsys):
    """The compiler TEST DOUBLE as a real process (read through the real /proc), building for 2.5 s against a 1 s
    timeout, as the engine's first sampled request would build its sampling kernels."""
    cache = tmp_path / "kernels"

    def build() -> bool:
        job = compiler_double.start(str(cache / "sampling.so"), 2.5)
        unit.write_text(f"{job.pid}\n")
        return job.wait() == 0

    Sampler.behaviour = staticmethod(build)
    answer, _ = smoke(capsys, endpoint, timeout=1.0)
    assert answer["status"] == 200, answer
    assert (cache / "sampling.so").exists()
    assert answer["compilers"]["names"] == ["cicc"] and answer["compilers"]["cpu_s"] >= 1.0
    assert answer["compile_wait_s"] >= 1.5


def test_without_a_control_group_the_plain_timeout_holds_and_says_why(endpoint, monkeypatch, capsys):
    monkeypatch.setattr(engine_requests, "unit_properties", lambda unit, names, timeout=None: {})
    Sampler.behaviour = staticmethod(lambda: False)
    answer, took = smoke(capsys, endpoint, timeout=0.5)
    assert answer["status"] == -1 and answer["msg"] == "Request failed: timed out" and took <= 0.5 + 0.3
    assert answer["compilers"] == {"seen": False, "problem": "sglang.service has no control group here (it does "
                                                               "not run)"}


def test_without_compile_unit_the_answer_is_as_before(endpoint, capsys):
    Sampler.behaviour = staticmethod(lambda: True)
    answer, _ = smoke(capsys, endpoint, timeout=1.0, compile_unit="")
    assert answer["status"] == 200 and "compilers" not in answer and "compile_wait_s" not in answer
