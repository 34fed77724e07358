# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""Wedged GPUs (standard library only: runs on the target).

After a hang, killed engine processes can leave a GPU busy (utilisation above 0 %) or with memory held while
nvidia-smi lists no compute process on it any more; the next engine start on it hangs again. Such a GPU is
*wedged*: only ``nvidia-smi -r`` (with nothing using it) or a reboot clears it.

A single reading is not enough to say so: right after a process exits the driver may still be freeing its
memory (about 0.1-0.2 s on an H200), and ``utilization.gpu`` is an average over the last 1/6 to 1 s. So a GPU
is only *suspicious* on one reading and is read again, at growing intervals, until a reading shows it idle
(it was not wedged) or the readings cover ``window_s`` (it is wedged). A healthy host never pays for the
extra readings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# An idle GPU with no process reports 0 MiB used (recorded: H200, driver 580, persistence mode on) or a few MiB;
# anything an engine leaves behind is hundreds of MiB (a bare CUDA context) up to the whole GPU.
DEFAULT_IDLE_MEMORY_MIB = 256
DEFAULT_WINDOW_S = 1.5
FIRST_DELAY_S = 0.1

Sample = Callable[[], tuple[list[dict[str, Any]], list[dict[str, Any]]]]


def gpu_key(gpu: dict[str, Any]) -> str:
    return gpu.get("uuid") or gpu.get("bus_id") or str(gpu.get("index"))


def apps_on(gpu: dict[str, Any], apps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    uuid, bus_id = gpu.get("uuid"), gpu.get("bus_id")
    return [a for a in apps if (uuid and a.get("gpu_uuid") == uuid) or (bus_id and a.get("bus_id") == bus_id)]


def busy_without_process(
    gpu: dict[str, Any], apps: list[dict[str, Any]], idle_memory_mib: int
) -> dict[str, Any] | None:
    """The reading that makes a GPU with no compute process look stuck (None when it looks idle or is in use)."""
    if apps_on(gpu, apps):
        return None
    util = gpu.get("utilization_gpu_pct")
    used = gpu.get("memory_used_mib")
    busy = util is not None and util > 0
    holds = used is not None and used > idle_memory_mib
    return {"utilization_pct": util, "memory_used_mib": used} if busy or holds else None


def suspicious(
    gpus: list[dict[str, Any]], apps: list[dict[str, Any]], idle_memory_mib: int, keys: set[str]
) -> dict[str, dict[str, Any]]:
    """GPU key -> reading, for the GPUs among ``keys`` that look busy with no compute process."""
    found = {}
    for gpu in gpus:
        if gpu_key(gpu) in keys:
            reading = busy_without_process(gpu, apps, idle_memory_mib)
            if reading is not None:
                found[gpu_key(gpu)] = reading
    return found


def delays(window_s: float, first_s: float = FIRST_DELAY_S) -> list[float]:
    """Pauses before each re-reading: doubling from ``first_s`` until they add up to ``window_s``."""
    result: list[float] = []
    step = first_s
    while window_s > 0 and sum(result) < window_s:
        result.append(round(min(step, window_s - sum(result)), 3))
        step *= 2
    return result


def wedged_gpus(
    gpus: list[dict[str, Any]],
    apps: list[dict[str, Any]],
    *,
    sample: Sample,
    keys: set[str],
    idle_memory_mib: int = DEFAULT_IDLE_MEMORY_MIB,
    window_s: float = DEFAULT_WINDOW_S,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(GPU key -> {readings, seconds}, last gpus, last apps) for the GPUs among ``keys`` that stayed busy with
    no compute process over every reading of ``window_s``. ``sample`` reads (gpus, apps) again."""
    readings = {k: [r] for k, r in suspicious(gpus, apps, idle_memory_mib, keys).items()}
    waited = 0.0
    for pause in delays(window_s) if readings else []:
        sleep(pause)
        waited += pause
        gpus, apps = sample()
        now = suspicious(gpus, apps, idle_memory_mib, set(readings))
        readings = {k: [*readings[k], now[k]] for k in readings if k in now}
        if not readings:
            break
    wedged = {k: {"readings": r, "seconds": round(waited, 3)} for k, r in readings.items()}
    return wedged, gpus, apps


def wedged_text(reading_list: list[dict[str, Any]], seconds: float, idle_memory_mib: int) -> str:
    """``100 % utilisation and 40960 MiB used (idle <= 256 MiB) with no compute process over 5 readings in 1.5 s``."""
    last = reading_list[-1]
    parts = []
    if last["utilization_pct"]:
        parts.append(f"{last['utilization_pct']} % utilisation")
    if last["memory_used_mib"] is not None and last["memory_used_mib"] > idle_memory_mib:
        parts.append(f"{last['memory_used_mib']} MiB used (idle <= {idle_memory_mib} MiB)")
    what = " and ".join(parts) or "activity"
    return f"{what} with no compute process over {len(reading_list)} readings in {seconds:g} s"
