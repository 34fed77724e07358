#!/usr/bin/env python3
"""Benchmark: a deploy with nothing to change, ``ansible-playbook deploy_sglang.yml`` on the sandbox host.

What a user waits for when re-running a deploy is the whole command; the part this repository controls is the
playbook itself (from the first task to the recap, as the profile_tasks callback reports it). Both are timed, in
the same run, for this checkout and, with ``--baseline-tree DIR``, for another checkout of the repository (for
example ``git worktree add /tmp/before <commit>``) on the same host, load and machine, interleaved.

The host is a systemd container booted from the test-host image (scripts/boot-test-host.sh, the image built by
scripts/build-image.sh) and prepared as the sandbox is (tests/sandbox/prepare_host.yml); the engine on it is the
ENGINE TEST DOUBLE, the smoke gate runs as in a real deploy. Each checkout deploys once before the timed runs; a
timed run must report changed=0 (the table says when one did not: then it was not a no-op).

    bash scripts/bootstrap.sh && bash scripts/build-image.sh
    python3 bench/bench_noop_deploy.py --reps 5 [--baseline-tree /tmp/before] --out bench/results

Each repetition also times, on the same host and interleaved, the same deploy with the fast path off
(``-e engine_service_noop_check=false``: every step, the alternative) and a one-task play (``ansible.builtin.ping``
on the host: Ansible's floor for one round trip).

Targets: the no-op deploy's whole command, paired with the one-task play of the same repetition, at most 3x it
(median of the per-repetition ratios), changed=0; the playbook part <= 15 s.
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
HOST = "bws-bench-noop"
RECAP = re.compile(r"^" + HOST + r"\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
TARGET_S = 15.0
TARGET_RATIO = 3.0
ONE_TASK_PLAY = """- name: One task on the host (Ansible's floor)
  hosts: gpu_servers
  gather_facts: false
  tasks:
    - name: One round trip
      ansible.builtin.ping:
"""


def ansible_playbook() -> str:
    local = Path(sys.executable).parent / "ansible-playbook"
    return str(local) if local.exists() else shutil.which("ansible-playbook") or "ansible-playbook"


def write_inventory(tree: Path, work: Path) -> Path:
    """The tree's own sandbox inventory, pointed at the bench host."""
    inventory = work / tree.name / "inventory"
    shutil.copytree(tree / "inventory" / "sandbox" / "group_vars", inventory / "group_vars", dirs_exist_ok=True)
    host = {HOST: {"ansible_connection": "containers.podman.podman"}}
    hosts = {"all": {"children": {"gpu_servers": {"hosts": host}}}}
    (inventory / "hosts.yml").write_text(json.dumps(hosts))
    return inventory


def playbook_seconds(stdout: str) -> float | None:
    """profile_tasks' running total at the recap: the playbook part of the command."""
    totals = re.findall(r"\(\d+:\d\d:\d\d\.\d+\)\s+(\d+):(\d\d):(\d\d\.\d+)", stdout)
    if not totals:
        return None
    hours, minutes, seconds = totals[-1]
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def run(tree: Path, inventory: Path, playbook: str, *extra: str) -> dict[str, Any]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(tree / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks"}
    start = time.monotonic()
    proc = subprocess.run([ansible_playbook(), "-i", str(inventory), playbook, *extra], cwd=tree, env=env,
                          capture_output=True, text=True, check=False, timeout=900)
    wall = time.monotonic() - start
    recap = RECAP.search(proc.stdout)
    return {"rc": proc.returncode, "wall_s": round(wall, 2), "playbook_s": playbook_seconds(proc.stdout),
            "ok": int(recap.group(1)) if recap else None, "changed": int(recap.group(2)) if recap else None,
            "tail": proc.stdout[-1500:] if proc.returncode else ""}


def prepare_host(work: Path) -> None:
    subprocess.run(["bash", str(REPO / "scripts" / "boot-test-host.sh"), "--label", "owner=bws-bench", HOST],
                   check=True)
    inventory = write_inventory(REPO, work)
    prepared = run(REPO, inventory, "tests/sandbox/prepare_host.yml")
    if prepared["rc"] != 0:
        sys.exit(f"bench_noop_deploy: preparing {HOST} failed:\n{prepared['tail']}")


def deploy_playbook(tree: Path) -> str:
    """The root-level entry point where the checkout has one (older checkouts: playbooks/)."""
    return "deploy_sglang.yml" if (tree / "deploy_sglang.yml").exists() else "playbooks/deploy_sglang.yml"


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--baseline-tree", type=Path, help="another checkout whose deploy is timed alongside")
    parser.add_argument("--out", type=Path, help="directory for bench_noop_deploy.json")
    args = parser.parse_args()
    trees = {"this checkout": REPO}
    if args.baseline_tree:
        trees["baseline tree"] = args.baseline_tree.resolve()
    work = Path(tempfile.mkdtemp(prefix="bench-noop-"))
    try:
        prepare_host(work)
        inventories = {name: write_inventory(tree, work) for name, tree in trees.items()}
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for name, tree in trees.items():  # the first deploy of each checkout writes and starts its release
            first = run(tree, inventories[name], deploy_playbook(tree))
            if first["rc"] != 0:
                sys.exit(f"bench_noop_deploy: the first deploy of {name} failed:\n{first['tail']}")
        one_task = work / "one_task.yml"
        one_task.write_text(ONE_TASK_PLAY)
        floor: list[dict[str, Any]] = []
        full: list[dict[str, Any]] = []
        for _ in range(args.reps):
            for name, tree in trees.items():
                rows[name].append(run(tree, inventories[name], deploy_playbook(tree)))
            full.append(run(REPO, inventories["this checkout"], deploy_playbook(REPO),
                            "-e", "engine_service_noop_check=false"))
            floor.append(run(REPO, inventories["this checkout"], str(one_task)))
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", HOST], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)
    rows["full path (noop check off)"] = full
    rows["one-task play"] = floor
    table = [{"tree": name, "playbook_s": median([r["playbook_s"] for r in runs]),
              "wall_s": median([r["wall_s"] for r in runs]),
              "changed": sorted({r["changed"] for r in runs}, key=str), "failed": sum(r["rc"] != 0 for r in runs)}
             for name, runs in rows.items()]
    ratios = [d["wall_s"] / f["wall_s"] for d, f in zip(rows["this checkout"], floor, strict=True) if f["wall_s"]]
    ratio = median(ratios)
    print(f"no-op deploy_sglang.yml on the sandbox host, {args.reps} repetitions, medians, {os.cpu_count()} CPUs")
    print(f"{'run':<28}{'playbook s':>12}{'whole command s':>17}{'changed':>10}{'failed':>8}")
    for row in table:
        print(f"{row['tree']:<28}{row['playbook_s']!s:>12}{row['wall_s']!s:>17}{row['changed']!s:>10}"
              f"{row['failed']:>8}")
    this = table[0]
    print(f"no-op deploy / one-task play, paired per repetition: median {ratio}x "
          f"({', '.join(f'{r:.2f}' for r in ratios)})")
    met = (this["playbook_s"] is not None and this["playbook_s"] <= TARGET_S and this["changed"] == [0]
           and ratio is not None and ratio <= TARGET_RATIO)
    print(f"target: whole command <= {TARGET_RATIO:g}x the one-task play, playbook part <= {TARGET_S:g} s, "
          f"changed=0: {'MET' if met else 'NOT met'}")
    if args.baseline_tree and table[1]["playbook_s"]:
        print(f"playbook part {this['playbook_s']} s against {table[1]['playbook_s']} s before "
              f"({100 * (1 - this['playbook_s'] / table[1]['playbook_s']):.0f} % faster)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.baseline_tree or REPO,
                                capture_output=True, text=True, check=False).stdout.strip()
        (args.out / "bench_noop_deploy.json").write_text(json.dumps(
            {"reps": args.reps, "cpus": os.cpu_count(), "baseline_commit": commit if args.baseline_tree else None,
             "ratio_to_one_task_play": ratio, "ratios": ratios, "medians": table, "runs": rows}, indent=2) + "\n")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
