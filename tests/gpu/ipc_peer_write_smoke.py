#!/usr/bin/env python3
"""The interconnect proof's peer-write all-reduce (``ipc_all_reduce``) on one GPU, two processes.

The proof runs that step only at world size >= 2 with NCCL, one GPU per rank. On a one-GPU host this runs the
same function in two processes that share the GPU, over a gloo process group (NCCL refuses two ranks on one
GPU): each exports its inbox by CUDA IPC handle, opens the other's, writes into it and checks the sums. Both
ranks sit on one device, so nothing crosses PCIe: this shows the handle exchange, the mapping, the writes and
the check, not the fabric (that needs a multi-GPU host and the proof itself, ``interconnect_proof_smoke.py
--world-size N --custom-all-reduce``).

    python3 tests/gpu/ipc_peer_write_smoke.py [--out tests/gpu/results]

Writes ``ipc_peer_write_smoke.json``. Re-executes itself in a private PID namespace when it can (root).
Exit status: 0 passed, 1 failed, 77 no GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles" / "engine_service" / "files" / "interconnect_proof.py"
WORLD = 2


def load_proof():
    spec = importlib.util.spec_from_file_location("interconnect_proof", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rank_main(rank: int, store: str, out: str) -> int:
    import torch
    import torch.distributed as dist

    proof = load_proof()
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    args = argparse.Namespace(ipc_kib=256.0, iterations=10)
    result = proof.ipc_all_reduce(proof.RankContext(torch, dist, args, rank, WORLD, "cuda:0"))
    dist.destroy_process_group()
    Path(out).write_text(json.dumps({"rank": rank, **result, "torch": torch.__version__}))
    return 0 if result["status"] == "passed" else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "tests" / "gpu" / "results"))
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        return rank_main(args.rank, args.store, args.result)
    if shutil.which("nvidia-smi") is None:
        print("no nvidia-smi: this smoke needs a host with an NVIDIA GPU", file=sys.stderr)
        return 77
    if os.geteuid() == 0 and shutil.which("unshare") and os.environ.get("BWS_IN_PRIVATE_PID_NS") != "1":
        env = {**os.environ, "BWS_IN_PRIVATE_PID_NS": "1"}
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, *sys.argv],
                              env=env, check=False).returncode
    with tempfile.TemporaryDirectory(prefix="bws-ipc-smoke-") as tmp:
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(rank), "--store", f"{tmp}/store",
                                   "--result", f"{tmp}/rank-{rank}.json"]) for rank in range(WORLD)]
        try:
            codes = [proc.wait(timeout=120) for proc in procs]
        except subprocess.TimeoutExpired:
            for proc in procs:
                proc.kill()
            codes = [proc.wait() for proc in procs]
        ranks = []
        for rank in range(WORLD):
            try:
                ranks.append(json.loads(Path(f"{tmp}/rank-{rank}.json").read_text()))
            except (OSError, ValueError):
                ranks.append({"rank": rank, "status": "no result", "returncode": codes[rank]})
    report = {"ok": all(c == 0 for c in codes) and all(r.get("status") == "passed" for r in ranks),
              "ranks": ranks, "note": "two processes on one GPU over gloo: the CUDA IPC mechanics of the proof's "
                                      "peer-write step, not the PCIe fabric"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ipc_peer_write_smoke.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
