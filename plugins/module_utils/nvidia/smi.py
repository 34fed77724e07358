# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""nvidia-smi CSV parsing and GPU facts (standard library only: runs on the target).

The queries below are the ones whose output is recorded in tests/fixtures/nvidia-smi/. nvidia-smi writes
``--format=csv,noheader,nounits`` as ``value, value, ...`` without quoting, so a field that may contain
", " (a process name) is re-assembled from the surplus columns.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

GPU_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "compute_cap",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "persistence_mode",
)
APP_FIELDS: tuple[str, ...] = ("pid", "process_name", "used_gpu_memory", "gpu_uuid", "gpu_bus_id")

QUERY_GPU_ARGS: tuple[str, ...] = ("--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits")
QUERY_APPS_ARGS: tuple[str, ...] = (
    "--query-compute-apps=" + ",".join(APP_FIELDS),
    "--format=csv,noheader,nounits",
)

# nvidia-smi prints these for values a board or driver does not report.
_MISSING_VALUES = {
    "[N/A]",
    "N/A",
    "[Not Supported]",
    "Not Supported",
    "[Unknown Error]",
    "[Insufficient Permissions]",
}

# Exit status 9 and this text are what nvidia-smi prints when the kernel driver is not loaded.
_NO_DRIVER_RE = re.compile(r"couldn't communicate with the NVIDIA driver|NVIDIA driver is not loaded", re.I)

Runner = Callable[[Sequence[str]], tuple[int, str, str]]


class NvidiaError(Exception):
    """nvidia-smi could not give facts; ``kind`` says why (missing_tool, no_driver, failed, parse)."""

    def __init__(self, kind: str, message: str, rc: int | None = None, output: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.rc = rc  # nvidia-smi's exit status and what it printed, when it ran and failed
        self.output = output


def _clean(value: str) -> str | None:
    value = value.strip()
    return None if value in _MISSING_VALUES or value == "" else value


def parse_csv(text: str, fields: Sequence[str], free_field: str | None = None) -> list[dict[str, str | None]]:
    """Parse nvidia-smi ``csv,noheader,nounits`` output into one dict per row.

    ``free_field`` names the column that may itself contain ", "; surplus columns are joined back into it.
    A row with too few columns raises NvidiaError('parse').
    """
    rows: list[dict[str, str | None]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(", ")
        if len(parts) > len(fields) and free_field is not None:
            pos = fields.index(free_field)
            extra = len(parts) - len(fields)
            parts = [*parts[:pos], ", ".join(parts[pos : pos + extra + 1]), *parts[pos + extra + 1 :]]
        if len(parts) != len(fields):
            raise NvidiaError(
                "parse",
                f"nvidia-smi line {lineno} has {len(parts)} columns, expected {len(fields)} "
                f"({', '.join(fields)}): {line!r}",
            )
        rows.append({name: _clean(value) for name, value in zip(fields, parts, strict=True)})
    return rows


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def normalize_bus_id(bus_id: str | None) -> str | None:
    """``00000000:00:06.0`` (nvidia-smi) and ``0000:00:06.0`` (/proc, sysfs) -> ``0000:00:06.0``."""
    if not bus_id:
        return None
    match = re.fullmatch(r"\s*([0-9a-fA-F]+):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])\s*", bus_id)
    if not match:
        return bus_id.strip().lower()
    domain, bus, dev, fn = match.groups()
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn, 16)}"


def gpus_from_csv(text: str) -> list[dict[str, Any]]:
    gpus = []
    for row in parse_csv(text, GPU_FIELDS, free_field="name"):
        persistence = row["persistence_mode"]
        gpus.append(
            {
                "index": _int(row["index"]),
                "uuid": row["uuid"],
                "name": row["name"],
                "pci_bus_id": row["pci.bus_id"],
                "bus_id": normalize_bus_id(row["pci.bus_id"]),
                "driver_version": row["driver_version"],
                "compute_cap": row["compute_cap"],
                "memory_used_mib": _int(row["memory.used"]),
                "memory_total_mib": _int(row["memory.total"]),
                "utilization_gpu_pct": _int(row["utilization.gpu"]),
                "persistence_mode": None if persistence is None else persistence.lower() == "enabled",
            }
        )
    return gpus


def apps_from_csv(text: str) -> list[dict[str, Any]]:
    apps = []
    for row in parse_csv(text, APP_FIELDS, free_field="process_name"):
        apps.append(
            {
                "pid": _int(row["pid"]),
                "name": row["process_name"],
                "used_mib": _int(row["used_gpu_memory"]),
                "gpu_uuid": row["gpu_uuid"],
                "bus_id": normalize_bus_id(row["gpu_bus_id"]),
            }
        )
    return apps


def parse_information(text: str) -> dict[str, str]:
    """``/proc/driver/nvidia/gpus/<bus id>/information``: ``Key:  value`` lines."""
    info = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            info[key.strip()] = value.strip()
    return info


def read_driver_gpus(driver_proc_dir: str) -> dict[str, dict[str, Any]]:
    """Bus id -> {minor, uuid, model} from the driver's /proc files ({} when the driver is not loaded)."""
    gpus_dir = os.path.join(driver_proc_dir, "gpus")
    result: dict[str, dict[str, Any]] = {}
    try:
        entries = sorted(os.listdir(gpus_dir))
    except OSError:
        return result
    for entry in entries:
        try:
            with open(os.path.join(gpus_dir, entry, "information"), encoding="utf-8") as handle:
                info = parse_information(handle.read())
        except OSError:
            continue
        bus_id = normalize_bus_id(info.get("Bus Location") or entry)
        if bus_id is None:
            continue
        result[bus_id] = {
            "minor": _int(info.get("Device Minor")),
            "uuid": info.get("GPU UUID"),
            "model": info.get("Model"),
        }
    return result


def driver_loaded(driver_proc_dir: str) -> bool:
    return os.path.exists(os.path.join(driver_proc_dir, "version")) or os.path.isdir(
        os.path.join(driver_proc_dir, "gpus")
    )


# A wedged GPU or a hung driver makes nvidia-smi block for minutes: every call here has a timeout.
DEFAULT_TIMEOUT_S = 60.0


def timeout_message(argv: Sequence[str], timeout_s: float, setting: str) -> str:
    return (
        f"{' '.join(argv)} did not answer within {timeout_s:g} s ({setting}) and was killed: the driver or a GPU "
        "is hung. Check dmesg for Xid errors; `nvidia-smi -r` (GPUs idle) or a reboot clears it."
    )


def _start(argv: Sequence[str]) -> subprocess.Popen:
    # Its own process group, so that a timeout kills whatever a wrapper script started too.
    return subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _finish(proc: subprocess.Popen, argv: Sequence[str], timeout_s: float, setting: str) -> tuple[int, str, str]:
    """Wait for a started call; on timeout kill its process group and raise NvidiaError('timeout')."""
    try:
        out, err = proc.communicate(timeout=max(timeout_s, 0.001))
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        abandon(proc)
        raise NvidiaError("timeout", timeout_message(argv, timeout_s, setting)) from None


def abandon(proc: subprocess.Popen) -> None:
    """Kill a call's process group; never wait long for it (a process stuck in the driver cannot die)."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, 9)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1)


def timed_runner(timeout_s: float = DEFAULT_TIMEOUT_S, setting: str = "timeout") -> Runner:
    """A Runner that kills the call after ``timeout_s`` and raises NvidiaError('timeout') naming ``setting``."""

    def run(argv: Sequence[str]) -> tuple[int, str, str]:
        return _finish(_start(argv), argv, timeout_s, setting)

    return run


subprocess_runner = timed_runner()


def resolve_nvidia_smi(nvidia_smi: str) -> str | None:
    if os.sep in nvidia_smi:
        return nvidia_smi if os.access(nvidia_smi, os.X_OK) else None
    return shutil.which(nvidia_smi, path=os.environ.get("PATH", os.defpath) + ":/usr/bin:/usr/local/nvidia/bin")


def run_query(nvidia_smi: str, args: Sequence[str], runner: Runner = subprocess_runner) -> str:
    try:
        rc, out, err = runner([nvidia_smi, *args])
    except FileNotFoundError as exc:
        raise NvidiaError("missing_tool", f"nvidia-smi not runnable at {nvidia_smi}: {exc}") from exc
    return checked_output(nvidia_smi, args, rc, out, err)


def run_queries_together(
    nvidia_smi: str,
    arg_sets: Sequence[Sequence[str]],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    setting: str = "timeout",
) -> list[str]:
    """Several nvidia-smi queries started at once: each call costs 0.1-0.3 s of driver start-up, paid once.
    All of them share one deadline ``timeout_s``."""
    argvs = [[nvidia_smi, *args] for args in arg_sets]
    procs: list[subprocess.Popen] = []
    try:
        for argv in argvs:
            procs.append(_start(argv))
    except FileNotFoundError as exc:
        for proc in procs:
            abandon(proc)
        raise NvidiaError("missing_tool", f"nvidia-smi not runnable at {nvidia_smi}: {exc}") from exc
    deadline = time.monotonic() + timeout_s
    results = []
    for i, (argv, proc) in enumerate(zip(argvs, procs, strict=True)):
        try:
            results.append(_finish(proc, argv, deadline - time.monotonic(), setting))
        except NvidiaError as exc:
            for rest in procs[i + 1 :]:
                abandon(rest)
            raise NvidiaError(exc.kind, timeout_message(argv, timeout_s, setting)) from None
    return [checked_output(nvidia_smi, args, *res) for args, res in zip(arg_sets, results, strict=True)]


def checked_output(nvidia_smi: str, args: Sequence[str], rc: int, out: str, err: str) -> str:
    if rc != 0:
        text = (err or "") + (out or "")
        if _NO_DRIVER_RE.search(text):
            raise NvidiaError("no_driver", f"nvidia-smi cannot reach the NVIDIA driver (rc={rc}): {text.strip()}",
                              rc=rc, output=text.strip())
        raise NvidiaError("failed", f"{nvidia_smi} {' '.join(args)} failed (rc={rc}): {text.strip()}",
                          rc=rc, output=text.strip())
    return out


def query(nvidia_smi: str, runner: Runner = subprocess_runner) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(gpus, compute apps) from two nvidia-smi calls."""
    gpus = gpus_from_csv(run_query(nvidia_smi, QUERY_GPU_ARGS, runner))
    apps = apps_from_csv(run_query(nvidia_smi, QUERY_APPS_ARGS, runner))
    return gpus, apps


def attach_minors(gpus: list[dict[str, Any]], driver_gpus: dict[str, dict[str, Any]]) -> None:
    """Add ``minor`` (the N of /dev/nvidiaN) and where it came from to each GPU fact, in place."""
    for gpu in gpus:
        known = driver_gpus.get(gpu["bus_id"] or "")
        if known and known["minor"] is not None:
            gpu["minor"] = known["minor"]
            gpu["minor_source"] = "driver"
        else:
            gpu["minor"] = None
            gpu["minor_source"] = "unknown"


def attach_processes(gpus: list[dict[str, Any]], apps: list[dict[str, Any]]) -> None:
    """Add ``processes`` (pid, name, used_mib) to each GPU, matched by uuid, else by bus id."""
    for gpu in gpus:
        gpu["processes"] = [
            {"pid": app["pid"], "name": app["name"], "used_mib": app["used_mib"]}
            for app in apps
            if (app["gpu_uuid"] and app["gpu_uuid"] == gpu["uuid"])
            or (not app["gpu_uuid"] and app["bus_id"] and app["bus_id"] == gpu["bus_id"])
        ]


def gather(
    nvidia_smi: str = "nvidia-smi",
    driver_proc_dir: str = "/proc/driver/nvidia",
    runner: Runner = subprocess_runner,
) -> dict[str, Any]:
    """All GPU facts of this host. Raises NvidiaError naming whether the tool or the driver is missing."""
    loaded = driver_loaded(driver_proc_dir)
    tool = resolve_nvidia_smi(nvidia_smi)
    if tool is None:
        state = "is loaded" if loaded else f"is not loaded either ({driver_proc_dir} absent)"
        raise NvidiaError("missing_tool", f"nvidia-smi not found ({nvidia_smi}); the NVIDIA kernel driver {state}")
    gpus, apps = query(tool, runner)
    attach_minors(gpus, read_driver_gpus(driver_proc_dir))
    attach_processes(gpus, apps)
    driver_versions = sorted({g["driver_version"] for g in gpus if g["driver_version"]})
    return {
        "driver_loaded": True,
        "nvidia_smi": tool,
        "driver_version": driver_versions[0] if len(driver_versions) == 1 else None,
        "gpu_count": len(gpus),
        "gpus": gpus,
        "processes": apps,
    }


MIG_QUERY_ARGS = ("--query-gpu=index,mig.mode.current", "--format=csv,noheader,nounits")


def add_mig_modes(gpus: list, text: str) -> None:
    """Set mig_mode on each GPU from ``index, mig.mode.current`` rows ([N/A] on boards without MIG: None)."""
    modes = {}
    for line in text.splitlines():
        index, _, mode = line.partition(",")
        if index.strip().isdigit():
            mode = mode.strip()
            modes[int(index)] = None if mode.startswith("[") or mode in ("", "N/A") else mode
    for gpu in gpus:
        gpu["mig_mode"] = modes.get(gpu["index"])


def read_mig_modes(gpus: list[dict[str, Any]], nvidia_smi: str, runner: Runner) -> None:
    """Set mig_mode on each GPU; NvidiaError when nvidia-smi cannot tell."""
    rc, out, err = runner([nvidia_smi, *MIG_QUERY_ARGS])
    if rc != 0:
        raise NvidiaError("mig", f"nvidia-smi could not report the MIG mode (exit {rc}): {(err or out).strip()}")
    add_mig_modes(gpus, out)


def read_gpu_facts(nvidia_smi: str, driver_proc_dir: str, timeout_s: float, mig: bool = False,
                   setting: str = "nvidia_smi_timeout_s") -> dict[str, Any]:
    """gather() under a timeout (naming `setting` when it expires), with each GPU's MIG mode when `mig`."""
    runner = timed_runner(timeout_s, setting)
    facts = gather(nvidia_smi, driver_proc_dir, runner)
    if mig:
        read_mig_modes(facts["gpus"], facts["nvidia_smi"], runner)
    return facts


# ---------------------------------------------------------------- the PCI view (no driver needed)

NVIDIA_VENDOR = "0x10de"
DISPLAY_CLASS_PREFIX = "0x03"  # VGA (0x0300xx) and 3D (0x0302xx) controllers


def _sysfs(path: str) -> str:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def pci_gpus(pci_dir: str = "/sys/bus/pci/devices") -> list[dict[str, str]]:
    """NVIDIA display and 3D controllers as the kernel lists them, driver or not: bus_id (as in sysfs,
    0000:01:00.0) and device (the PCI device id, 0x2bb1), by bus id."""
    try:
        names = sorted(os.listdir(pci_dir))
    except OSError:
        return []
    found = []
    for name in names:
        device_dir = os.path.join(pci_dir, name)
        if _sysfs(os.path.join(device_dir, "vendor")) != NVIDIA_VENDOR:
            continue
        if _sysfs(os.path.join(device_dir, "class")).startswith(DISPLAY_CLASS_PREFIX):
            found.append({"bus_id": name, "device": _sysfs(os.path.join(device_dir, "device"))})
    return found
