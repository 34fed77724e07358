# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""Evidence that a starting engine unit makes progress besides its journal (standard library only: runs on the target).

An engine that writes no journal line for minutes may still be working: reading its weights from disk, setting up
its GPUs. Each source reads a counter that grows only while the engine does such work, and says why when it cannot:

- ``io_stat``: bytes the unit's cgroup read from block devices (``rbytes`` of its cgroup v2 ``io.stat``, summed over
  the devices). Readable by any user, and it keeps the bytes of processes that have exited; it exists where the io
  controller is enabled for the unit (cgroup v2 and ``IOAccounting=yes``, which the engine unit sets).
- ``proc_io``: ``read_bytes`` of ``/proc/<pid>/io`` of the processes in the unit's cgroup, read only where io.stat
  is not (a cgroup v1 or hybrid host). Needs ptrace rights over the engine's user (root with CAP_SYS_PTRACE),
  and forgets the bytes of processes that exit.
- ``gpu_memory``: the GPU memory the unit's processes hold (nvidia-smi's compute apps, MiB); progress when it
  reaches a new high. It grows in steps (the model created on the GPUs before its weights are read into it, the KV
  cache, CUDA graphs), not during a weight load. Read at most every GPU_SAMPLE_S seconds, each call killed after
  GPU_READ_S.

- ``compilers``: kernel builds, which are silent. SGLang 0.5.23 builds most of its kernels on first use (about 210
  ``load_jit(`` call sites under sglang/kernels/ops), serially, inside the first forward, and logs them only at debug
  level (sglang/kernels/jit/utils/compile/loader.py; ``SGLANG_JIT_LOG_RESOURCE_USAGE=1`` logs each build,
  sglang/kernels/jit/utils/compile/ninja.py, whose ninja gives up after 1800 s a build); FlashInfer's JIT modules
  (its ``sampling`` module at the first sampled request) and vLLM's torch.compile and Triton builds run compilers
  too. GPU memory is flat and little is read from disk meanwhile, so no other source moves. Progress is a process
  of the unit's cgroup named as a compiler (COMPILERS: its /proc/<pid>/comm or the basename of its argv[0]) whose CPU
  time (utime + stime of /proc/<pid>/stat, readable by any user) or bytes written (write_bytes of /proc/<pid>/io,
  where readable) grew since the last look; a live but idle compiler (a wedged build) is not progress. It also
  keeps the compile report (CompileReport): when a compiler was first seen, when one last made progress, and the CPU
  seconds they used.

Both byte counters count what reaches the block layer: a read served from the page cache counts in neither (a
warm start reads nothing from disk, and is quick).
"""

from __future__ import annotations

import os
import time

from ansible_collections.blackwell.serving.plugins.module_utils.host.procfs import unit_cgroup_pids
from ansible_collections.blackwell.serving.plugins.module_utils.nvidia.smi import (
    QUERY_APPS_ARGS,
    NvidiaError,
    apps_from_csv,
    resolve_nvidia_smi,
    run_query,
    timed_runner,
)

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_ROOT = "/proc"
GPU_SAMPLE_S = 5.0
GPU_READ_S = 10.0
# The processes of a kernel build, by /proc/<pid>/comm (15 characters at most) or argv[0]'s basename: ninja, which
# SGLang's (sglang/kernels/jit/utils/compile/ninja.py) and FlashInfer's JIT builds and torch's cpp_extension run;
# nvcc and what it runs for each .cu file (gcc's cc1plus as host preprocessor and compiler, cudafe++, cicc, ptxas,
# fatbinary, nvlink, the assembler and linker); Triton's ptxas (its backends/nvidia/bin/ptxas*) and the C compiler
# it builds its launchers with; torch.compile's (inductor's) C++ compiler. A Python compile worker (inductor's
# compile_worker) is a python process and is not counted: its compiler children are.
COMPILERS = frozenset({
    "ninja", "nvcc", "cudafe++", "cicc", "ptxas", "ptxas-blackwell", "fatbinary", "nvlink", "nvprune",
    "cc1plus", "cc1", "collect2", "as", "ld", "ld.bfd", "ld.gold", "ld.lld",
    "cc", "c++", "gcc", "g++", "clang", "clang++", "x86_64-linux-gnu-gcc", "x86_64-linux-gnu-g++",
})


class UnavailableError(Exception):
    """The source cannot be read here; the message says why."""


class UnitView:
    """The unit's control group (systemd's ControlGroup property) and, read once per poll, its processes."""

    def __init__(self, control_group: str | None) -> None:
        self.control_group = (control_group or "").strip()
        self._pids: list[int] | None = None

    def pids(self) -> list[int]:
        if not self.control_group:
            raise UnavailableError("the unit has no control group (it does not run)")
        if self._pids is None:
            self._pids = sorted(unit_cgroup_pids(CGROUP_ROOT, self.control_group))
        if not self._pids:
            raise UnavailableError(f"no process in the unit's cgroup {self.control_group}")
        return self._pids


class Source:
    """One counter that grows while the engine works; when it last grew, and the longest time it did not."""

    name = ""
    what = ""  # what the value counts, for messages

    def __init__(self, start: float) -> None:
        self.value: int | None = None
        self.problem: str | None = "not read yet"
        self.last_growth = start
        self.longest_silent = 0.0

    def read(self, unit: UnitView, budget_s: float) -> int:
        raise NotImplementedError

    def grew(self, value: int) -> bool:
        return self.value is not None and value > self.value

    def sample(self, now: float, unit: UnitView, budget_s: float) -> bool:
        """Read the counter; True when it grew since the last read (the first read only sets the baseline)."""
        try:
            value = self.read(unit, budget_s)
        except UnavailableError as why:
            self.problem = str(why)
            return False
        grew = self.grew(value)
        self.value, self.problem = value, None
        if grew:
            self.longest_silent = max(self.longest_silent, now - self.last_growth)
            self.last_growth = now
        return grew

    def report(self, now: float) -> dict:
        silent = now - self.last_growth
        return {"read": self.problem is None, "value": self.value, "counts": self.what, "problem": self.problem,
                "silent_s": round(silent, 3), "longest_silent_s": round(max(self.longest_silent, silent), 3)}

    def describe(self, now: float) -> str:
        if self.problem is not None:
            return f"{self.name}: {self.problem}"
        return f"{self.name}: {self.value} {self.what}, last grew {now - self.last_growth:.1f} s ago"


class IoStat(Source):
    name, what = "io_stat", "bytes read"

    def read(self, unit: UnitView, budget_s: float) -> int:
        if not unit.control_group:
            raise UnavailableError("the unit has no control group (it does not run)")
        relative = unit.control_group.strip("/")
        # cgroup v2 mounts the unified hierarchy at the root, a hybrid host under unified/ (without the io
        # controller, which cgroup v1's blkio holds there)
        places = [os.path.join(CGROUP_ROOT, base, relative, "io.stat") for base in ("", "unified")]
        for path in places:
            try:
                with open(path, encoding="ascii") as handle:
                    text = handle.read()
            except FileNotFoundError:
                continue
            except OSError as error:
                raise UnavailableError(f"{path}: {error.strerror}") from None
            # "259:0 rbytes=4096 wbytes=0 rios=1 wios=0 dbytes=0 dios=0" per device
            return sum(int(field[7:]) for line in text.splitlines() for field in line.split()
                       if field.startswith("rbytes=") and field[7:].isdigit())
        raise UnavailableError(f"no io.stat in the unit's cgroup ({' or '.join(places)}): the io controller is not "
                               "enabled for it (it needs cgroup v2 and IOAccounting=yes)")


class ProcIo(Source):
    name, what = "proc_io", "bytes read"

    def __init__(self, start: float) -> None:
        super().__init__(start)
        self.per_pid: dict[int, int] | None = None
        self.growth = False

    def read(self, unit: UnitView, budget_s: float) -> int:
        counts, denied = {}, None
        for pid in unit.pids():
            try:
                with open(f"{PROC_ROOT}/{pid}/io", encoding="ascii") as handle:
                    lines = handle.read().splitlines()
            except PermissionError as error:
                denied = error
                continue
            except OSError:  # the process exited meanwhile
                continue
            counts[pid] = next((int(line.split()[1]) for line in lines if line.startswith("read_bytes:")), 0)
        if not counts and denied is not None:
            raise UnavailableError(f"{PROC_ROOT}/<pid>/io of the unit's processes cannot be read ({denied.strerror}): "
                                   "it needs ptrace rights over the engine's user (root with CAP_SYS_PTRACE)")
        # Progress: a process read more than at the last look (one that appeared since, having read, too).
        before = self.per_pid
        self.growth = before is not None and any(count > before.get(pid, 0) for pid, count in counts.items())
        self.per_pid = counts
        return sum(counts.values())

    def grew(self, value: int) -> bool:
        return self.growth


class GpuMemory(Source):
    name, what = "gpu_memory", "MiB held"

    def __init__(self, start: float, nvidia_smi: str) -> None:
        super().__init__(start)
        self.nvidia_smi = nvidia_smi
        self.peak: int | None = None
        self.next_read = 0.0
        self.gone: str | None = None if nvidia_smi else "not read (no nvidia-smi given)"

    def read(self, unit: UnitView, budget_s: float) -> int:
        if self.gone:
            raise UnavailableError(self.gone)
        now = time.monotonic()
        if now < self.next_read and self.value is not None:
            return self.value
        self.next_read = now + GPU_SAMPLE_S
        path = resolve_nvidia_smi(self.nvidia_smi)
        if path is None:
            self.gone = f"{self.nvidia_smi} is not found or not executable"
            raise UnavailableError(self.gone)
        pids = set(unit.pids())
        timeout = max(0.5, min(GPU_READ_S, budget_s))
        try:
            apps = apps_from_csv(run_query(path, QUERY_APPS_ARGS, timed_runner(timeout, "engine_wait's GPU read")))
        except NvidiaError as error:
            if error.kind == "timeout":  # a hung driver: do not wait on it again in this wait
                self.gone = f"{error} (not asked again in this wait)"
            raise UnavailableError(str(error)) from None
        return sum(app["used_mib"] or 0 for app in apps if app["pid"] in pids)

    def grew(self, value: int) -> bool:
        grew = self.peak is not None and value > self.peak
        self.peak = value if self.peak is None else max(self.peak, value)
        return grew


def clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK")) or 100
    except (ValueError, OSError, AttributeError):
        return 100


def compiler_name(pid: int) -> str | None:
    """The compiler a process is (its comm, else argv[0]'s basename, in COMPILERS), or None."""
    try:
        with open(f"{PROC_ROOT}/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            comm = handle.read().strip()
    except OSError:
        return None
    if comm in COMPILERS:
        return comm
    try:
        with open(f"{PROC_ROOT}/{pid}/cmdline", "rb") as handle:
            argv0 = handle.read().split(b"\0", 1)[0].decode("utf-8", errors="replace")
    except OSError:
        return None
    base = os.path.basename(argv0.split(None, 1)[0]) if argv0.strip() else ""
    return base if base in COMPILERS else None


def compiler_counters(pid: int) -> tuple[int, int, int | None] | None:
    """(start time, utime + stime, write_bytes or None where /proc/<pid>/io is not readable) in clock ticks and
    bytes; None when the process is gone."""
    try:
        with open(f"{PROC_ROOT}/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so the fields start after the last ")"
    fields = text[text.rfind(")") + 2:].split()
    try:
        utime, stime, starttime = int(fields[11]), int(fields[12]), int(fields[19])
    except (IndexError, ValueError):
        return None
    written = None
    try:
        with open(f"{PROC_ROOT}/{pid}/io", encoding="ascii") as handle:
            written = next((int(line.split()[1]) for line in handle if line.startswith("write_bytes:")), None)
    except OSError:  # another user's process without ptrace rights: its CPU time still counts
        pass
    return starttime, utime + stime, written


class CompileReport:
    """What the compilers of a unit did while they were watched: first seen, last progress, CPU seconds."""

    def __init__(self) -> None:
        self.first_seen: float | None = None
        self.first_work: float | None = None
        self.last_progress: float | None = None
        self.cpu_ticks = 0
        self.names: set[str] = set()
        self.processes = 0
        self.working_now = 0

    def report(self, start: float, now: float, ticks_per_s: int) -> dict:
        """Offsets from `start` (the wait's or the request's), seconds."""
        seen = self.first_seen is not None
        return {"seen": seen,
                "first_seen_s": round(self.first_seen - start, 3) if seen else None,
                "last_progress_s": round(self.last_progress - start, 3) if self.last_progress is not None else None,
                "compile_s": round((self.last_progress or self.first_seen or now) - (self.first_seen or now), 3),
                "cpu_s": round(self.cpu_ticks / ticks_per_s, 2), "processes": self.processes,
                "names": sorted(self.names), "working_now": self.working_now,
                "silent_s": round(now - self.last_progress, 3) if self.last_progress is not None else None}

    def describe(self, start: float, now: float, ticks_per_s: int) -> str:
        if self.first_seen is None:
            return "no compiler seen"
        data = self.report(start, now, ticks_per_s)
        last = (f"last progress {now - self.last_progress:.1f} s ago" if self.last_progress is not None
                else "none made progress")
        return (f"{data['processes']} compiler process(es) ({', '.join(data['names'])}) seen from "
                f"{data['first_seen_s']:.1f} s, {data['compile_s']:.1f} s of compiling and {data['cpu_s']:g} CPU "
                f"seconds, {last}")


class Compilers(Source):
    """Compilers of the unit's cgroup at work (see the module's docstring). The value is their CPU time in ms."""

    name, what = "compilers", "ms of compiler CPU"

    def __init__(self, start: float) -> None:
        super().__init__(start)
        self.ticks_per_s = clock_ticks()
        # per process (pid, start time): [CPU ticks, write_bytes or None] at the last look
        self.seen: dict[tuple[int, int], list] = {}
        self.compile = CompileReport()
        self.growth = False
        self.looked = False

    def read(self, unit: UnitView, budget_s: float) -> int:
        now = time.monotonic()
        try:
            pids = unit.pids()
        except UnavailableError:
            pids = []  # no process, no compiler: not a reason to stop counting what exited
        growth, working = False, 0
        for pid in pids:
            name = compiler_name(pid)
            counters = compiler_counters(pid) if name else None
            if counters is None:
                continue
            starttime, ticks, written = counters
            key = (pid, starttime)
            before = self.seen.get(key)
            if self.compile.first_seen is None:
                self.compile.first_seen = now
            if before is None:
                self.compile.processes += 1
                self.compile.names.add(name)
                # a compiler born since the last look that already worked is progress; at the first look, only
                # the baseline
                grew = self.looked and (ticks > 0 or bool(written))
                self.compile.cpu_ticks += ticks
            else:
                grew = ticks > before[0] or (written is not None and before[1] is not None and written > before[1])
                self.compile.cpu_ticks += max(0, ticks - before[0])
            self.seen[key] = [ticks, written]
            if grew:
                working += 1
            growth = growth or grew
        self.looked = True
        self.growth = growth
        self.compile.working_now = working
        if growth:
            self.compile.last_progress = now
            if self.compile.first_work is None:
                self.compile.first_work = now
        return self.compile.cpu_ticks * 1000 // self.ticks_per_s

    def grew(self, value: int) -> bool:
        return self.growth

    def compile_report(self, start: float, now: float) -> dict:
        return self.compile.report(start, now, self.ticks_per_s)

    def describe(self, now: float) -> str:
        if self.problem is not None:
            return f"{self.name}: {self.problem}"
        if self.compile.first_seen is None:
            return f"{self.name}: none in the unit's cgroup"
        return (f"{self.name}: {self.compile.cpu_ticks / self.ticks_per_s:g} CPU seconds, last worked "
                f"{now - self.last_growth:.1f} s ago ({self.compile.working_now} working now)")


def sources(start: float, nvidia_smi: str) -> list[Source]:
    return [IoStat(start), ProcIo(start), GpuMemory(start, nvidia_smi), Compilers(start)]


def sample(progress: list[Source], now: float, unit: UnitView, budget_s: float) -> list[str]:
    """Read every source once; the names of those that grew. /proc/<pid>/io is read only where io.stat is not."""
    grew = []
    bytes_counted = False
    for source in progress:
        if isinstance(source, ProcIo) and bytes_counted:
            source.problem = "not read: io.stat counts these bytes"
            continue
        if source.sample(now, unit, budget_s):
            grew.append(source.name)
        bytes_counted = bytes_counted or (isinstance(source, IoStat) and source.problem is None)
    return grew
