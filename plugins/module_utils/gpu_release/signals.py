"""gpu_release, signalling: SIGTERM, SIGKILL after the grace, and the waits until the targets left the GPUs.

Stdlib only; runs on the target.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release.gpus import Gpu
from ansible_collections.blackwell.serving.plugins.module_utils.host.procfs import Proc, is_alive


def send(proc: Proc, sig: int) -> bool:
    """Signal the exact process we selected: a pidfd is opened first, then the start time is re-checked."""
    pidfd = None
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):
        pidfd = None  # no pidfd support (old kernel, some sandboxes): fall back to kill(2) after the check
    try:
        if not is_alive(proc.pid, proc.starttime):
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(proc.pid, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def since(self, t: float | None = None) -> float:
        return round(time.monotonic() - (self.t0 if t is None else t), 3)


def terminate(
    targets: dict[int, Proc], params: dict[str, Any], signalled: dict[str, list[int]]
) -> tuple[dict[int, float], float]:
    """SIGTERM all, poll, SIGKILL the rest after the grace, poll until gone or timeout.

    Returns (pid -> seconds from SIGTERM to exit, monotonic time of the SIGTERM).
    """
    interval = max(params["poll_interval_ms"], 1) / 1000.0
    t_term = time.monotonic()
    exited: dict[int, float] = {}
    for proc in targets.values():
        if send(proc, signal.SIGTERM):
            signalled["TERM"].append(proc.pid)
        else:
            exited[proc.pid] = 0.0
    killed = False
    while True:
        now = time.monotonic()
        for proc in targets.values():
            if proc.pid not in exited and not is_alive(proc.pid, proc.starttime):
                exited[proc.pid] = round(now - t_term, 3)
        alive = [p for p in targets.values() if p.pid not in exited]
        if not alive:
            break
        if not killed and now - t_term >= params["grace_s"]:
            killed = True
            for proc in alive:
                if send(proc, signal.SIGKILL):
                    signalled["KILL"].append(proc.pid)
            continue
        if now - t_term >= params["timeout_s"]:
            break
        time.sleep(interval)
    return exited, t_term


def wait_for_gpu_release(
    gpu: Gpu,
    *,
    watch_target: set[int],
    watch_unmapped: set[int],
    explained: int,
    params: dict[str, Any],
    t_term: float,
) -> set[int]:
    """Poll compute apps until no target PID is listed; returns the targets still listed at the timeout.

    Apps whose PID is not visible here (``watch_unmapped``: nvidia-smi answered with PIDs of another PID
    namespace) are waited for until no more of them are left than live non-target holders explain
    (``explained``), for at most ``settle_s``.
    """
    interval = max(params["poll_interval_ms"], 1) / 1000.0
    t_gone = time.monotonic()
    while True:
        listed = {a["pid"] for a in gpu.query_apps()}
        left_targets = listed & watch_target
        left_unmapped = listed & watch_unmapped
        now = time.monotonic()
        unmapped_done = len(left_unmapped) <= explained or now - t_gone >= params["settle_s"]
        if (not left_targets and unmapped_done) or now - t_term >= params["timeout_s"]:
            return left_targets
        time.sleep(interval)


def wait_for_memory_to_settle(gpu: Gpu, params: dict[str, Any], readings: int = 3) -> None:
    """Where nvidia-smi does not list the targets by PID, wait for memory.used to read the same 3 times."""
    interval = max(params["poll_interval_ms"], 1) / 1000.0
    deadline = time.monotonic() + params["settle_s"]
    history: list[list[int | None]] = []
    while time.monotonic() < deadline:
        history.append([g["memory_used_mib"] for g in gpu.query_gpus()])
        if len(history) >= readings and all(h == history[-1] for h in history[-readings:]):
            return
        time.sleep(interval)
