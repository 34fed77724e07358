#!/usr/bin/env python3
"""TEST DOUBLE for one CUDA kernel build (a ninja job running nvcc's cicc/ptxas): never install it on a real host.

What a first-use JIT compile looks like from outside, as the engines run them (FlashInfer's jit/cpp_ext.py and
SGLang's kernels/jit/utils/compile/ninja.py call ninja, which starts each compiler job in a process group of its
own): a process named like a compiler (argv[0] and /proc/<pid>/comm, here ``cicc``) that burns CPU, writes its
object files little by little into the kernel cache, prints nothing, and publishes the module by a rename when done.
A warm cache (the module's file exists) builds nothing.

Faults, for the gates that must tell a compile from a hang:

* ``--stall-after S``: after S seconds of work the compiler stops working and sleeps (alive, idle: a wedged build);
* a kill of the caller leaves the job running unless its process group is killed too (its own session), as a real
  ninja job does.

Use from Python: ``build(module_file, seconds)`` (blocks; returns the seconds spent, 0 on a warm cache) or
``start(...)`` (returns the Popen). From a shell: ``compiler_double.py --out FILE --seconds S [--stall-after S]``.

Build log, for the tests that must tell which request or phase built (not how long it took): with
``COMPILER_DOUBLE_LOG=FILE`` in its environment (the caller's is inherited), each job appends one JSON line
``{"event": "start", "module": "<name>.so", "out": ..., "pid": ...}`` before it works and one with
``"event": "published"`` once the module is in place. Unset (the default), nothing is written.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import subprocess
import sys
import time

TITLE = "cicc"  # nvcc's front end, the longest-running process of a CUDA build
CHUNK = 64 * 1024  # written per half second of work: an object file growing
PR_SET_NAME = 15
LOG_ENV = "COMPILER_DOUBLE_LOG"  # the build log (see above); unset: none


def start(module_file: str, seconds: float, *, stall_after: float | None = None) -> subprocess.Popen:
    """Start the build job in a session and process group of its own, silent, named like the compiler."""
    argv = [TITLE, os.path.abspath(__file__), "--out", module_file, "--seconds", str(seconds)]
    if stall_after is not None:
        argv += ["--stall-after", str(stall_after)]
    return subprocess.Popen(argv, executable=sys.executable, start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def build(module_file: str, seconds: float, *, stall_after: float | None = None) -> float:
    """Build the module unless the cache has it; the seconds the build took (0.0 on a warm cache)."""
    if os.path.exists(module_file):
        return 0.0
    began = time.monotonic()
    job = start(module_file, seconds, stall_after=stall_after)
    if job.wait() != 0:
        raise RuntimeError(f"compiler double for {module_file} exited {job.returncode}")
    return time.monotonic() - began


def _name_process(title: str) -> None:
    """/proc/<pid>/comm as a compiler's (the engine's gates read comm or argv[0])."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, title.encode()[:15], 0, 0, 0)


def _log(event: str, module_file: str) -> None:
    """One line of the build log, appended in one write (O_APPEND), when COMPILER_DOUBLE_LOG names one."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    line = json.dumps({"event": event, "module": os.path.basename(module_file), "out": module_file,
                       "pid": os.getpid()}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _work(seconds: float, partial: str, stall_after: float | None) -> None:
    began = time.monotonic()
    next_write = began
    with open(partial, "ab") as handle:
        while (now := time.monotonic()) - began < seconds:
            if stall_after is not None and now - began >= stall_after:
                while True:  # alive and idle: no CPU, no bytes, no end
                    time.sleep(3600)
            if now >= next_write:
                handle.write(os.urandom(CHUNK))
                handle.flush()
                os.fsync(handle.fileno())
                next_write = now + 0.5
            sum(i * i for i in range(20000))  # CPU-bound, as a compiler is


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the module file the build publishes")
    parser.add_argument("--seconds", type=float, required=True, help="CPU-bound work before the module is published")
    parser.add_argument("--stall-after", type=float, default=None, help="stop working (alive, idle) after this long")
    args = parser.parse_args()
    _name_process(TITLE)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    partial = f"{args.out}.partial.{os.getpid()}"
    _log("start", args.out)
    try:
        _work(args.seconds, partial, args.stall_after)
        os.replace(partial, args.out)  # published whole, as SGLang's cache publishes by staging and rename
        _log("published", args.out)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return 0


if __name__ == "__main__":
    sys.exit(main())
