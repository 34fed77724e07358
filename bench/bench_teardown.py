#!/usr/bin/env python3
"""Benchmark: the whole ``ansible-playbook playbooks/teardown.yml`` command against the old teardown one-liner.

What a user waits for is the whole command, so both are timed from exec to exit, in the same run:

* ``teardown.yml``: ``ansible-playbook -i <localhost, local connection> playbooks/teardown.yml`` with the
  repository's ansible.cfg, as a user types it (the module's own ``elapsed`` is read from its summary too);
* the old one-liner: ``systemctl stop ...; kill -9 <engine pids>; sleep 3; kill -9 <engine pids>;
  rm -f <shm>/*; sleep 2; nvidia-smi | head -2`` (its ``kill -9`` of every python3 and of every ``fuser
  /dev/nvidia*`` holder is narrowed to this script's own engine PIDs, so that it kills nothing else).

The same run also times an empty play (no task) on the same inventory: what ``ansible-playbook`` itself
costs on the machine, beside what teardown.yml adds. Scenarios: ``clean`` (no engine processes) and
``engines`` (two engine processes titled ``sglang::scheduler_TP0/1`` that exit on SIGTERM, 2 GiB of GPU
memory each). An NVML-only monitor and a foreign CUDA process run throughout: neither may be signalled, and
the foreign one must be named.

Everything runs in a private PID namespace (the script re-executes itself under ``unshare --pid --fork
--mount-proc``), so it can only signal processes it started; /dev/shm is a temporary directory. Needs root.

On an NVIDIA GPU machine (nvidia-smi, PyTorch with CUDA, the controller toolchain; systemd not needed):

    python3 bench/bench_teardown.py --reps 5 --out bench/results

and the targets are: teardown.yml <= 2.5 s on the clean host and <= 2.8 s with the engines to release. On a
machine without a GPU, ``--simulate`` runs the same over the nvidia-smi test double and stand-in device files
and reports the ratio to the one-liner (labelled ``"backend": "simulated"``: not GPU results).

``--baseline-tree DIR`` also times the teardown.yml of another checkout of this repository (for example
``git worktree add /tmp/before <commit>``), run from that checkout with its own ansible.cfg, in the same
repetitions: before and after a change, whole command against whole command, on the same machine and load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HOLDER_MIB = 2048
TARGETS_S = {"clean": 2.5, "engines": 2.8}
BASELINE = "teardown.yml (baseline tree)"


def reexec_in_pid_namespace() -> None:
    if os.environ.get("BWS_GPU_TEST_IN_PIDNS") == "1":
        return
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        sys.exit("bench_teardown: needs root and unshare(1): it signals processes only in its own PID namespace")
    os.environ["BWS_GPU_TEST_IN_PIDNS"] = "1"
    os.execvp("unshare", ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, *sys.argv])


def ansible_playbook() -> str:
    local = Path(sys.executable).parent / "ansible-playbook"
    return str(local) if local.exists() else shutil.which("ansible-playbook") or "ansible-playbook"


def write_inventory(work: Path) -> Path:
    inventory = work / "hosts.yml"
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(json.dumps({"all": {"children": {"gpu_servers": {"hosts": {"localhost": host}}}}}))
    return inventory


def run_teardown(
    inventory: Path, extravars: Path, playbook: str = "playbooks/teardown.yml", tree: Path = REPO
) -> dict[str, Any]:
    argv = [ansible_playbook(), "-i", str(inventory), playbook, "-e", f"@{extravars}"]
    env = {**os.environ, "ANSIBLE_CONFIG": str(tree / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if os.environ.get("BWS_BENCH_LOG_DIR"):  # keep the playbook output (per-task times from profile_tasks)
        log_dir = Path(os.environ["BWS_BENCH_LOG_DIR"])
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{Path(playbook).stem}-{time.time_ns()}.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    module = re.search(r"elapsed ([0-9.]+) s", proc.stdout)
    changed = re.search(r"localhost\s*:.*changed=(\d+)", proc.stdout)
    return {
        "wall_s": round(wall, 3),
        "module_elapsed_s": float(module.group(1)) if module else None,
        "changed": int(changed.group(1)) if changed else None,
        "foreign_named": re.findall(r"foreign, not signalled: (\d+) ", proc.stdout),
    }


def write_empty_play(work: Path) -> str:
    """A play with no task on the same hosts: what ansible-playbook itself costs on this machine."""
    play = work / "empty.yml"
    play.write_text("- name: Empty play\n  hosts: gpu_servers\n  gather_facts: false\n  tasks: []\n")
    return str(play)


def run_one_liner(be, pids: list[int]) -> dict[str, Any]:
    kill = f"kill -9 {' '.join(map(str, pids))} 2>/dev/null" if pids else ":"
    script = (
        "systemctl stop sglang vllm 2>/dev/null; "
        f"{kill}; sleep 3; {kill}; rm -f {be.shm}/*; sleep 2; {be.nvidia_smi} 2>&1 | head -2"
    )
    t0 = time.monotonic()
    subprocess.run(["sh", "-c", script], capture_output=True, check=False)
    return {"wall_s": round(time.monotonic() - t0, 3)}


def start_engines(be) -> list[int]:
    spec, env = be.compute(HOLDER_MIB)
    pids = be.start(
        {
            "tp0": (["sglang::scheduler_TP0"], spec, env),
            "tp1": (["sglang::scheduler_TP1"], spec, env),
        }
    )
    return [pids["tp0"][0], pids["tp1"][0]]


def median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 3) if values else None


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    table = []
    for scenario in ("clean", "engines"):
        ours = [r for r in rows if r["scenario"] == scenario and r["command"] == "teardown.yml"]
        old = [r for r in rows if r["scenario"] == scenario and r["command"] == "one-liner"]
        before = [r for r in rows if r["scenario"] == scenario and r["command"] == BASELINE]
        wall, old_wall = median(ours, "wall_s"), median(old, "wall_s")
        table.append(
            {
                "scenario": scenario,
                "teardown_yml_s": wall,
                "module_s": median(ours, "module_elapsed_s"),
                "one_liner_s": old_wall,
                "ratio_to_one_liner": round(wall / old_wall, 3) if wall and old_wall else None,
                "target_s": TARGETS_S[scenario],
                "empty_play_s": median([r for r in rows if r["command"] == "empty play"], "wall_s"),
                "baseline_teardown_yml_s": median(before, "wall_s"),
            }
        )
    return table


def print_table(backend_name: str, reps: int, table: list[dict[str, Any]], checks: dict[str, bool]) -> None:
    print(f"\nbackend: {backend_name}; {reps} repetitions; whole commands, wall clock (median)")
    print(f"{'scenario':<10}{'teardown.yml s':>16}{'(module s)':>12}{'one-liner s':>13}{'ratio':>8}"
          f"{'empty play s':>14}{'baseline tree s':>17}")  # fmt: skip
    for row in table:
        print(f"{row['scenario']:<10}{row['teardown_yml_s']:>16}{row['module_s']!s:>12}{row['one_liner_s']:>13}"
              f"{row['ratio_to_one_liner']!s:>8}{row['empty_play_s']!s:>14}"
              f"{row['baseline_teardown_yml_s']!s:>17}")  # fmt: skip
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")


def one_repetition(
    be, rep: int, *, inventory: Path, extravars: Path, empty: str, bystanders: list[int], baseline: Path | None
) -> list[dict]:
    from gpu_real import alive

    rows = [{"rep": rep, "scenario": "clean", "command": "empty play", **run_teardown(inventory, extravars, empty)}]
    trees = [("teardown.yml", REPO)] + ([(BASELINE, baseline)] if baseline else [])
    for command, tree in trees:
        kw = {"tree": tree}
        rows.append({"rep": rep, "scenario": "clean", "command": command, **run_teardown(inventory, extravars, **kw)})
        pids = start_engines(be)
        rows.append({"rep": rep, "scenario": "engines", "command": command, **run_teardown(inventory, extravars, **kw)})
        be.reap()
        assert not any(alive(p) for p in pids), f"an engine process survived {command}"
    rows.append({"rep": rep, "scenario": "clean", "command": "one-liner", **run_one_liner(be, [])})
    pids = start_engines(be)
    rows.append({"rep": rep, "scenario": "engines", "command": "one-liner", **run_one_liner(be, pids)})
    be.reap()
    assert all(alive(p) for p in bystanders), "a bystander was killed"
    print(" ".join(f"{r['scenario']}/{r['command']} {r['wall_s']} s" for r in rows), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--simulate", action="store_true", help="no GPU: use the nvidia-smi test double")
    parser.add_argument("--baseline-tree", type=Path, help="another checkout whose teardown.yml is timed alongside")
    args = parser.parse_args()
    if args.baseline_tree:
        args.baseline_tree = args.baseline_tree.resolve()
    if args.simulate:
        os.environ["BWS_GPU_DRYRUN"] = "1"
    reexec_in_pid_namespace()
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    from gpu_real import backend, gpu_unavailable_reason, write_json

    reason = gpu_unavailable_reason()
    if reason:
        print(f"bench_teardown: cannot run: {reason} (--simulate runs it over the nvidia-smi test double)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-teardown-"))
    be = backend(work)
    inventory = write_inventory(work)
    extravars = work / "vars.json"
    # The engine processes run as root here: root stands for the engines' service user.
    extravars.write_text(json.dumps(be.extravars(gpu_release_service_users=["root"], gpu_release_grace_s=2)))
    rows: list[dict[str, Any]] = []
    try:
        bystanders = be.start_bystanders()
        run_teardown(inventory, extravars)  # warm the page cache: every repetition then starts alike
        if args.baseline_tree:
            run_teardown(inventory, extravars, tree=args.baseline_tree)
        empty = write_empty_play(work)
        for rep in range(args.reps):
            rows.extend(
                one_repetition(be, rep, inventory=inventory, extravars=extravars, empty=empty, bystanders=bystanders,
                               baseline=args.baseline_tree)
            )
    finally:
        be.stop_all()

    table = medians(rows)
    checks = {
        "bystanders_killed_0": True,  # asserted after every repetition
        "foreign_named_every_run": all(
            str(bystanders[1]) in r["foreign_named"] for r in rows if r["command"] == "teardown.yml"
        ),
        "clean_host_changed_0": all(
            r["changed"] == 0 for r in rows if r["command"] == "teardown.yml" and r["scenario"] == "clean"
        ),
    }
    if be.name == "real":
        for row in table:
            checks[f"{row['scenario']}_le_{row['target_s']}s"] = row["teardown_yml_s"] <= row["target_s"]
    print_table(be.name, args.reps, table, checks)
    suffix = "" if be.name == "real" else "_simulated"
    write_json(
        args.out / f"bench_teardown{suffix}.json",
        {"backend": be.name, "reps": args.reps, "baseline_tree": str(args.baseline_tree or ""), "medians": table,
         "checks": checks, "rows": rows},
    )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
