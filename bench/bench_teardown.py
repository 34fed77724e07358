#!/usr/bin/env python3
"""Benchmark: the whole ``ansible-playbook playbooks/teardown.yml`` command against the old teardown one-liner.

What a user waits for is the whole command, so both are timed from exec to exit, in the same run:

* ``teardown.yml``: ``ansible-playbook -i <localhost, local connection> playbooks/teardown.yml`` with the
  repository's ansible.cfg, as a user types it (the module's own ``elapsed`` is read from its summary too);
* the old one-liner: ``systemctl stop ...; kill -9 <engine pids>; sleep 3; kill -9 <engine pids>;
  rm -f <shm>/*; sleep 2; nvidia-smi | head -2`` (its ``kill -9`` of every python3 and of every ``fuser
  /dev/nvidia*`` holder is narrowed to this script's own engine PIDs, so that it kills nothing else).

The same run also times a one-task play (``ansible.builtin.ping``, no facts) on the same inventory: what
``ansible-playbook`` and one module on the host cost on the machine, beside what teardown.yml adds. Every
command is reported as its median and spread (min-max), and the clean-host teardown.yml runs give a per-task
profile (the profile_tasks callback's recap, median per task). Scenarios: ``clean`` (no engine processes) and
``engines`` (two engine processes titled ``sglang::scheduler_TP0/1`` that exit on SIGTERM, 2 GiB of GPU
memory each). An NVML-only monitor and a foreign CUDA process run throughout: neither may be signalled, and
the foreign one must be named.

Everything runs in a private PID namespace (the script re-executes itself under ``unshare --pid --fork
--mount-proc``), so it can only signal processes it started; /dev/shm is a temporary directory. Needs root.

On an NVIDIA GPU machine (nvidia-smi, PyTorch with CUDA, the controller toolchain; systemd not needed):

    python3 bench/bench_teardown.py --reps 7 --out bench/results

and the targets are: teardown.yml <= 2.5 s on the clean host and <= 2.8 s with the engines to release, and at
least 1.8 times as fast as the one-liner with the engines (medians of the same run). On a
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
MIN_SPEEDUP_WITH_ENGINES = 1.8
ONE_TASK = "one-task play"
PROFILE_LINE = re.compile(r"^(?P<task>\S.*?) -{3,} (?P<s>\d+\.\d+)s$")
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
        "tasks": {m["task"]: float(m["s"]) for m in map(PROFILE_LINE.match, proc.stdout.splitlines()) if m},
        "module_elapsed_s": float(module.group(1)) if module else None,
        "changed": int(changed.group(1)) if changed else None,
        "foreign_named": re.findall(r"foreign, not signalled: (\d+) ", proc.stdout),
    }


def write_one_task_play(work: Path) -> str:
    """One ping on the same hosts, no facts: what ansible-playbook and one module run cost on this machine."""
    play = work / "one_task.yml"
    play.write_text(
        "- name: One-task play\n  hosts: gpu_servers\n  gather_facts: false\n  tasks:\n"
        "    - name: Ping\n      ansible.builtin.ping:\n"
    )
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


def measured(rows: list[dict], key: str) -> list[float]:
    return [r[key] for r in rows if r.get(key) is not None]


def median(rows: list[dict], key: str) -> float | None:
    values = measured(rows, key)
    return round(statistics.median(values), 3) if values else None


def spread(rows: list[dict], key: str = "wall_s") -> list[float] | None:
    values = measured(rows, key)
    return [round(min(values), 3), round(max(values), 3)] if values else None


def task_profile(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median seconds per task over the clean-host teardown.yml runs (profile_tasks), longest first."""
    runs = [r["tasks"] for r in rows if r["scenario"] == "clean" and r["command"] == "teardown.yml"]
    names = {name for run in runs for name in run}
    profile = [{"task": n, "median_s": round(statistics.median(run.get(n, 0.0) for run in runs), 3)} for n in names]
    return sorted(profile, key=lambda row: (-row["median_s"], row["task"]))  # ties in name order, not set order


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    table = []
    one_task = [r for r in rows if r["command"] == ONE_TASK]  # run once per repetition, on the clean host
    for scenario in ("clean", "engines"):
        ours = [r for r in rows if r["scenario"] == scenario and r["command"] == "teardown.yml"]
        old = [r for r in rows if r["scenario"] == scenario and r["command"] == "one-liner"]
        before = [r for r in rows if r["scenario"] == scenario and r["command"] == BASELINE]
        wall, old_wall = median(ours, "wall_s"), median(old, "wall_s")
        table.append(
            {
                "scenario": scenario,
                "teardown_yml_s": wall,
                "teardown_yml_spread_s": spread(ours),
                "module_s": median(ours, "module_elapsed_s"),
                "one_liner_s": old_wall,
                "one_liner_spread_s": spread(old),
                "ratio_to_one_liner": round(wall / old_wall, 3) if wall and old_wall else None,
                "speedup_over_one_liner": round(old_wall / wall, 2) if wall and old_wall else None,
                "target_s": TARGETS_S[scenario],
                "one_task_play_s": median(one_task, "wall_s"),
                "one_task_play_spread_s": spread(one_task),
                "baseline_teardown_yml_s": median(before, "wall_s"),
                "baseline_teardown_yml_spread_s": spread(before),
            }
        )
    return table


def repo_relative(path: Path | None) -> str:
    """A path as the results keep it: inside the repository relative to it (no machine's absolute path)."""
    if path is None:
        return ""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def with_spread(value: float | None, bounds: list[float] | None) -> str:
    return f"{value} ({bounds[0]}-{bounds[1]})" if value is not None and bounds else "-"


def print_table(
    backend_name: str, reps: int, table: list[dict[str, Any]], profile: list[dict[str, Any]], checks: dict[str, bool]
) -> None:
    print(f"\nbackend: {backend_name}; {reps} repetitions, interleaved; whole commands, wall clock, median (min-max)")
    print(f"{'scenario':<10}{'teardown.yml s':>22}{'(module s)':>12}{'one-liner s':>20}{'speed-up':>10}"
          f"{'one-task play s':>22}{'baseline tree s':>22}")  # fmt: skip
    for row in table:
        print(f"{row['scenario']:<10}{with_spread(row['teardown_yml_s'], row['teardown_yml_spread_s']):>22}"
              f"{row['module_s']!s:>12}{with_spread(row['one_liner_s'], row['one_liner_spread_s']):>20}"
              f"{str(row['speedup_over_one_liner']) + 'x':>10}"
              f"{with_spread(row['one_task_play_s'], row['one_task_play_spread_s']):>22}"
              f"{with_spread(row['baseline_teardown_yml_s'], row['baseline_teardown_yml_spread_s']):>22}")  # fmt: skip
    print("\nclean-host teardown.yml, per task (profile_tasks, median s):")
    for row in profile:
        print(f"  {row['median_s']:>6.2f}  {row['task']}")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")


def one_repetition(
    be, rep: int, *, inventory: Path, extravars: Path, one_task: str, bystanders: list[int], baseline: Path | None
) -> list[dict]:
    from gpu_real import alive

    rows = [{"rep": rep, "scenario": "clean", "command": ONE_TASK, **run_teardown(inventory, extravars, one_task)}]
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
    parser.add_argument("--reps", type=int, default=7)
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
        one_task = write_one_task_play(work)
        for rep in range(args.reps):
            rows.extend(
                one_repetition(
                    be,
                    rep,
                    inventory=inventory,
                    extravars=extravars,
                    one_task=one_task,
                    bystanders=bystanders,
                    baseline=args.baseline_tree,
                )
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
        engines = next(row for row in table if row["scenario"] == "engines")
        checks[f"engines_ge_{MIN_SPEEDUP_WITH_ENGINES}x_one_liner"] = (
            engines["speedup_over_one_liner"] or 0
        ) >= MIN_SPEEDUP_WITH_ENGINES
    profile = task_profile(rows)
    print_table(be.name, args.reps, table, profile, checks)
    suffix = "" if be.name == "real" else "_simulated"
    write_json(
        args.out / f"bench_teardown{suffix}.json",
        {
            "backend": be.name,
            "reps": args.reps,
            "baseline_tree": repo_relative(args.baseline_tree),
            "medians": table,
            "clean_task_profile": profile,
            "checks": checks,
            "rows": rows,
        },
    )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
