"""engine_requests' bound runs from the last compiler progress (compile_unit): an engine builds kernels on first use,
silently, inside the request that first needs them (with EAGLE-3, SGLang's first sampled request builds FlashInfer's
`sampling` module and SGLang's tree_speculative_sampling_target_only: 90-110 s on 16 cores, against a 120 s smoke
timeout). Such a request fails only once its timeout has passed since the compilers stopped working.

The endpoint is a real local server; the unit's cgroup is a fake tree under tmp_path. Its compiler is either a fake
/proc entry (FakeCompiler) on a virtual clock, or the compiler TEST DOUBLE (tests/doubles/compiler_double.py) as a
real process, read through the real /proc in real time. Nothing here signals a process.

The virtual clock (VirtualClock) is the module's and progress.py's time: it moves only inside the module's wait on
the request (VirtualEvent.wait), and only while the handler is parked on it or the request is done, so the instants
the module computes are exact however loaded the machine is.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
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
LOOK_S = 0.25  # COMPILER_LOOK_S, pinned on the virtual clock so that the looks fall on known instants


class VirtualClock:
    """Virtual monotonic time for engine_requests, progress.py and the request's handler; what grows with it
    (FakeCompiler's ticks) is written as it moves, by the thread that moves it."""

    SETTLE_S = 60.0  # real seconds a handler gets to park or answer: a safety net against a lost request, no bound

    def __init__(self) -> None:
        self.now = 1000.0
        self.cond = threading.Condition()
        self.parked: dict[int, float | None] = {}  # handler thread -> the virtual moment it waits for (None: ever)
        self.on_advance: list = []

    def monotonic(self) -> float:
        with self.cond:
            return self.now

    def park(self, until: float | None) -> None:
        """Block the calling handler until virtual time reaches `until` (None: for ever, a hang)."""
        key = threading.get_ident()
        with self.cond:
            if until is not None and until <= self.now:
                return
            self.parked[key] = until
            self.cond.notify_all()
            while key in self.parked:
                self.cond.wait()

    def hang(self) -> None:
        self.park(None)

    def event(self) -> VirtualEvent:
        return VirtualEvent(self)

    def settle(self, event: VirtualEvent) -> None:
        """With the lock held: wait (really) until the handler is parked or the request is done."""
        deadline = time.monotonic() + self.SETTLE_S
        while not event.flag and not self.parked:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("the handler neither parked on the virtual clock nor answered")
            self.cond.wait(left)

    def advance(self, moment: float) -> None:
        """With the lock held: move to `moment`, update the doubles, wake the handlers due."""
        self.now = moment
        for callback in self.on_advance:
            callback(moment)
        for key in [key for key, until in self.parked.items() if until is not None and until <= moment]:
            del self.parked[key]
        self.cond.notify_all()


class VirtualEvent:
    """The module's `done` event: wait(t) lets t pass on the virtual clock, stopping when the request is done."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock, self.flag = clock, False

    def set(self) -> None:
        with self.clock.cond:
            self.flag = True
            self.clock.cond.notify_all()

    def is_set(self) -> bool:
        with self.clock.cond:
            return self.flag

    def wait(self, timeout: float) -> bool:
        clock = self.clock
        with clock.cond:
            end = clock.now + timeout
            while True:
                clock.settle(self)  # whatever the handler does at this instant happens before time moves on
                if self.flag or clock.now >= end:
                    return self.flag
                clock.advance(min([end, *(until for until in clock.parked.values() if until is not None)]))


@pytest.fixture
def clock(monkeypatch) -> VirtualClock:
    virtual = VirtualClock()
    monkeypatch.setattr(engine_requests, "time", virtual)
    monkeypatch.setattr(progress, "time", virtual)
    monkeypatch.setattr(engine_requests, "threading", SimpleNamespace(Thread=threading.Thread, Event=virtual.event))
    monkeypatch.setattr(engine_requests, "COMPILER_LOOK_S", LOOK_S)
    return virtual


class Sampler(JsonRoute):
    """POST: run `behaviour` (a callable standing in for the engine's first sampled forward), then answer 200;
    one that returns False never answers (a sampler that hangs after its compile; on the virtual clock a behaviour
    hangs by clock.hang() instead, parked where the clock sees it)."""

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
    """/proc/<pid>/{comm,cmdline,stat} of a cicc whose CPU ticks grow with virtual time while `work` runs (in the
    handler, parked on the clock until the work's end)."""

    TICKS_PER_S = 100

    def __init__(self, root: Path, procs: Path, clock: VirtualClock) -> None:
        self.dir = root / "proc" / str(COMPILER_PID)
        self.clock = clock
        self.ticks = 0
        procs.write_text(f"{COMPILER_PID}\n")

    def write(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "comm").write_text("cicc\n")
        (self.dir / "cmdline").write_bytes(b"cicc\0")
        (self.dir / "stat").write_text(f"{COMPILER_PID} (cicc) R 1 1 1 0 -1 0 0 0 0 0 {self.ticks} 0 0 0 20 0 1 0 "
                                       "77 1000 100\n")

    def work(self, seconds: float) -> None:
        clock = self.clock
        with clock.cond:
            begin, end, base = clock.now, clock.now + seconds, self.ticks
            self.write()

            def grow(now: float) -> None:
                ticks = base + round((min(now, end) - begin) * self.TICKS_PER_S)
                if ticks != self.ticks:
                    self.ticks = ticks
                    self.write()

            clock.on_advance.append(grow)
        clock.park(end)


@pytest.fixture
def compiler(unit, tmp_path, monkeypatch, clock) -> FakeCompiler:
    """A FakeCompiler in the unit's cgroup, /proc read from its fake tree."""
    monkeypatch.setattr(progress, "PROC_ROOT", str(tmp_path / "proc"))
    return FakeCompiler(tmp_path, unit, clock)


def smoke(capsys, endpoint: str, timeout: float, compile_unit: str = "sglang.service") -> dict:
    from ansible.module_utils.testing import patch_module_args

    args = {"base_url": endpoint, "compile_unit": compile_unit,
            "requests": [{"name": "smoke_sampled", "path": "/v1/chat/completions", "method": "POST",
                          "body": {"temperature": 0.6}, "timeout": timeout, "expect": [200]}]}
    with patch_module_args(args), pytest.raises(SystemExit):
        engine_requests.main()
    return json.loads(capsys.readouterr().out)["results"]["smoke_sampled"]


def test_a_compile_longer_than_the_timeout_does_not_fail_the_request(endpoint, compiler, capsys):
    """A kernel built at the first sampled request for 3 s, three times the 1 s timeout: answered, and the answer
    says how long it waited on the compiler."""
    Sampler.behaviour = staticmethod(lambda: compiler.work(3.0) or True)
    answer = smoke(capsys, endpoint, timeout=1.0)
    assert answer["status"] == 200, answer
    assert answer["elapsed_s"] == 3.0  # answered when the compile ended, 2 s past its own timeout
    # The first look (one LOOK_S in) sees the compiler at work, the last one before the answer 2.75 s in; each
    # progress moved the bound to 1 s after it.
    assert answer["compile_wait_s"] == 2.75 - LOOK_S, answer["compilers"]
    compilers = answer["compilers"]
    assert compilers["seen"] and compilers["names"] == ["cicc"] and compilers["problem"] is None
    assert compilers["first_seen_s"] == LOOK_S and compilers["last_progress_s"] == 2.75
    assert compilers["extended_s"] == 2.75
    assert compilers["cpu_s"] == round(275 / progress.clock_ticks(), 2)


def test_a_sampler_that_hangs_after_its_compile_fails_its_timeout_after_the_compiles_end(endpoint, compiler, capsys,
                                                                                         clock):
    compile_end: list[float] = []
    Sampler.behaviour = staticmethod(lambda: compiler.work(2.0) or compile_end.append(clock.now) or clock.hang())
    timeout = 2.0
    answer = smoke(capsys, endpoint, timeout=timeout)
    failed_at = clock.monotonic()
    assert answer["status"] == -1 and answer["msg"] == "Request failed: timed out (2 s after the last compiler " \
        "progress)", answer
    after_compile = failed_at - compile_end[0]
    assert timeout <= after_compile <= timeout + LOOK_S, after_compile
    assert after_compile == timeout  # here a look lands on the compile's last tick itself
    assert answer["elapsed_s"] == 2.0 + timeout
    assert answer["compile_wait_s"] == 2.0 - LOOK_S  # from the first look at work to the compile's end
    assert answer["compilers"]["extended_s"] == 2.0


def test_an_idle_compiler_does_not_extend_the_bound(endpoint, compiler, capsys, clock):
    """A wedged build: the compiler lives but does no work. The request fails at its own timeout."""
    compiler.ticks = 500
    compiler.write()
    Sampler.behaviour = staticmethod(clock.hang)
    answer = smoke(capsys, endpoint, timeout=1.0)
    assert answer["status"] == -1 and answer["msg"] == "Request failed: timed out (1 s after its start)"
    assert answer["elapsed_s"] == 1.0
    assert answer["compile_wait_s"] == 0.0 and answer["compilers"]["extended_s"] == 0.0
    assert answer["compilers"]["seen"] and answer["compilers"]["last_progress_s"] is None
    # seen from the baseline look; its CPU seconds are those it had then, none since
    assert answer["compilers"]["first_seen_s"] == 0.0
    assert answer["compilers"]["cpu_s"] == round(500 / progress.clock_ticks(), 2)


def test_the_compiler_double_building_at_the_first_request_passes(endpoint, unit, tmp_path, capsys):
    """The compiler TEST DOUBLE as a real process (read through the real /proc, in real time), building for 2.5 s
    as the engine's first sampled request would build its sampling kernels. The 60 s timeout is only a safety net
    (the bound's extension itself is shown on the virtual clock above): the outcome is asserted, not the time."""
    cache = tmp_path / "kernels"

    def build() -> bool:
        job = compiler_double.start(str(cache / "sampling.so"), 2.5)
        unit.write_text(f"{job.pid}\n")
        return job.wait() == 0

    Sampler.behaviour = staticmethod(build)
    answer = smoke(capsys, endpoint, timeout=60.0)
    assert answer["status"] == 200, answer
    assert (cache / "sampling.so").exists()
    assert answer["compilers"]["seen"] and answer["compilers"]["names"] == ["cicc"], answer["compilers"]
    assert answer["compilers"]["cpu_s"] > 0 and answer["compilers"]["problem"] is None


def test_without_a_control_group_the_plain_timeout_holds_and_says_why(endpoint, monkeypatch, capsys):
    monkeypatch.setattr(engine_requests, "unit_properties", lambda unit, names, timeout=None: {})
    Sampler.behaviour = staticmethod(lambda: False)
    answer = smoke(capsys, endpoint, timeout=0.5)
    assert answer["status"] == -1 and answer["msg"] == "Request failed: timed out"
    assert answer["compile_wait_s"] == 0.0
    assert answer["compilers"] == {"seen": False, "problem": "sglang.service has no control group here (it does "
                                                               "not run)"}


def test_without_compile_unit_the_answer_is_as_before(endpoint, capsys):
    Sampler.behaviour = staticmethod(lambda: True)
    answer = smoke(capsys, endpoint, timeout=1.0, compile_unit="")
    assert answer["status"] == 200 and "compilers" not in answer and "compile_wait_s" not in answer
