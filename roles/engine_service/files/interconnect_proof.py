#!/usr/bin/env python3
"""Prove the GPUs' interconnect: a torch.distributed all-reduce over tensor-parallel-size ranks, under a hard timeout.

Run it with the engine venv's python, the way the engine runs (same user, environment and GPUs):

    <venv>/bin/python interconnect_proof.py --world-size 8 [--backend nccl] [--sizes-mib 1,64,256]
        [--timeout-s 60] [--gpus 0,1,...] [--diagnostics FILE] [--json-out FILE]

The parent process is standard library only: it checks that MIG is off on the GPUs (nvidia-smi, under a
timeout), starts one process per rank (this file, ``--rank``; each imports torch), and waits for all of them
until the deadline. A rank joins the process group through a file store, all-reduces a tensor of each size
filled with ``rank + 1`` (float32), and checks that every element is the sum ``n (n + 1) / 2``. Ranks report
their progress in files, so when the deadline passes the parent kills every rank still running (each rank
runs in its own session; the whole session is killed) and names the ranks that did not finish and the step
each was in. Failures also carry the IOMMU mode, the PCIe ports with ACS ``ReqRedir+``/``CmpltRedir+`` (via
bws_pcie.py, shipped beside this file), ``nvidia-smi topo -p2p r`` and where the documentation gives the fix; a caller
may add its own facts with ``--diagnostics FILE`` (JSON).

Output: one human line on stderr, one JSON document on stdout (and in ``--json-out``). It always carries the
uid, user and the NCCL_*/CUDA_* environment the ranks ran with, and a hash of that environment.
Exit status: 0 proven, 1 failed (ranks wrong, crashed or not finished), 2 refused before starting (MIG on,
bad arguments).

BWS_PROOF_TEST_HANG_RANK=<rank> makes that rank hang after joining, before its first all-reduce: a test hook
for the timeout path, refused with the NCCL backend so it cannot reach a real GPU run by accident.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2
HANG_ENV = "BWS_PROOF_TEST_HANG_RANK"
ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_NCCL_", "NVIDIA_")
README_FIX = "docs/provisioning.md, section 'Interconnect: IOMMU and ACS'"


# ---------------------------------------------------------------- rank side (imports torch)


def write_progress(workdir: Path, rank: int, step: str, **extra: Any) -> None:
    path = workdir / f"rank-{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rank": rank, "step": step, "time": time.time(), **extra}))
    tmp.replace(path)


def run_rank(args: argparse.Namespace) -> int:
    workdir, rank, world = Path(args.workdir), args.rank, args.world_size
    write_progress(workdir, rank, "importing torch")
    import torch
    import torch.distributed as dist

    device = "cpu"
    if args.backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    write_progress(workdir, rank, "joining the process group", device=device)
    # The ranks' own collective timeout is longer than the parent's deadline: the parent decides, and kills.
    dist.init_process_group(args.backend, init_method=f"file://{workdir / 'store'}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=args.timeout_s * 2 + 30))
    hang = os.environ.get(HANG_ENV)
    if hang is not None and int(hang) == rank:
        write_progress(workdir, rank, "hanging (test hook)", device=device)
        while True:
            time.sleep(3600)
    expected = world * (world + 1) / 2
    results = []
    for mib in args.sizes_mib:
        numel = max(1, int(mib * 1024 * 1024) // 4)
        write_progress(workdir, rank, f"all_reduce {mib:g} MiB", device=device, done=results)
        tensor = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        if device != "cpu":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        wrong = int((tensor != expected).sum().item())
        # NCCL's bus bandwidth for all-reduce: bytes * 2 (n - 1) / n per second.
        busbw = numel * 4 * 2 * (world - 1) / world / seconds / 1e9 if seconds > 0 else None
        results.append({"mib": mib, "seconds": round(seconds, 6), "busbw_gbps": busbw and round(busbw, 3),
                        "wrong_elements": wrong})
        del tensor
        if wrong:
            write_progress(workdir, rank, "wrong sum", device=device, done=results, expected=expected)
            dist.destroy_process_group()
            return EXIT_FAILED
    dist.barrier()
    dist.destroy_process_group()
    write_progress(workdir, rank, "finished", device=device, done=results,
                   torch=torch.__version__, nccl=nccl_version(torch) if args.backend == "nccl" else None)
    return EXIT_OK


def nccl_version(torch: Any) -> str | None:
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # a version we cannot read is reported as unknown
        return None


# ---------------------------------------------------------------- parent side (standard library only)


def run_tool(argv: list[str], timeout_s: float) -> dict[str, Any]:
    """Run a diagnostic tool under a timeout; say so when it expires or is missing."""
    if shutil.which(argv[0]) is None and not os.access(argv[0], os.X_OK):
        return {"argv": argv, "ok": False, "error": f"{argv[0]} not found"}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"argv": argv, "ok": False, "error": f"did not finish within {timeout_s:g} s (timeout)"}
    except OSError as exc:
        return {"argv": argv, "ok": False, "error": str(exc)}
    return {"argv": argv, "ok": proc.returncode == 0, "rc": proc.returncode, "stdout": proc.stdout,
            "stderr": proc.stderr.strip()[-1000:]}


def environment_facts() -> dict[str, Any]:
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = None
    digest = hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]
    return {"uid": uid, "gid": os.getgid(), "user": user, "environment": env, "environment_hash": digest,
            "python": sys.executable}


def mig_check(nvidia_smi: str, gpus: list[str], timeout_s: float) -> dict[str, Any]:
    """MIG mode of the GPUs (indices or UUIDs, as CUDA_VISIBLE_DEVICES names them; all when ``gpus`` is empty).

    Returns {checked, enabled: [index], error}.
    """
    result = run_tool([nvidia_smi, "--query-gpu=index,uuid,mig.mode.current", "--format=csv,noheader,nounits"],
                      timeout_s)
    if not result["ok"]:
        return {"checked": False, "enabled": [], "error": result.get("error") or result.get("stderr")}
    enabled = []
    for line in result["stdout"].splitlines():
        index, uuid, mode = ([part.strip() for part in line.split(",")] + ["", ""])[:3]
        if (not gpus or index in gpus or uuid in gpus) and mode == "Enabled":
            enabled.append(index)
    return {"checked": True, "enabled": enabled, "error": None}


def pcie_diagnostics(backend: str, nvidia_smi: str, timeout_s: float) -> dict[str, Any]:
    """IOMMU mode, ACS redirection and the P2P read matrix, gathered cheaply (each tool under a timeout)."""
    facts: dict[str, Any] = {}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        import bws_pcie  # shipped beside this file
    except ImportError:
        facts["pcie"] = {"error": "bws_pcie.py is not beside the proof script; IOMMU/ACS not checked"}
    else:
        lspci = run_tool(["lspci", "-D", "-vvv"], timeout_s)
        try:
            cmdline = Path("/proc/cmdline").read_text(encoding="utf-8")
        except OSError:
            cmdline = ""
        facts["pcie"] = bws_pcie.gather(lspci["stdout"] if lspci["ok"] else None, cmdline,
                                        "/sys/kernel/iommu_groups")
        if not lspci["ok"]:
            facts["pcie"]["acs"]["error"] = lspci.get("error") or lspci.get("stderr")
    if backend == "nccl":
        topo = run_tool([nvidia_smi, "topo", "-p2p", "r"], timeout_s)
        facts["topo_p2p_read"] = topo["stdout"] if topo["ok"] else f"not available: {topo.get('error') or topo}"
    return facts


def start_ranks(args: argparse.Namespace, workdir: Path) -> list[subprocess.Popen]:
    ranks = []
    for rank in range(args.world_size):
        argv = [sys.executable, str(Path(__file__).resolve()), "--rank", str(rank), "--workdir", str(workdir),
                "--world-size", str(args.world_size), "--backend", args.backend, "--timeout-s", str(args.timeout_s),
                "--sizes-mib", ",".join(f"{m:g}" for m in args.sizes_mib)]
        log = open(workdir / f"rank-{rank}.log", "wb")  # noqa: SIM115  -- closed after the rank ends
        ranks.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()
    return ranks


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the rank's whole session (its own process group), then reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_ranks(ranks: list[subprocess.Popen], deadline: float) -> tuple[list[int], bool]:
    """Wait until every rank exits or the deadline passes; kill the rest. Returns (ranks killed, timed out)."""
    while time.monotonic() < deadline and any(p.poll() is None for p in ranks):
        # A rank that failed makes its peers block in the collective: stop waiting for them.
        if any(p.poll() not in (None, 0) for p in ranks):
            break
        time.sleep(0.05)
    timed_out = time.monotonic() >= deadline
    killed = [rank for rank, p in enumerate(ranks) if p.poll() is None]
    for rank in killed:
        kill_session(ranks[rank])
    return killed, timed_out


def rank_report(workdir: Path, rank: int, proc: subprocess.Popen, killed: bool) -> dict[str, Any]:
    try:
        progress = json.loads((workdir / f"rank-{rank}.json").read_text())
    except (OSError, ValueError):
        progress = {"step": "not started"}
    try:
        log_tail = (workdir / f"rank-{rank}.log").read_text(errors="replace")[-1500:]
    except OSError:
        log_tail = ""
    return {"rank": rank, "finished": progress.get("step") == "finished" and proc.returncode == 0,
            "killed": killed, "returncode": proc.returncode, "step": progress.get("step"),
            "device": progress.get("device"), "results": progress.get("done", []),
            "torch": progress.get("torch"), "nccl": progress.get("nccl"), "log_tail": log_tail}


def human_line(report: dict[str, Any]) -> str:
    if report["ok"]:
        largest = max(report["sizes_mib"])
        rates = [r["busbw_gbps"] for r in report["ranks"][0]["results"] if r["mib"] == largest]
        return (f"interconnect proof PASSED: all_reduce over {report['world_size']} ranks ({report['backend']}), "
                f"sizes {report['sizes_mib']} MiB, sums right, {report['elapsed_s']:.1f} s"
                + (f", bus bandwidth {rates[0]} GB/s at {largest:g} MiB" if rates and rates[0] else "")
                + f"; uid {report['uid']}, environment hash {report['environment_hash']}")
    parts = [f"interconnect proof FAILED ({report['backend']}, {report['world_size']} ranks): {report['reason']}"]
    pcie = report.get("diagnostics", {}).get("pcie", {})
    if "iommu" in pcie:
        parts.append(f"IOMMU mode: {pcie['iommu']['mode']} ({pcie['iommu']['source']})")
        ports = [f"{p['bdf']} ({'+ '.join(p['redirecting'])}+)" for p in pcie["acs"]["redirecting"]]
        parts.append("ACS redirection on: " + (", ".join(ports) if ports else
                                                "none" if pcie["acs"]["checked"] else "not checked"))
    parts.append(f"fix: {README_FIX}")
    return "; ".join(parts)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="interconnect_proof.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, required=True, help="ranks = the profile's tensor parallel size")
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    parser.add_argument("--sizes-mib", default="1,64,256",
                        type=lambda s: [float(x) for x in s.split(",") if x.strip()])
    parser.add_argument("--timeout-s", type=float, default=60.0, help="hard limit for the whole proof")
    parser.add_argument("--gpus", default=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                        help="nvidia-smi indices whose MIG mode is checked (default: CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("--tool-timeout-s", type=float, default=15.0,
                        help="limit for each nvidia-smi/lspci call (MIG check, diagnostics)")
    parser.add_argument("--skip-mig-check", action="store_true", help="gloo tests on hosts without nvidia-smi")
    parser.add_argument("--diagnostics", help="JSON file of facts to add to a failure report")
    parser.add_argument("--json-out", help="also write the JSON report here")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.world_size < 1 or args.timeout_s <= 0 or not args.sizes_mib or min(args.sizes_mib) <= 0:
        parser.error("--world-size, --timeout-s and every size must be positive")
    if os.environ.get(HANG_ENV) is not None and args.backend == "nccl":
        parser.error(f"{HANG_ENV} is a test hook for the gloo backend only")
    return args


def emit(report: dict[str, Any], json_out: str | None) -> int:
    text = json.dumps(report, indent=2, sort_keys=True)
    if json_out:
        Path(json_out).write_text(text + "\n", encoding="utf-8")
    print(text)
    print(human_line(report), file=sys.stderr)
    return report["exit"]


def prove(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    deadline = started + args.timeout_s
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    report: dict[str, Any] = {"backend": args.backend, "world_size": args.world_size, "sizes_mib": args.sizes_mib,
                              "timeout_s": args.timeout_s, "gpus": gpus, **environment_facts()}
    if args.diagnostics:
        report["diagnostics"] = {"caller": json.loads(Path(args.diagnostics).read_text(encoding="utf-8"))}
    mig = {"checked": False, "enabled": [], "error": "skipped (--skip-mig-check)"}
    if not args.skip_mig_check:
        mig = mig_check(args.nvidia_smi, gpus, args.tool_timeout_s)
    report["mig"] = mig
    if mig["enabled"]:
        return {**report, "ok": False, "exit": EXIT_REFUSED, "elapsed_s": time.monotonic() - started,
                "reason": f"MIG is on for GPU(s) {', '.join(mig['enabled'])}; the engine needs whole GPUs. "
                          "Turn it off: nvidia-smi -i <index> -mig 0 (as root, GPUs idle), then reset or reboot"}
    if not mig["checked"] and args.backend == "nccl" and not args.skip_mig_check:
        return {**report, "ok": False, "exit": EXIT_REFUSED, "elapsed_s": time.monotonic() - started,
                "reason": f"cannot tell whether MIG is off: {mig['error']}"}
    with tempfile.TemporaryDirectory(prefix="bws-proof-") as tmp:
        workdir = Path(tmp)
        ranks = start_ranks(args, workdir)
        killed, timed_out = wait_ranks(ranks, deadline)
        reports = [rank_report(workdir, r, p, r in killed) for r, p in enumerate(ranks)]
    elapsed = time.monotonic() - started
    unfinished = [r["rank"] for r in reports if not r["finished"]]
    wrong = [r["rank"] for r in reports if any(x["wrong_elements"] for x in r["results"])]
    report.update({"ranks": reports, "unfinished_ranks": unfinished, "elapsed_s": round(elapsed, 3),
                   "timed_out": timed_out, "ok": not unfinished, "exit": EXIT_OK if not unfinished else EXIT_FAILED})
    if unfinished:
        steps = "; ".join(f"rank {r['rank']}: {r['step']}" + (" (killed)" if r["killed"]
                                                              else f" (exit {r['returncode']})")
                          for r in reports if not r["finished"])
        report["reason"] = (f"rank(s) {', '.join(map(str, unfinished))} did not finish"
                            + (f" within {args.timeout_s:g} s" if timed_out else "")
                            + (f"; wrong sums on rank(s) {', '.join(map(str, wrong))}" if wrong else "")
                            + f" [{steps}]")
        diagnostics = pcie_diagnostics(args.backend, args.nvidia_smi, args.tool_timeout_s)
        report.setdefault("diagnostics", {}).update(diagnostics)
    return report


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.rank is not None:
        return run_rank(args)
    return emit(prove(args), args.json_out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
