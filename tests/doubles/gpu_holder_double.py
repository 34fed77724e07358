"""TEST DOUBLE: a process that holds GPU device files, GPU memory and /dev/shm entries like an engine worker.

Tests start it with the argv they want the release module to see (for example argv[0] =
``sglang::scheduler_TP0`` through ``subprocess.Popen(..., executable=sys.executable)`` and ``-c``), and
describe what it holds in the environment variable ``HOLDER_SPEC`` (JSON):

``open``         files to keep open (stand-in or real ``/dev/nvidia*``, ``/dev/shm`` entries)
``map``          files to ``mmap`` and then close (held only through ``/proc/<pid>/maps``)
``ignore_term``  ignore SIGTERM (only SIGKILL ends it)
``cuda_mib``     allocate this much memory on CUDA device 0 with PyTorch (real GPU tests)
``nvml``         call ``nvmlInit`` through ctypes (an NVML-only monitor: no CUDA context)
``child``        a spec for one forked child (its PID is printed too); with ``argv`` in it the child
                 re-executes this double under that argv (so its command line differs from the parent's)

When everything is held it prints ``ready <pid> [<child pid>]`` on stdout and sleeps until signalled.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import signal
import sys
import time

_KEEP: list = []


def hold(spec: dict) -> None:
    if spec.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for path in spec.get("open", []):
        _KEEP.append(open(path, "rb+" if not path.startswith("/dev/nvidia") else "rb"))  # noqa: SIM115
    for path in spec.get("map", []):
        with open(path, "r+b") as f:
            _KEEP.append(mmap.mmap(f.fileno(), 0))
    if spec.get("nvml"):
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        rc = lib.nvmlInit_v2()
        if rc != 0:
            raise SystemExit(f"nvmlInit_v2 failed: {rc}")
        _KEEP.append(lib)
    if spec.get("cuda_mib"):
        import torch

        _KEEP.append(torch.empty(int(spec["cuda_mib"]) * 2**20, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()


def main() -> None:
    spec = json.loads(os.environ["HOLDER_SPEC"])
    child_pid = None
    if spec.get("child"):
        read_end, write_end = os.pipe()
        child_pid = os.fork()
        if child_pid == 0:
            os.close(read_end)
            child = dict(spec["child"])
            argv = child.pop("argv", None)
            if argv:
                os.set_inheritable(write_end, True)
                env = {**os.environ, "HOLDER_SPEC": json.dumps(child), "HOLDER_READY_FD": str(write_end)}
                code = f"import runpy; runpy.run_path({os.path.abspath(__file__)!r}, run_name='__main__')"
                os.execve(sys.executable, [argv[0], "-c", code, *argv[1:]], env)
            hold(child)
            os.write(write_end, b"ok")
            os.close(write_end)
            while True:
                time.sleep(3600)
        os.close(write_end)
        if os.read(read_end, 2) != b"ok":
            raise SystemExit("child did not get ready")
        os.close(read_end)
    hold(spec)
    ready_fd = os.environ.pop("HOLDER_READY_FD", None)
    if ready_fd is not None:  # a re-executed child: tell the parent, not stdout
        os.write(int(ready_fd), b"ok")
        os.close(int(ready_fd))
        while True:
            time.sleep(3600)
    sys.stdout.write(f"ready {os.getpid()}" + (f" {child_pid}" if child_pid else "") + "\n")
    sys.stdout.flush()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
