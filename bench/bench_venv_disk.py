#!/usr/bin/env python3
"""What a second content-addressed engine venv costs on disk beside the first (role python_env).

Builds venv A from a requirement set and venv B from the same set with some pins changed (a version bump), each as
the role builds them (`uv venv --relocatable`, `uv pip sync`, one uv cache), first with uv's default link mode
(hard links from the cache where cache and venvs share a file system) and then with `--link-mode copy` (what a
cache on another file system gives), and prints each venv's size, what B adds beside A (`du` counts a hard-linked
file once) and each build's time. Run on the host (or any Linux machine) with a uv binary:

    python3 bench/bench_venv_disk.py --uv /opt/uv/0.13.9/bin/uv --requirements reqs.txt \\
        --bump sglang==0.5.22 --out bench/results [-- uv pip sync options, e.g. --extra-index-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def du_kib(*paths: Path) -> int:
    out = subprocess.run(["du", "-s", "-k", "-c", *map(str, paths)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1].split()[0])


def bumped(requirements: list[str], bumps: list[str]) -> list[str]:
    names = {b.split("==")[0].lower(): b for b in bumps}
    return [names.get(line.split("==")[0].lower(), line) for line in requirements]


def build(uv: str, venv: Path, requirements: list[str], *, python: str, cache: Path, link_mode: str,
          sync_options: list[str]) -> float:
    start = time.monotonic()
    env_args = {"env": {**os.environ, "UV_CACHE_DIR": str(cache), "UV_NO_CONFIG": "1"}}
    subprocess.run([uv, "venv", "-q", "--relocatable", "--python", python, str(venv)], check=True, **env_args)
    listing = venv / "requirements.txt"
    listing.write_text("\n".join(requirements) + "\n")
    subprocess.run([uv, "pip", "sync", "-q", "--python", str(venv / "bin" / "python"), "--link-mode", link_mode,
                    *sync_options, str(listing)], check=True, **env_args)
    return round(time.monotonic() - start, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uv", required=True)
    parser.add_argument("--requirements", required=True, type=Path, help="pinned lines (name==version)")
    parser.add_argument("--bump", action="append", required=True, help="name==version pins of venv B")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--workdir", type=Path, help="where venvs and cache go (default: a temporary directory)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("sync_options", nargs="*", help="after --: more `uv pip sync` options (indexes)")
    args = parser.parse_args()
    requirements = [line.strip() for line in args.requirements.read_text().splitlines()
                    if line.strip() and not line.startswith("#")]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="venv-disk-"))
    cache = work / "uv-cache"
    results: dict[str, dict] = {}
    try:
        # Warm the cache first (the host's cache holds what its earlier deploys downloaded).
        options = {"python": args.python, "cache": cache, "sync_options": args.sync_options}
        build(args.uv, work / "warm", requirements, link_mode="hardlink", **options)
        build(args.uv, work / "warm-b", bumped(requirements, args.bump), link_mode="hardlink", **options)
        for link_mode in ("hardlink", "copy"):
            a, b = work / f"{link_mode}-a", work / f"{link_mode}-b"
            seconds_a = build(args.uv, a, requirements, link_mode=link_mode, **options)
            seconds_b = build(args.uv, b, bumped(requirements, args.bump), link_mode=link_mode, **options)
            size_a, size_b, both = du_kib(a), du_kib(b), du_kib(a, b)
            results[link_mode] = {"a_mib": round(size_a / 1024), "b_alone_mib": round(size_b / 1024),
                                  "b_beside_a_mib": round((both - size_a) / 1024), "build_a_s": seconds_a,
                                  "build_b_s": seconds_b}
            print(f"{link_mode:8s} venv A {size_a / 1024:8.0f} MiB ({seconds_a} s); venv B alone "
                  f"{size_b / 1024:8.0f} MiB; B beside A {(both - size_a) / 1024:8.0f} MiB ({seconds_b} s)")
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    summary = {"packages": len(requirements), "bump": args.bump, "results": results}
    print(json.dumps(summary))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_venv_disk.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
