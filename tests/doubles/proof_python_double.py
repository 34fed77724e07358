#!/usr/bin/env python3
"""INTERCONNECT PROOF INTERPRETER TEST DOUBLE: stands in for the engine venv's python on hosts without torch.

Never install it on a real host. A deploy runs ``<engine python> interconnect_proof.py --world-size N ...``; on
the sandbox hosts that python is this file. It runs the REAL proof script's parent side (imported from the path
it is given): argument parsing, the MIG check through nvidia-smi, the deadline that kills ranks still running,
the rank reports, the IOMMU/ACS diagnostics and the JSON report with uid, user and NCCL/CUDA environment. Only
the ranks are stand-ins: instead of importing torch and all-reducing, each writes the progress steps the real
rank writes (roles/engine_service/files/interconnect_proof.py ``run_rank``) and reports right sums with no
bandwidth. The report says ``test_double``.

BWS_PROOF_DOUBLE_FAULT makes it fail as a broken interconnect does:
    hang:<rank>   that rank joins the process group and never returns from its first all-reduce (the NCCL
                  peer-to-peer deadlock the proof exists for); the script's deadline kills it;
    crash:<rank>  that rank exits 1 while joining (a NCCL init error).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

MARKER = "INTERCONNECT PROOF INTERPRETER TEST DOUBLE (not torch)"
FAULT_ENV = "BWS_PROOF_DOUBLE_FAULT"


def load_script(path: str):
    spec = importlib.util.spec_from_file_location("interconnect_proof", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fault_for(rank: int) -> str | None:
    kind, _, which = os.environ.get(FAULT_ENV, "").partition(":")
    return kind if kind and which.strip() == str(rank) else None


def stand_in_rank(proof, args) -> int:
    """The progress protocol of the real run_rank, without torch."""
    workdir, rank = Path(args.workdir), args.rank
    proof.write_progress(workdir, rank, "importing torch")
    device = "cpu" if args.backend == "gloo" else f"cuda:{rank}"
    proof.write_progress(workdir, rank, "joining the process group", device=device)
    fault = fault_for(rank)
    if fault == "crash":
        print(f"{MARKER}: rank {rank} fails to join (BWS_PROOF_DOUBLE_FAULT)", file=sys.stderr, flush=True)
        return 1
    results = []
    for mib in args.sizes_mib:
        proof.write_progress(workdir, rank, f"all_reduce {mib:g} MiB", device=device, done=results)
        if fault == "hang":
            while True:
                time.sleep(3600)
        results.append({"mib": mib, "seconds": 0.0, "busbw_gbps": None, "wrong_elements": 0})
    proof.write_progress(workdir, rank, "finished", device=device, done=results, torch=MARKER, nccl=None)
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(f"usage: {sys.argv[0]} interconnect_proof.py [args]  ({MARKER})", file=sys.stderr)
        return 2
    script, args = argv[0], argv[1:]
    proof = load_script(script)
    parsed = proof.parse_args(args)
    if parsed.rank is not None:
        return stand_in_rank(proof, parsed)

    def start_ranks(options, workdir):
        ranks = []
        for rank in range(options.world_size):
            rank_argv = [sys.executable, os.path.abspath(__file__), script, "--rank", str(rank), "--workdir",
                         str(workdir), "--world-size", str(options.world_size), "--backend", options.backend,
                         "--timeout-s", str(options.timeout_s),
                         "--sizes-mib", ",".join(f"{m:g}" for m in options.sizes_mib)]
            with open(workdir / f"rank-{rank}.log", "wb") as log:
                ranks.append(subprocess.Popen(rank_argv, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        return ranks

    proof.start_ranks = start_ranks
    report = proof.prove(parsed)
    report["test_double"] = MARKER
    return proof.emit(report, parsed.json_out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
