#!/usr/bin/env python3
"""Benchmark: teardown.yml (gpu_release) against the old fixed-sleep teardown, on a real NVIDIA GPU.

For each repetition it starts real CUDA holders (PyTorch, 2 GiB each), checks that nvidia-smi sees their
memory, runs ``playbooks/teardown.yml`` through ansible-runner (local connection) and reads the module's own
timings (``elapsed_s``: whole module; ``release_s``: SIGTERM until no target is alive or listed on the GPU),
so Ansible's start-up is not counted. Scenarios:

* ``term``:   two holders that exit on SIGTERM;
* ``ignore``: one that exits on SIGTERM and one that ignores it (SIGKILL after ``--grace`` seconds);
* ``old``:    the same two holders ended by the old sequence, applied only to this script's own PIDs:
              ``kill -9 <pids>; sleep 3; kill -9 <pids still holding>; sleep 2; nvidia-smi``.

An NVML-only monitor and a foreign CUDA process run through all repetitions: neither may be signalled.
At the end teardown.yml runs once more on the clean host and must report changed=0.

Everything runs in a private PID namespace (the script re-executes itself under ``unshare --pid --fork
--mount-proc``), so it can only reach processes it started. Needs root, an NVIDIA GPU and PyTorch.
``BWS_GPU_DRYRUN=1`` rehearses the script over the nvidia-smi test double (numbers are then not GPU results).

    python3 bench/bench_gpu_release.py --reps 5 --grace 2 --out bench/results
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gpu"))

from gpu_real import (  # noqa: E402
    INSIDE,
    alive,
    backend,
    changed_count,
    check_preconditions,
    gpu_unavailable_reason,
    release_result,
    run_playbook,
    write_json,
)

HOLDER_MIB = 2048


def reexec_in_pid_namespace() -> None:
    if os.environ.get(INSIDE) == "1":
        return
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        sys.exit("bench_gpu_release: needs root and unshare(1): it signals processes only in its own PID namespace")
    os.environ[INSIDE] = "1"
    os.execvp("unshare", ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, *sys.argv])


def start_pair(be, ignore_term: bool) -> tuple[list[int], dict]:
    spec, env = be.compute(HOLDER_MIB)
    pids = be.start(
        {
            "tp0": (["sglang::scheduler_TP0"], spec, env),
            "tp1": (["sglang::scheduler_TP1"], {**spec, "ignore_term": ignore_term}, env),
        }
    )
    return [pids["tp0"][0], pids["tp1"][0]], pids


def memory_used(be) -> int:
    return be.snapshot()["gpus"][0]["memory_used_mib"]


def run_module_rep(be, work: Path, scenario: str, *, grace: float, bystanders: list[int], idle: dict) -> dict:
    pair, _ = start_pair(be, ignore_term=scenario == "ignore")
    before = be.snapshot()
    pre = check_preconditions(be, idle, before, {"pair": (pair, HOLDER_MIB)}, [])
    runner, results = run_playbook(work, be.extravars(gpu_release_grace_s=grace, gpu_release_timeout_s=30))
    be.reap()
    after = be.snapshot()
    res = release_result(results)
    assert runner.rc == 0, runner.stdout.read()[-3000:]
    assert not any(alive(p) for p in pair), "a holder survived"
    assert all(alive(p) for p in bystanders), "a bystander was killed"
    freed = before["gpus"][0]["memory_used_mib"] - after["gpus"][0]["memory_used_mib"]
    assert freed >= 2 * HOLDER_MIB, f"only {freed} MiB freed"
    return {
        "scenario": scenario,
        "elapsed_s": res["elapsed_s"],
        "release_s": res["release_s"],
        "exit_s": {str(t["pid"]): t["exit_s"] for t in res["targets"]},
        "signals": {str(t["pid"]): t["signals"] for t in res["targets"]},
        "foreign_named": [f["pid"] for f in res["foreign_holders"]],
        "freed_mib": freed,
        "memory_before_mib": before["gpus"][0]["memory_used_mib"],
        "memory_after_mib": after["gpus"][0]["memory_used_mib"],
        "pid_mapping": pre["pid_mapping"],
    }


def run_old_rep(be, bystanders: list[int], idle: dict) -> dict:
    pair, _ = start_pair(be, ignore_term=False)
    before = be.snapshot()
    check_preconditions(be, idle, before, {"pair": (pair, HOLDER_MIB)}, [])
    t0 = time.monotonic()
    subprocess.run(["kill", "-9", *map(str, pair)], check=False)
    time.sleep(3)
    be.reap()
    still = [p for p in pair if alive(p)]
    if still:
        subprocess.run(["kill", "-9", *map(str, still)], check=False)
    time.sleep(2)
    subprocess.run([be.nvidia_smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"], check=True,
                   capture_output=True)  # fmt: skip
    wall = time.monotonic() - t0
    after = be.snapshot()
    assert all(alive(p) for p in bystanders), "a bystander was killed"
    return {
        "scenario": "old",
        "elapsed_s": round(wall, 3),
        "freed_mib": before["gpus"][0]["memory_used_mib"] - after["gpus"][0]["memory_used_mib"],
    }


def median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 3) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--grace", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    reexec_in_pid_namespace()
    reason = gpu_unavailable_reason()
    if reason:
        print(f"bench_gpu_release: cannot run: {reason}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-release-"))
    be = backend(work)
    rows: list[dict[str, Any]] = []
    try:
        idle = be.snapshot()
        bystanders = be.start_bystanders()
        idle = be.snapshot()  # the bystanders' memory is the new floor
        for rep in range(args.reps):
            for scenario in ("term", "ignore"):
                rows.append(run_module_rep(be, work, scenario, grace=args.grace, bystanders=bystanders, idle=idle))
                print(
                    f"rep {rep} {scenario}: {rows[-1]['elapsed_s']} s (release {rows[-1]['release_s']} s)",
                    flush=True,
                )
            rows.append(run_old_rep(be, bystanders, idle))
            print(f"rep {rep} old: {rows[-1]['elapsed_s']} s", flush=True)
        clean_runner, clean_results = run_playbook(work, be.extravars(gpu_release_grace_s=args.grace))
        clean_changed = changed_count(clean_runner)
        final = be.snapshot()
        bystanders_alive = all(alive(p) for p in bystanders)
    finally:
        be.stop_all()

    by = {s: [r for r in rows if r["scenario"] == s] for s in ("term", "ignore", "old")}
    old = median(by["old"], "elapsed_s")
    table = []
    for s in ("term", "ignore"):
        elapsed = median(by[s], "elapsed_s")
        table.append(
            {
                "scenario": s,
                "module_elapsed_s": elapsed,
                "release_s": median(by[s], "release_s"),
                "old_sequence_s": old,
                "speedup": round(old / elapsed, 1) if elapsed else None,
            }
        )
    targets = {
        "term_freed_le_0.5s": table[0]["module_elapsed_s"] <= 0.5,
        "term_speedup_ge_5x": (table[0]["speedup"] or 0) >= 5,
        f"ignore_le_grace_plus_0.5s ({args.grace + 0.5})": table[1]["module_elapsed_s"] <= args.grace + 0.5,
        "bystanders_killed_0": bystanders_alive,
        "foreign_named_every_run": all(r["foreign_named"] == [bystanders[1]] for r in by["term"] + by["ignore"]),
        "clean_host_changed_0": clean_changed == 0,
    }
    print(f"\nbackend: {be.name}; {args.reps} repetitions; grace {args.grace} s; holders {HOLDER_MIB} MiB each")
    print(f"{'scenario':<10}{'module s':>10}{'release s':>11}{'old s':>8}{'speed-up':>10}")
    for row in table:
        print(f"{row['scenario']:<10}{row['module_elapsed_s']:>10}{row['release_s']:>11}{row['old_sequence_s']:>8}"
              f"{str(row['speedup']) + 'x':>10}")  # fmt: skip
    for name, ok in targets.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    write_json(
        args.out / "bench_gpu_release.json",
        {
            "backend": be.name,
            "reps": args.reps,
            "grace_s": args.grace,
            "holder_mib": HOLDER_MIB,
            "medians": table,
            "targets": targets,
            "rows": rows,
            "idle": idle,
            "final": final,
            "clean_host_summary": clean_results.get("Teardown | summary", {}).get("msg"),
        },
    )
    return 0 if all(targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
