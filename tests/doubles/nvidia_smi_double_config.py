#!/usr/bin/env python3
"""TEST DOUBLE configuration: the ``sim.json`` the nvidia-smi TEST DOUBLE (nvidia_smi_double.py) answers from,
built from a recorded host of tests/fixtures/nvidia-smi/, and the simulated GPUs installed on a test host. Never
install it, or what it writes, on a real host.

From the fixture directory it reads ``query-gpu-idle.csv`` (nvidia-smi's answer to the GPU query, columns as
tests/fixtures/nvidia-smi/README.md lists them: index, uuid, name, pci.bus_id, driver_version, compute_cap,
memory.used, memory.total, ...) and ``proc-driver-nvidia/`` (the driver's /proc files, which give each GPU's device
minor by bus id). The config names the fixture's GPUs with their minors, its driver version, the mode and the
directory of stand-in device files whose holders the double reports.

One source for every user of the simulated 8-GPU host: the GPU release tests (tests/integration/gpu_helpers.py,
``Sim``), the host scenarios (tests/integration/lifecycle_helpers.py, ``install_gpu_double``) and the sandbox
(tests/sandbox/prepare_host.yml).

    nvidia_smi_double_config.py --fixture DIR --dev-dir DIR [--mode M]   # the config (JSON) on stdout
    nvidia_smi_double_config.py --fixture DIR --bundle ROOT              # everything a host needs under ROOT (JSON)
    nvidia_smi_double_config.py --install < bundle                      # on the host: write it (stdlib only)

A bundle holds, for ROOT: the double, its config over ROOT/dev, an ``nvidia-smi`` wrapper that passes
``--config``, the fixture's driver /proc files (ROOT/proc-driver-nvidia) and the stand-in device files (ROOT/dev:
nvidia0..7, nvidiactl, nvidia-uvm, empty plain files). The sandbox's set-up builds it on the controller and installs
it with this same file run on the host (``python3 -c``), in one round trip. ``--install`` writes only what differs
(atomically) and never replaces a stand-in device file that exists (a process may hold it open); it prints the
paths it wrote as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

DOUBLE = "nvidia_smi_double.py"
DEVICE_FILES = [*(f"nvidia{minor}" for minor in range(8)), "nvidiactl", "nvidia-uvm"]


def _bus_key(bus_id: str) -> str:
    """nvidia-smi's ``00000000:01:00.0`` and the driver's ``0000:01:00.0`` as one key."""
    return bus_id.strip().lower()[-12:]


def fixture_minors(fixture: Path) -> dict[str, int]:
    """Bus id (as _bus_key) -> device minor, from the fixture's driver /proc files."""
    minors = {}
    for information in sorted((fixture / "proc-driver-nvidia" / "gpus").glob("*/information")):
        pairs = (line.split(":", 1) for line in information.read_text().splitlines() if ":" in line)
        fields = {key.strip(): value.strip() for key, value in pairs}
        minors[_bus_key(fields.get("Bus Location", information.parent.name))] = int(fields["Device Minor"])
    return minors


def _rows(fixture: Path) -> list[list[str]]:
    return [line.split(", ") for line in (fixture / "query-gpu-idle.csv").read_text().splitlines() if line.strip()]


def fixture_gpus(fixture: Path) -> list[dict[str, Any]]:
    """The fixture's GPUs as the double's config lists them (index order)."""
    minors = fixture_minors(fixture)
    return [
        {
            "index": int(row[0]),
            "minor": minors[_bus_key(row[3])],
            "uuid": row[1],
            "name": row[2],
            "pci_bus_id": row[3],
            "compute_cap": row[5],
            "memory_total_mib": int(row[7]),
        }
        for row in _rows(fixture)
    ]


def fixture_driver_version(fixture: Path) -> str:
    return _rows(fixture)[0][4]


def sim_config(
    fixture: Path, dev_dir: str | Path, mode: str = "ok", gpus: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The double's config for the fixture's host over stand-in device files in dev_dir (`gpus`: the fixture's,
    possibly changed by a test, e.g. a wedged GPU's utilisation)."""
    return {
        "dev_dir": str(dev_dir),
        "driver_version": fixture_driver_version(fixture),
        "mode": mode,
        "gpus": fixture_gpus(fixture) if gpus is None else gpus,
    }


def wrapper(root: str, python: str = "/usr/bin/python3") -> str:
    """The ``nvidia-smi`` the callers run: the double with its config."""
    return (
        "#!/bin/sh\n"
        "# NVIDIA-SMI TEST DOUBLE (tests/doubles/nvidia_smi_double.py): simulated GPUs, not NVIDIA's nvidia-smi.\n"
        f'exec {python} {root}/{DOUBLE} --config {root}/sim.json "$@"\n'
    )


def bundle(fixture: Path, root: str) -> dict[str, Any]:
    """Everything a host needs under `root` for the fixture's simulated GPUs (see the module docstring)."""
    proc = fixture / "proc-driver-nvidia"
    files = {
        DOUBLE: [(Path(__file__).parent / DOUBLE).read_text(), "0755"],
        "sim.json": [json.dumps(sim_config(fixture, f"{root}/dev"), indent=1) + "\n", "0644"],
        "nvidia-smi": [wrapper(root), "0755"],
    }
    for path in sorted(p for p in proc.rglob("*") if p.is_file()):
        files[f"proc-driver-nvidia/{path.relative_to(proc)}"] = [path.read_text(), "0644"]
    return {"root": root, "files": files, "device_files": [f"dev/{name}" for name in DEVICE_FILES]}


def install(spec: dict[str, Any]) -> list[str]:
    """Write a bundle under its root; the paths written."""
    root = spec["root"]
    written = []
    for relative, (content, mode) in sorted(spec["files"].items()):
        path = os.path.join(root, relative)
        try:
            with open(path, encoding="utf-8") as handle:
                same = handle.read() == content and os.stat(path).st_mode & 0o7777 == int(mode, 8)
        except OSError:
            same = False
        if same:
            continue
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".bws-")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(content)
        os.chmod(temporary, int(mode, 8))
        os.replace(temporary, path)
        written.append(path)
    for relative in spec["device_files"]:
        path = os.path.join(root, relative)
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            with open(path, "x"):
                pass
            os.chmod(path, 0o644)
            written.append(path)
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="TEST DOUBLE configuration: the nvidia-smi double's simulated GPUs")
    parser.add_argument("--fixture", type=Path, help="a directory of tests/fixtures/nvidia-smi/")
    parser.add_argument("--dev-dir", help="print the config, over stand-in device files in this directory")
    parser.add_argument("--mode", default="ok", choices=["ok", "no_driver", "hang"])
    parser.add_argument("--bundle", metavar="ROOT", help="print everything a host needs under ROOT")
    parser.add_argument("--install", action="store_true", help="write the bundle read from stdin")
    args = parser.parse_args(argv)
    if args.install:
        out: Any = {"written": install(json.load(sys.stdin))}
    elif args.fixture and args.bundle:
        out = bundle(args.fixture, args.bundle)
    elif args.fixture and args.dev_dir:
        out = sim_config(args.fixture, args.dev_dir, args.mode)
    else:
        parser.error("--fixture with --dev-dir or --bundle, or --install")
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
