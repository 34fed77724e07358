#!/usr/bin/env python3
"""Smoke of the interconnect proof script with NCCL on a real NVIDIA GPU (world size 1 by default).

At world size 1 NCCL moves no byte between GPUs: this proves the script (CUDA device selection, the engine's
in-process NCCL/CUDA settings, NCCL init through the file store, the float32 sizes, the small bfloat16 messages,
the all-reduce captured in a CUDA graph, the sum checks, the report, the MIG query) and not the interconnect;
the peer-write all-reduce reports "not run: needs >= 2 GPUs". The interconnect itself is proven only on a
multi-GPU host: pass ``--world-size N`` there (N GPUs visible).

    python3 tests/gpu/interconnect_proof_smoke.py [--python /path/to/python-with-cuda-torch] [--world-size N]
        [--engine sglang|vllm|none] [--custom-all-reduce] [--out tests/gpu/results] [--name interconnect_proof_smoke]

It copies the script and plugins/module_utils/host/pcie.py into a temporary directory (as a deploy ships them), runs the
proof inside a private PID namespace when it can (``unshare --pid --fork --mount-proc``, root), so the proof's
kill of stuck ranks can only reach its own processes, and writes ``<name>.json`` (default
``interconnect_proof_smoke.json``).
Exit status: the proof's.
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

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles" / "engine_service" / "files" / "interconnect_proof.py"
PCIE = REPO / "plugins" / "module_utils" / "host" / "pcie.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="an interpreter with CUDA torch")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--sizes-mib", default="1,64,256")
    parser.add_argument("--timeout-s", default="60")
    parser.add_argument("--engine", default="sglang", choices=["sglang", "vllm", "none"])
    parser.add_argument("--custom-all-reduce", action="store_true",
                        help="as a profile without disable-custom-all-reduce")
    parser.add_argument("--out", default=str(REPO / "tests" / "gpu" / "results"))
    parser.add_argument("--name", default="interconnect_proof_smoke")
    args = parser.parse_args()
    if shutil.which("nvidia-smi") is None:
        print("no nvidia-smi: this smoke needs a host with an NVIDIA GPU", file=sys.stderr)
        return 77
    with tempfile.TemporaryDirectory(prefix="bws-proof-smoke-") as tmp:
        shutil.copy(SCRIPT, tmp)
        shutil.copy(PCIE, tmp)
        argv = [args.python, str(Path(tmp) / SCRIPT.name), "--world-size", str(args.world_size), "--backend", "nccl",
                "--sizes-mib", args.sizes_mib, "--timeout-s", args.timeout_s, "--engine", args.engine]
        model = REPO / "roles" / args.engine / "files" / "interconnect_engine.py"  # the engine role's model
        if model.is_file():  # beside the script, as engine_service puts it on a host
            shipped_model = Path(tmp) / f"interconnect_engine_{args.engine}.py"
            shutil.copy(model, shipped_model)
            argv += ["--engine-model", str(shipped_model), "--env-prefixes", f"{args.engine.upper()}_"]
        argv += ["--custom-all-reduce"] if args.custom_all_reduce else []
        if os.geteuid() == 0 and shutil.which("unshare"):
            argv = ["unshare", "--pid", "--fork", "--mount-proc", *argv]
        env = dict(os.environ)
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(args.world_size))))
        start = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        wall = time.monotonic() - start
    sys.stderr.write(proc.stderr)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        print(proc.stdout, file=sys.stderr)
        return proc.returncode or 1
    report["smoke"] = {"wall_s": round(wall, 3), "argv": argv,
                       "note": "world size 1 proves the script and the engine's settings, not the interconnect: over "
                               "one rank NCCL launches no kernel for an in-place all-reduce, so the all-reduce times "
                               "are the calls' cost and the CUDA graph is empty"
                       if args.world_size == 1 else "multi-GPU: the interconnect itself"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out / f'{args.name}.json'} (exit {proc.returncode}, {wall:.1f} s)")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
