#!/usr/bin/env python3
"""TEST DOUBLE for nvidia-smi: a GPU simulator over stand-in device files. Never install it on a real host.

It answers the two queries the modules use, in the exact format of the recorded H200 output
(tests/fixtures/nvidia-smi/), computed from which live processes hold which stand-in device files:

* a process that has ``<dev_dir>/nvidia-uvm`` and ``<dev_dir>/nvidiaN`` open is a compute app on the GPU
  whose device minor is N; one that has only ``nvidiaN``/``nvidiactl`` open, or has ``NVSIM_NVML_ONLY=1``
  in its environment, is an NVML client (not listed). A real NVML client opens ``nvidia-uvm`` as well
  (driver 580, H200), which ``NVSIM_NVML_ONLY`` lets tests reproduce;
* its memory on minor N is taken from its environment variable ``NVSIM_MEM_MIB`` (``"N:MiB,M:MiB"``), and
  defaults to ``default_app_mib`` on each GPU it holds when the variable is absent.

Usage: ``nvidia_smi_double.py --config sim.json --query-gpu=... --format=csv,noheader,nounits``.
The config (JSON) names ``dev_dir``, ``driver_version``, ``default_app_mib``, ``mode`` (``ok``, ``no_driver``
or ``hang``) and ``gpus`` (index, minor, uuid, name, pci_bus_id, compute_cap, memory_total_mib,
persistence_mode, mig_mode, and for a wedged GPU ``utilization_pct`` and ``leaked_mib``). Tests write a two-line
shell wrapper named ``nvidia-smi`` that passes ``--config``.

Two failure modes of the real tool on a GPU that a hang left behind:

* a wedged GPU: after the processes of a hung engine were killed, nvidia-smi lists no compute process on it but
  still reports utilisation (up to 100 %) and memory used (``utilization_pct``, ``leaked_mib`` on top of what
  live processes hold);
* ``mode: hang``: nvidia-smi itself blocks in the driver and does not answer (for minutes); the double sleeps
  and, like a process blocked in the kernel, does not end on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def holders(dev_dir: str) -> dict[int, tuple[set[int], bool, str]]:
    """pid -> (minors held, holds uvm, argv[0]) for every live process holding a stand-in device file."""
    prefix = os.path.realpath(dev_dir).rstrip("/") + "/nvidia"
    found: dict[int, tuple[set[int], bool, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        minors: set[int] = set()
        uvm = False
        for link in links:
            if not link.startswith(prefix):
                continue
            rest = link[len(prefix) :]
            if rest.isdigit():
                minors.add(int(rest))
            elif rest == "-uvm":
                uvm = True
        if minors or uvm:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv0 = f.read().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            found[pid] = (minors, uvm, argv0)
    return found


def environ_of(pid: int) -> dict[bytes, bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    except OSError:
        return {}


def memory_of(env: dict[bytes, bytes], minors: set[int], default_mib: int) -> dict[int, int]:
    spec = env.get(b"NVSIM_MEM_MIB")
    if spec is None:
        return dict.fromkeys(minors, default_mib)
    mem = {}
    for part in spec.decode().split(","):
        minor, _, mib = part.partition(":")
        if minor.strip().isdigit() and int(minor) in minors:
            mem[int(minor)] = int(mib)
    return mem


def compute_apps(config: dict) -> list[tuple[int, str, int, dict]]:
    by_minor = {g["minor"]: g for g in config["gpus"]}
    apps = []
    for pid, (minors, uvm, argv0) in sorted(holders(config["dev_dir"]).items()):
        env = environ_of(pid)
        if not uvm or env.get(b"NVSIM_NVML_ONLY") == b"1":
            continue
        for minor, mib in sorted(memory_of(env, minors, config.get("default_app_mib", 1024)).items()):
            if minor in by_minor:
                apps.append((pid, argv0, mib, by_minor[minor]))
    return apps


def gpu_value(gpu: dict, field: str, used: int, driver: str) -> str:
    values = {
        "index": str(gpu["index"]),
        "uuid": gpu["uuid"],
        "name": gpu["name"],
        "pci.bus_id": gpu["pci_bus_id"],
        "driver_version": driver,
        "compute_cap": gpu.get("compute_cap", "12.0"),
        "memory.used": str(used),
        "memory.total": str(gpu["memory_total_mib"]),
        "utilization.gpu": str(gpu.get("utilization_pct", 0)),
        "persistence_mode": "Enabled" if gpu.get("persistence_mode", True) else "Disabled",
        # "Enabled"/"Disabled" on MIG-capable boards (RTX PRO 6000 Blackwell, H200), "[N/A]" elsewhere.
        "mig.mode.current": gpu.get("mig_mode", "Disabled"),
    }
    if field not in values:
        raise SystemExit(f'Field "{field}" is not a valid field to query.')
    return values[field]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config", required=True)
    parser.add_argument("--query-gpu")
    parser.add_argument("--query-compute-apps")
    parser.add_argument("--format")
    args, _ = parser.parse_known_args(argv)
    with open(args.config, encoding="utf-8") as f:
        config = json.load(f)
    if config.get("mode") == "no_driver":
        sys.stdout.write(NO_DRIVER)
        return 9
    if config.get("mode") == "hang":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(3600)
    if args.format != "csv,noheader,nounits":
        sys.stderr.write("nvidia_smi_double: only --format=csv,noheader,nounits is simulated\n")
        return 2
    apps = compute_apps(config)
    if args.query_gpu:
        fields = args.query_gpu.split(",")
        for gpu in sorted(config["gpus"], key=lambda g: g["index"]):
            used = gpu.get("leaked_mib", 0) + sum(mib for _, _, mib, g in apps if g is gpu)
            print(", ".join(gpu_value(gpu, f, used, config["driver_version"]) for f in fields))
        return 0
    if args.query_compute_apps:
        for pid, name, mib, gpu in apps:
            row = {
                "pid": str(pid),
                "process_name": name,
                "used_gpu_memory": str(mib),
                "used_memory": str(mib),
                "gpu_uuid": gpu["uuid"],
                "gpu_bus_id": gpu["pci_bus_id"],
            }
            print(", ".join(row[f] for f in args.query_compute_apps.split(",")))
        return 0
    sys.stderr.write("nvidia_smi_double: only --query-gpu and --query-compute-apps are simulated\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
