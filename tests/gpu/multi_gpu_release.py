#!/usr/bin/env python3
"""Release proof on two GPUs: a real NCCL job dies badly, ``playbooks/teardown.yml`` cleans up after it.

Each repetition starts a real two-rank ``torch.distributed`` NCCL job (launcher + one process per GPU, spawned
with ``torch.multiprocessing``; the job is ``tests/contract/torch_shm_helpers.py``). Every rank carries
SGLang's scheduler title ``sglang::scheduler_TP<rank>`` (set the way SGLang sets it, with ``setproctitle`` or
the same rewrite of the argv area where that package is missing), allocates ``--mib`` MiB on its GPU, keeps
a ``psm_*`` segment open and runs ``all_reduce`` in a loop with a heartbeat file. Then the script:

1. asserts the preconditions: both GPUs show the ranks' memory (``nvidia-smi --query-compute-apps``, or
   ``memory.used`` where nvidia-smi names PIDs of another PID namespace), /dev/shm holds at least one
   ``nccl-*``/``psm_*`` entry, an NVML-only bystander (ctypes ``nvmlInit``, holds ``/dev/nvidiactl``) is
   listed by ``fuser`` and not as a compute app;
2. kills rank 1 with SIGKILL mid-collective and asserts rank 0 is alive and stuck (its heartbeat stops);
3. scenario ``module``: runs ``playbooks/teardown.yml`` (ansible-playbook, localhost, local connection,
   this python as the interpreter) and asserts: both GPUs free (no compute app, memory back to the
   baseline), no engine /dev/shm entry left, the bystander alive, a per-GPU report of what the module found
   (holders and their roles, memory before/after) taken from the module's own result;
   scenario ``old``: the fixed-sleep sequence of before, on this job's own PIDs only:
   ``kill -9 <pids>; sleep 3; kill -9 <pids still alive or on a GPU>; sleep 2; nvidia-smi``;
4. prints medians (module vs old) and writes ``multi_gpu_release.json`` (baseline/before/after snapshots,
   module results, timings) to ``--out``.

Everything runs in new PID and mount namespaces (the script re-executes itself under ``unshare --mount
--pid --fork --mount-proc``) with a private tmpfs on /dev/shm: it can signal only processes it started and
never reads or removes the host's /dev/shm entries. The script is PID 1 there, so whatever of its processes
is left when it ends is killed by the kernel. nvidia-smi still sees the GPUs; whether it lists the ranks
under their PIDs here or under host PIDs is recorded as ``pid_mapping`` (gpu_release handles both), as in
``tests/gpu/test_release_real_gpu.py``. The ranks run with ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` and a 30 min
collective timeout, so torch's own watchdog does not end rank 0 during the test. Each repetition's job log
(``job.log``), heartbeats and ansible run directory stay in the ``workdir`` named in the JSON.

Prerequisites: Linux, root, ``unshare`` (util-linux), ``fuser`` (psmisc), >= 2 idle NVIDIA GPUs with the
driver and ``nvidia-smi``, and one python with PyTorch (CUDA build, NCCL) and ansible-core (``ansible-playbook``
next to it or on PATH). The two GPUs used (the first two idle ones, or ``--gpus``) must run nothing else.
Run from anywhere, as root:

    python3 tests/gpu/multi_gpu_release.py --reps 5 --mib 4096 --out /tmp/multi-gpu-release

Exit status 0: every assertion held; 1: an assertion failed (the JSON still records what was seen);
2: this host cannot run it (the reason is printed). ``--cpu-rehearsal`` runs the same flow with gloo on the
CPU (no GPU assertions, ``--torch-python`` = an interpreter with CPU torch) to rehearse the script itself; its
numbers are not GPU results and are labelled ``"backend": "cpu-rehearsal"``.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "contract"))
sys.path.insert(0, str(REPO))  # tests.playbook_run: teardown.yml runs through ansible-runner

from torch_shm_helpers import (  # noqa: E402
    INSIDE_ENV,
    Job,
    alive,
    private_namespace_argv,
    private_namespace_unavailable,
    private_shm_mounted,
    run_teardown,
    shm_use,
    wait_gone,
    wait_stalled,
)

SHM = Path("/dev/shm")
ENGINE_SHM = ["nccl-*", "psm_*", "sem.mp-*", "torch_*", "multi_tokenizer_*"]  # gpu_release's default
ENGINE_PATTERNS = ["sglang::*", "sglang.launch_server", "sglang serve", "VLLM::*", "vllm serve"]
TITLES = ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
MEMORY_SLACK_MIB = 64
BYSTANDER_CODE = """
import ctypes, sys, time
if sys.argv[1] == "nvml":
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    rc = lib.nvmlInit_v2()
    if rc != 0:
        sys.exit(f"nvmlInit_v2 failed: {rc}")
print("ready", flush=True)
time.sleep(86400)
"""


class HostUnfitError(Exception):
    """This host cannot run the script (exit 2)."""


# ---------------------------------------------------------------- nvidia-smi


def nvidia_smi(*args: str) -> str:
    proc = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"nvidia-smi {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def snapshot(gpu_mode: bool) -> dict[str, Any]:
    """GPUs (index, uuid, memory used/total) and compute apps (pid, uuid, MiB), or nothing in a rehearsal."""
    if not gpu_mode:
        return {"time": time.time(), "gpus": [], "apps": []}
    gpus = []
    for line in nvidia_smi("--query-gpu=index,uuid,memory.used,memory.total", "--format=csv,noheader,nounits")\
            .strip().splitlines():  # fmt: skip
        index, uuid, used, total = (x.strip() for x in line.split(","))
        gpus.append({"index": int(index), "uuid": uuid, "memory_used_mib": int(used), "memory_total_mib": int(total)})
    apps = []
    out = nvidia_smi("--query-compute-apps=pid,gpu_uuid,used_memory,name", "--format=csv,noheader,nounits")
    for line in out.strip().splitlines():
        pid, uuid, used, name = (x.strip() for x in line.split(",", 3))
        apps.append({"pid": int(pid), "gpu_uuid": uuid, "used_mib": int(used) if used.isdigit() else None,
                     "name": name})  # fmt: skip
    return {"time": time.time(), "gpus": gpus, "apps": apps}


def used_on(snap: dict[str, Any], uuid: str) -> int:
    return next(g["memory_used_mib"] for g in snap["gpus"] if g["uuid"] == uuid)


def apps_on(snap: dict[str, Any], uuid: str) -> list[dict[str, Any]]:
    return [a for a in snap["apps"] if a["gpu_uuid"] == uuid]


def pick_gpus(wanted: list[str]) -> list[dict[str, Any]]:
    snap = snapshot(True)
    busy = {a["gpu_uuid"] for a in snap["apps"]}
    gpus = snap["gpus"]
    if wanted:
        gpus = [g for g in gpus if str(g["index"]) in wanted or g["uuid"] in wanted]
        if len(gpus) != 2:
            raise HostUnfitError(f"--gpus {wanted} does not name two GPUs of {[g['index'] for g in snap['gpus']]}")
    idle = [g for g in gpus if g["uuid"] not in busy]
    if len(idle) < 2:
        raise HostUnfitError(f"need 2 idle GPUs; GPUs {[g['index'] for g in gpus]}, with compute apps: "
                        f"{[g['index'] for g in gpus if g['uuid'] in busy]}")  # fmt: skip
    return idle[:2]


def fuser_lists(pid: int) -> bool:
    files = [str(p) for p in Path("/dev").glob("nvidia*") if p.is_char_device()]
    out = subprocess.run(["fuser", *files], capture_output=True, text=True, check=False)
    return str(pid) in out.stdout.split()


def device_files(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        return sorted({link for link in links if link.startswith("/dev/nvidia")})
    return []


# ---------------------------------------------------------------- helpers


def engine_entries() -> list[str]:
    return sorted(n for n in os.listdir(SHM) if any(fnmatch.fnmatchcase(n, p) for p in ENGINE_SHM))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reap_orphans() -> None:
    """This script is PID 1 of its namespace: collect the exit status of orphans re-parented to it.

    Called only while no subprocess.run/Popen.wait of ours is in flight (it would take their status).
    """
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def descendants_of(pids: list[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                ppid = int(Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()[1])
                children.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    stack = [c for p in pids for c in children.get(p, [])]
    while stack:
        p = stack.pop()
        if p not in found:
            found.append(p)
            stack.extend(children.get(p, []))
    return found


def check(cond: bool, message: str) -> None:
    if not cond:
        raise AssertionError(message)


class Rep:
    """One repetition: start the job, check preconditions, kill rank 1, then release it one way or the other."""

    def __init__(self, args: argparse.Namespace, root: Path, gpus: list[dict[str, Any]], bystander: int) -> None:
        self.args = args
        self.gpu_mode = not args.cpu_rehearsal
        self.root = root
        self.gpus = gpus
        self.bystander = bystander
        self.pid_mapping = ""

    def start_job(self, name: str) -> Job:
        env: dict[str, str] = {}
        if self.gpu_mode:
            env = {
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "CUDA_VISIBLE_DEVICES": ",".join(g["uuid"] for g in self.gpus),
                # Where NCCL reports the dead peer, torch's watchdog would end rank 0 itself; keep it
                # alive, as a rank whose watchdog has not fired yet (its timeout is minutes) is.
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
            }
            if self.args.nccl_shm_transport:
                env["NCCL_P2P_DISABLE"] = "1"  # NCCL then moves data through /dev/shm segments
        return Job(
            self.args.torch_python, self.root / name, env=env,
            backend="nccl" if self.gpu_mode else "gloo", device="cuda" if self.gpu_mode else "cpu",
            port=free_port(), titles=TITLES, mib=self.args.mib if self.gpu_mode else 0,
        )  # fmt: skip

    def preconditions(self, job: Job, baseline: dict[str, Any]) -> dict[str, Any]:
        ranks = job.ranks
        before = snapshot(self.gpu_mode)
        pre: dict[str, Any] = {"ranks": ranks, "shm": engine_entries(), "shm_use": shm_use()}
        check(bool(pre["shm"]), "no nccl-*/psm_* entry in /dev/shm")
        pre["nccl_entries"] = [n for n in pre["shm"] if n.startswith("nccl-")]
        for r in ranks:
            # setproctitle (or its stand-in) leaves the title as argv[0], the rest of the argv area blank.
            cmdline = Path(f"/proc/{r['pid']}/cmdline").read_bytes().split(b"\0")[0].decode().rstrip()
            check(cmdline == r["title"], f"rank {r['rank']} reads {cmdline!r}, not its title")
            check(any(fnmatch.fnmatchcase(cmdline, p) for p in ENGINE_PATTERNS), f"{cmdline!r} is no engine title")
        if not self.gpu_mode:
            return {**pre, "before": before}
        rank_pids = {r["pid"] for r in ranks}
        listed = {a["pid"] for a in before["apps"]}
        pre["pid_mapping"] = self.pid_mapping = (
            "same PID namespace (listed by their PIDs here)" if rank_pids <= listed else "PIDs of another namespace"
        )
        per_gpu = {}
        for r, gpu in zip(ranks, self.gpus, strict=True):
            grew = used_on(before, gpu["uuid"]) - used_on(baseline, gpu["uuid"])
            here = apps_on(before, gpu["uuid"])
            check(grew >= self.args.mib, f"GPU {gpu['index']}: memory.used grew by {grew} MiB < {self.args.mib}")
            if pre["pid_mapping"].startswith("same"):
                mine = [a for a in here if a["pid"] == r["pid"]]
                shown = (mine[0]["used_mib"] or 0) if mine else 0
                check(shown >= self.args.mib, f"GPU {gpu['index']}: rank {r['rank']} lists {shown} MiB: {here}")
            else:
                check(bool(here), f"GPU {gpu['index']}: no compute app listed")
            per_gpu[str(gpu["index"])] = {"memory_grew_mib": grew, "apps": here, "rank": r["rank"]}
            check(any(f.endswith("nvidia-uvm") for f in device_files(r["pid"])), f"rank {r['rank']}: no nvidia-uvm")
        pre["per_gpu"] = per_gpu
        check(self.bystander not in listed, "the NVML bystander is listed as a compute app")
        check(fuser_lists(self.bystander), "fuser does not list the NVML bystander")
        pre["bystander_device_files"] = device_files(self.bystander)
        return {**pre, "before": before}

    def kill_rank1(self, job: Job) -> dict[str, Any]:
        r0, r1 = job.ranks
        job.wait_heartbeats_advance([1], timeout=10)  # raises when rank 1 is not completing collectives
        os.kill(r1["pid"], signal.SIGKILL)
        t_kill = time.monotonic()
        check(wait_gone([r1["pid"]], 60) == [], "rank 1 survived SIGKILL for 60 s")
        gone_s = round(time.monotonic() - t_kill, 3)
        stall = wait_stalled(job.work, 0, quiet_s=self.args.stall_s, timeout=self.args.stall_s + 30)
        check(alive(r0["pid"]), "rank 0 died with its peer: nothing left to release")
        stall["rank1_gone_s"] = gone_s
        stall["blocked"] = stall["error"] is None
        return stall

    def run(self, rep: int, scenario: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Appends its row to ``rows`` first, so a failed repetition still leaves what it saw."""
        baseline = snapshot(self.gpu_mode)
        job = self.start_job(f"rep{rep}-{scenario}")
        row: dict[str, Any] = {"rep": rep, "scenario": scenario, "workdir": str(job.work), "baseline": baseline}
        rows.append(row)
        try:
            job.wait_ready()
            row["preconditions"] = self.preconditions(job, baseline)
            row["after_rank1_kill"] = self.kill_rank1(job)
            row["snapshot_after_rank1_kill"] = snapshot(self.gpu_mode)
            row["shm_after_rank1_kill"] = engine_entries()
            if scenario == "module":
                row.update(self.release_with_module(job, baseline))
            else:
                row.update(self.release_old_way(job, baseline))
        finally:
            job.stop()
            reap_orphans()
        return row

    def release_with_module(self, job: Job, baseline: dict[str, Any]) -> dict[str, Any]:
        extravars: dict[str, Any] = {
            "teardown_confirm": "yes",  # nobody is at ansible-runner's terminal: teardown.yml refuses unless told
            "gpu_release_grace_s": self.args.grace,
            "gpu_release_timeout_s": 120,
            "gpu_release_service_users": ["root"],  # the ranks run as root here, standing for the engine user
        }
        if self.gpu_mode:
            extravars["gpu_release_gpus"] = [g["uuid"] for g in self.gpus]
        else:
            extravars["gpu_release_nvidia_smi"] = str(self.root / "no-nvidia-smi")
        expected = {job.ranks[0]["pid"], *descendants_of([job.ranks[0]["pid"]])}
        out = run_teardown(self.root / "ansible", extravars, python=sys.executable)
        reap_orphans()
        res = out["release"] or {}
        after = snapshot(self.gpu_mode)
        row: dict[str, Any] = {
            "teardown_rc": out["rc"],
            "playbook_wall_s": out["wall_s"],
            "elapsed_s": res.get("elapsed_s"),
            "release_s": res.get("release_s"),
            "module_result": res,
            "teardown_summary": out["summary"],
            "after": after,
            "shm_left": engine_entries(),
        }
        check(out["rc"] == 0 and bool(res), f"teardown.yml failed (rc {out['rc']}):\n{out['output']}")
        targets = {t["pid"] for t in res["targets"]}
        check(targets == expected, f"targets {sorted(targets)} != rank 0 and its descendants {sorted(expected)}")
        check(wait_gone([job.ranks[0]["pid"], job.launcher_pid()], 30) == [], "rank 0 or the launcher still alive")
        check(alive(self.bystander), "the bystander was killed")
        check(row["shm_left"] == [], f"engine /dev/shm entries left: {row['shm_left']}")
        row["per_gpu"] = per_gpu_report(res)
        if self.gpu_mode:
            check(res["gpu_verification"] == "done", f"GPU verification {res['gpu_verification']}")
            for gpu in self.gpus:
                entry = next(g for g in res["gpus"] if g["uuid"] == gpu["uuid"])
                check(entry["clean"] is True, f"GPU {gpu['index']} not clean: {entry}")
                still = apps_on(after, gpu["uuid"])
                check(still == [], f"GPU {gpu['index']} still lists {still}")
                left = used_on(after, gpu["uuid"]) - used_on(baseline, gpu["uuid"])
                check(left <= MEMORY_SLACK_MIB, f"GPU {gpu['index']}: {left} MiB more than the baseline")
            spared = {s["pid"]: s["reason"] for s in res["spared"]}
            foreign = {f["pid"] for f in res["foreign_holders"]}
            row["bystander_reported_as"] = spared.get(self.bystander) or (
                "foreign" if self.bystander in foreign else None
            )
            if self.pid_mapping.startswith("same"):
                # nvidia-smi names our PIDs, so the module can tell an NVML client from a compute user
                # (otherwise it falls back to "holds nvidia-uvm", which an NVML client on driver 580 does).
                check(spared.get(self.bystander, "").startswith("NVML-only GPU holder"),
                      f"bystander not reported as an NVML-only holder: {spared}")  # fmt: skip
        return row

    def release_old_way(self, job: Job, baseline: dict[str, Any]) -> dict[str, Any]:
        """``kill -9 <pids>; sleep 3; kill -9 <pids still holding>; sleep 2; nvidia-smi`` on our PIDs only."""
        own = [p for p in [job.launcher_pid(), *(r["pid"] for r in job.ranks), *descendants_of(job.pids())]
               if alive(p)]  # fmt: skip
        t0 = time.monotonic()
        subprocess.run(["kill", "-9", *map(str, own)], check=False, capture_output=True)
        time.sleep(3)
        job.proc.poll()  # collect the launcher (our child) so it does not count as alive
        listed = {a["pid"] for a in snapshot(self.gpu_mode)["apps"]}
        still = [p for p in own if alive(p) or p in listed]
        if still:
            subprocess.run(["kill", "-9", *map(str, still)], check=False, capture_output=True)
        time.sleep(2)
        if self.gpu_mode:
            nvidia_smi()
        wall = round(time.monotonic() - t0, 3)
        reap_orphans()
        after = snapshot(self.gpu_mode)
        row = {
            "elapsed_s": wall,
            "after": after,
            "shm_left": engine_entries(),  # the old sequence never cleaned /dev/shm
            "still_after_3s": still,
        }
        if self.gpu_mode:
            row["memory_left_mib"] = {
                str(g["index"]): used_on(after, g["uuid"]) - used_on(baseline, g["uuid"]) for g in self.gpus
            }
        check(alive(self.bystander), "the bystander was killed")
        for name in row["shm_left"]:  # our private tmpfs: clear it for the next repetition
            (SHM / name).unlink()
        return row


def per_gpu_report(res: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "index": g["index"],
            "uuid": g["uuid"],
            "memory_used_before_mib": g.get("memory_used_before_mib"),
            "memory_used_after_mib": g.get("memory_used_after_mib"),
            "freed_mib": g.get("freed_mib"),
            "holders": [{k: h[k] for k in ("pid", "title", "role", "compute", "used_mib")} for h in g["holders"]],
            "clean": g.get("clean"),
        }
        for g in res.get("gpus", [])
    ]


def median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    return round(statistics.median(values), 3) if values else None


def start_bystander(gpu_mode: bool) -> subprocess.Popen:
    proc = subprocess.Popen(
        ["python3", "-c", BYSTANDER_CODE, "nvml" if gpu_mode else "plain"],
        executable=sys.executable, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = proc.stdout.readline() if proc.stdout else ""
    if line != "ready\n":
        proc.kill()
        proc.wait()
        raise HostUnfitError(f"the NVML bystander did not start: {line!r}")
    return proc


def preflight(args: argparse.Namespace) -> list[dict[str, Any]]:
    search = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    if shutil.which("ansible-playbook", path=search) is None:
        raise HostUnfitError("ansible-playbook (ansible-core) not found next to this python or on PATH")
    if importlib.util.find_spec("ansible_runner") is None:
        raise HostUnfitError("ansible-runner is not importable by this python (tests/playbook_run.py runs "
                             "teardown.yml through it)")
    probe = (
        "import json, torch; "
        "print(json.dumps([torch.__version__, torch.cuda.is_available(), torch.cuda.device_count()]))"
    )
    out = subprocess.run([args.torch_python, "-c", probe], capture_output=True, text=True, check=False, timeout=300)
    if out.returncode != 0:
        raise HostUnfitError(f"{args.torch_python} cannot import torch: {out.stderr.strip()[-500:]}")
    version, cuda, count = json.loads(out.stdout.strip().splitlines()[-1])
    if args.cpu_rehearsal:
        return []
    for tool in ("nvidia-smi", "fuser"):
        if shutil.which(tool) is None:
            raise HostUnfitError(f"{tool} not found")
    if not cuda or count < 2:
        raise HostUnfitError(f"torch {version} sees {count} CUDA device(s) (cuda available: {cuda}); need 2")
    return pick_gpus(args.gpus)


def summarize(args: argparse.Namespace, rows: list[dict[str, Any]], gpus: list[dict[str, Any]]) -> dict[str, Any]:
    module = [r for r in rows if r["scenario"] == "module" and "elapsed_s" in r]
    old = [r for r in rows if r["scenario"] == "old" and "elapsed_s" in r]
    medians = {
        "module_elapsed_s": median(module, "elapsed_s"),
        "module_release_s": median(module, "release_s"),
        "playbook_wall_s": median(module, "playbook_wall_s"),
        "old_sequence_s": median(old, "elapsed_s"),
    }
    if medians["module_elapsed_s"] and medians["old_sequence_s"]:
        medians["speedup_module_vs_old"] = round(medians["old_sequence_s"] / medians["module_elapsed_s"], 1)
    medians["old_shm_left_per_rep"] = median([{"n": len(r["shm_left"])} for r in old], "n")
    return {"backend": "cpu-rehearsal" if args.cpu_rehearsal else "nvidia", "gpus": gpus, "reps": args.reps,
            "mib": args.mib, "grace_s": args.grace, "medians": medians}  # fmt: skip


def print_summary(summary: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    m = summary["medians"]
    print(f"\nbackend {summary['backend']}; {summary['reps']} repetitions; GPUs "
          f"{[g['index'] for g in summary['gpus']]}; {summary['mib']} MiB per rank")  # fmt: skip
    print(f"{'':24}{'median s':>10}")
    print(f"{'module (elapsed_s)':24}{m['module_elapsed_s']!s:>10}")
    print(f"{'module (release_s)':24}{m['module_release_s']!s:>10}")
    print(f"{'teardown.yml wall':24}{m['playbook_wall_s']!s:>10}")
    print(f"{'old kill/sleep sequence':24}{m['old_sequence_s']!s:>10}")
    print(f"speed-up (old / module elapsed): {m.get('speedup_module_vs_old')}x; "
          f"/dev/shm entries the old sequence left per repetition (median): {m['old_shm_left_per_rep']}")  # fmt: skip
    first = next((r for r in rows if r["scenario"] == "module" and "per_gpu" in r), None)
    if first:
        print("per GPU, first module repetition:")
        for g in first["per_gpu"]:
            holders = ", ".join(f"{h['pid']} {h['title']} ({h['role']}, {h['used_mib']} MiB)" for h in g["holders"])
            print(f"  GPU {g['index']}: {g['memory_used_before_mib']} -> {g['memory_used_after_mib']} MiB; "
                  f"clean {g['clean']}; holders: {holders or 'none'}")  # fmt: skip
        print("  " + "\n  ".join(first.get("teardown_summary") or []))


def run(args: argparse.Namespace) -> int:
    check(private_shm_mounted(), "refusing to run: /dev/shm is not the private tmpfs")
    try:
        gpus = preflight(args)
        bystander = start_bystander(not args.cpu_rehearsal)
    except (HostUnfitError, RuntimeError) as exc:
        print(f"multi_gpu_release: cannot run here: {exc}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="multi-gpu-release-"))
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    failure = None
    try:
        rep_runner = Rep(args, root, gpus, bystander.pid)
        for rep in range(args.reps):
            for scenario in ("module", "old"):
                r = rep_runner.run(rep, scenario, rows)
                print(f"rep {rep} {scenario}: {r['elapsed_s']} s"
                      + (f" (release {r['release_s']} s, playbook {r['playbook_wall_s']} s)" if scenario == "module"
                         else f" (engine /dev/shm entries left: {len(r['shm_left'])})"), flush=True)  # fmt: skip
        check(alive(bystander.pid), "the bystander did not survive")
    except Exception as exc:  # an assertion, or a tool that failed: record it with what was seen so far
        failure = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        print(f"FAILED: {exc}", file=sys.stderr)
    finally:
        bystander.kill()
        bystander.wait()
    summary = summarize(args, rows, gpus)
    summary["failure"] = failure
    summary["workdir"] = str(root)
    (args.out / "multi_gpu_release.json").write_text(json.dumps({**summary, "rows": rows}, indent=1, default=str))
    print_summary(summary, rows)
    print(f"\nwrote {args.out / 'multi_gpu_release.json'}")
    return 1 if failure else 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions of each scenario (default 3)")
    p.add_argument("--mib", type=int, default=4096, help="MiB each rank allocates on its GPU (default 4096)")
    p.add_argument("--grace", type=float, default=5.0, help="gpu_release_grace_s (default 5)")
    p.add_argument("--stall-s", type=float, default=2.0, help="heartbeat silence that counts as stuck (default 2)")
    p.add_argument("--gpus", nargs="*", default=[], help="the two GPUs (index or uuid); default: first two idle")
    p.add_argument("--nccl-shm-transport", action="store_true", help="NCCL_P2P_DISABLE=1: data through /dev/shm")
    p.add_argument("--torch-python", default=sys.executable, help="python with torch for the job (default: this)")
    # Results name this host's paths and PIDs: keep them out of the repository by default.
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "multi-gpu-release")
    p.add_argument("--cpu-rehearsal", action="store_true", help="gloo on CPU, no GPU assertions (script rehearsal)")
    args = p.parse_args(argv)
    args.out = args.out.resolve()
    if args.reps < 1 or args.mib < 1:
        p.error("--reps and --mib must be >= 1")
    return args


def main() -> int:
    args = parse_args(sys.argv[1:])
    if os.environ.get(INSIDE_ENV) != "1":
        reason = private_namespace_unavailable()
        if reason:
            print(f"multi_gpu_release: cannot run here: {reason}", file=sys.stderr)
            return 2
        os.environ[INSIDE_ENV] = "1"
        argv = private_namespace_argv([sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]])
        os.execvp(argv[0], argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
