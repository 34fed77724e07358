#!/usr/bin/env python3
"""Prove the GPUs' interconnect: a torch.distributed all-reduce over tensor-parallel-size ranks, under a hard timeout.

Run it with the engine venv's python, the way the engine runs (same user, environment and GPUs):

    <venv>/bin/python interconnect_proof.py --world-size 8 [--backend nccl] [--sizes-mib 1,64,256]
        [--engine NAME --engine-model FILE] [--engine-flags FLAG,...] [--env-prefixes PREFIX_,...]
        [--custom-all-reduce]
        [--bf16-kib 4,64,256,1024] [--timeout-s 60] [--gpus 0,1,...] [--diagnostics FILE] [--json-out FILE]

The parent process is standard library only: it checks that MIG is off on the GPUs (nvidia-smi, under a
timeout), starts one process per rank (this file, ``--rank``; each imports torch), and waits for all of them
until the deadline. A rank first sets the NCCL/CUDA variables the engine sets inside its own process before its
first NCCL call (``--engine-model``, the engine role's ``files/interconnect_engine.py``; see ``EngineModel``),
joins the process group through a file store, then:

1. all-reduces a float32 tensor of each ``--sizes-mib`` size filled with ``rank + 1`` (eager) and checks that
   every element is the sum ``n (n + 1) / 2``;
2. the engine's traffic: small bfloat16 messages (``--bf16-kib``, several times each; the sums are small integers,
   exact in bfloat16), then one all-reduce captured in a CUDA graph (``torch.cuda.CUDAGraph``) on a static bfloat16
   tensor, replayed with new values each time and checked after each replay - NCCL backend on CUDA only;
3. when the profile turns on a peer-to-peer all-reduce (one the engine model's environment switch turns on, or
   ``--custom-all-reduce``), at world size >= 2: each rank exports a bfloat16 inbox by CUDA IPC handle, opens every
   peer's inbox in its own device's context (as the engines' custom all-reduce does) and writes its values
   straight into them; the sums are checked (see ``ipc_all_reduce`` for what of the engine's kernels this is not).

Every step reports its status (passed, failed, skipped or not run, with the reason) and its time. Ranks report
their progress in files, so when the deadline passes the parent kills every rank still running (each rank
runs in its own session; the whole session is killed) and names the ranks that did not finish and the step
each was in. Failures also carry the IOMMU mode, the PCIe ports with ACS ``ReqRedir+``/``CmpltRedir+`` (via
pcie.py, shipped beside this file), ``nvidia-smi topo -p2p r`` and where the documentation gives the fix; a caller
may add its own facts with ``--diagnostics FILE`` (JSON).

Output: one human line on stderr, one JSON document on stdout (and in ``--json-out``). It always carries the
uid, user, the NCCL_*/CUDA_*/TORCH_NCCL_*/NVIDIA_* and engine (``--env-prefixes``) environment the ranks were
started with (names that look like secrets left out) and a hash of it, and the variables the ranks set on top as
the engine does.
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
import importlib.util
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2
HANG_ENV = "BWS_PROOF_TEST_HANG_RANK"
ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_NCCL_", "NVIDIA_")  # beside the engine's own (--env-prefixes)
# Never reported nor keyed: an engine's variables can carry credentials (an API key).
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
README_FIX = "docs/provisioning.md, section 'Interconnect: IOMMU and ACS'"


# ---------------------------------------------------------------- the engine's own settings (standard library)


class EngineModel(NamedTuple):
    """What an engine does to its communication in its own process: its role's ``files/interconnect_engine.py``."""

    flags: tuple[str, ...]  # the profile's switches that change what it sets
    switches: tuple[str, ...]  # environment variables that turn on its own peer-to-peer all-reduce
    process_environment: Any  # (env, flags, world_size) -> the NCCL/CUDA variables it sets before its first NCCL call
    peer_all_reduce: Any  # (env) -> which of its peer-to-peer all-reduces env turns on, or None


NO_ENGINE = EngineModel((), (), lambda env, flags, world_size=1: {}, lambda env: None)


def load_engine_model(path: str | None) -> EngineModel:
    """The engine model at ``path`` (a Python file, standard library only), or none when no path is given."""
    if not path:
        return NO_ENGINE
    spec = importlib.util.spec_from_file_location("interconnect_engine", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    missing = [name for name in ("FLAGS", "PEER_ALL_REDUCE_SWITCHES", "process_environment", "peer_all_reduce")
               if not hasattr(module, name)]
    if missing:
        raise ValueError(f"{path}: the engine model lacks {', '.join(missing)}")
    # VALUED_FLAGS (optional): flags that come with their value, as `<flag>=<value>` words.
    return EngineModel(tuple(module.FLAGS) + tuple(getattr(module, "VALUED_FLAGS", ())),
                       tuple(module.PEER_ALL_REDUCE_SWITCHES), module.process_environment, module.peer_all_reduce)


def proof_environment(env: dict[str, str], engine_prefixes: tuple[str, ...] = ()) -> dict[str, str]:
    """The variables that shape the engine's communication, names that look like secrets left out."""
    return {k: v for k, v in sorted(env.items())
            if k.startswith((*ENV_PREFIXES, *engine_prefixes)) and not any(word in k for word in SECRET_WORDS)}


def engine_environment(model: EngineModel, env: dict[str, str], flags: list[str], world_size: int) -> dict[str, str]:
    """What the engine sets in its own process before its first NCCL call, given the environment it starts with and
    the number of ranks (SGLang's NCCL_GRAPH_REGISTER=0 applies only to more than one)."""
    return dict(model.process_environment(dict(env), list(flags), world_size))


def ipc_reason(model: EngineModel, env: dict[str, str], custom_all_reduce: bool) -> str | None:
    """Which peer-to-peer all-reduce of the engine the profile turns on, or None."""
    reason = model.peer_all_reduce(dict(env))
    if reason:
        return reason
    if custom_all_reduce:
        return "the engine's custom all-reduce (no disable-custom-all-reduce)"
    return None


def step_plan(args: argparse.Namespace, env: dict[str, str]) -> list[tuple[str, str | None]]:
    """The steps after the float32 sizes, each with the reason it does not run here (None: it runs).

    Every rank decides alike (same arguments and environment), so no rank waits in a collective another skips.
    """
    on_cpu = "skipped: needs the nccl backend on CUDA GPUs (gloo runs on the CPU)"
    ipc = ipc_reason(args.model, env, args.custom_all_reduce)
    switches = ", ".join([*args.model.switches, "custom all-reduce"])
    return [("bf16 small messages", on_cpu if args.backend != "nccl" else None),
            ("cuda graph all_reduce", on_cpu if args.backend != "nccl" else None),
            ("ipc peer-write all_reduce", on_cpu if args.backend != "nccl"
             else "not run: needs >= 2 GPUs" if args.world_size < 2
             else f"not run: the profile turns on no peer-to-peer all-reduce ({switches})" if ipc is None
             else None)]


# ---------------------------------------------------------------- rank side (imports torch)


def write_progress(workdir: Path, rank: int, step: str, **extra: Any) -> None:
    path = workdir / f"rank-{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rank": rank, "step": step, "time": time.time(), **extra}))
    tmp.replace(path)


class RankContext(NamedTuple):
    torch: Any
    dist: Any
    args: argparse.Namespace
    rank: int
    world: int
    device: str


def micros(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"first_us": round(seconds[0] * 1e6, 1), "median_us": round(ordered[len(ordered) // 2] * 1e6, 1),
            "max_us": round(ordered[-1] * 1e6, 1)}


def fp32_sizes(rc: RankContext, workdir: Path, progress: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The float32 sizes, eager; None (and the process group gone) on a wrong sum."""
    torch, dist, args, rank, world, device = rc
    expected = world * (world + 1) / 2
    results: list[dict[str, Any]] = []
    for mib in args.sizes_mib:
        numel = max(1, int(mib * 1024 * 1024) // 4)
        write_progress(workdir, rank, f"all_reduce {mib:g} MiB", **progress, done=results)
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
            write_progress(workdir, rank, "wrong sum", **progress, done=results, expected=expected)
            dist.destroy_process_group()
            return None
    return results


def bf16_messages(rc: RankContext) -> dict:
    """Small bfloat16 all-reduces, as the engine's decode issues them (NCCL picks its LL protocols for these)."""
    torch, dist, args, rank, world, device = rc
    expected, results = world * (world + 1) // 2, []
    for kib in args.bf16_kib:
        tensor = torch.empty(max(1, int(kib * 1024) // 2), dtype=torch.bfloat16, device=device)
        dist.barrier()
        seconds, wrong = [], 0
        for _ in range(args.iterations):
            tensor.fill_(rank + 1)
            torch.cuda.synchronize()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
            wrong += int((tensor != expected).sum().item())
        results.append({"kib": kib, "iterations": args.iterations, **micros(seconds), "wrong_elements": wrong})
    return {"status": "failed" if any(r["wrong_elements"] for r in results) else "passed", "dtype": "bfloat16",
            "results": results}


def graph_all_reduce(rc: RankContext) -> dict:
    """dist.all_reduce captured in a CUDA graph on a static bfloat16 tensor, replayed with new values."""
    torch, dist, args, rank, world, device = rc
    base = world * (world + 1) // 2
    static = torch.full((max(1, int(args.graph_kib * 1024) // 2),), rank + 1, dtype=torch.bfloat16, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch's CUDA graph notes ask
        for _ in range(2):
            dist.all_reduce(static)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.cuda.graph(graph):
            dist.all_reduce(static)
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - start
    # torch warns when nothing was captured: NCCL launches no kernel for an in-place all-reduce over one rank.
    empty = any("CUDA Graph is empty" in str(w.message) for w in caught)
    seconds, wrong = [], 0
    for replay in range(args.iterations):
        factor = 1 + replay % max(1, 256 // base)  # every sum stays <= 256: exact in bfloat16
        static.fill_((rank + 1) * factor)
        torch.cuda.synchronize()
        start = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        wrong += int((static != base * factor).sum().item())
    del graph
    result = {"status": "failed" if wrong or (empty and world > 1) else "passed", "dtype": "bfloat16",
              "kib": args.graph_kib, "capture_s": round(capture_s, 6), "replays": args.iterations, **micros(seconds),
              "wrong_elements": wrong, "graph_empty": empty}
    if empty:
        result["note"] = ("the captured graph is empty: over one rank NCCL launches no kernel for an in-place "
                          "all-reduce, so capture and replays ran but moved nothing" if world == 1 else
                          "the all-reduce was not captured in the graph")
    return result


def ipc_all_reduce(rc: RankContext) -> dict:
    """The closest thing to the engines' peer-to-peer all-reduce that runs without the engine.

    Shared with it: buffers exported by CUDA IPC handle (torch's ``_share_cuda_``, as
    torch/multiprocessing/reductions.py does) and opened by every peer in its own device's context
    (cudaIpcOpenMemHandle with lazy peer access, as SGLang's custom all-reduce opens them:
    python/sglang/srt/distributed/device_communicators/custom_all_reduce.py ``create_shared_buffer``), then
    bfloat16 data written by each rank straight into every peer's memory across PCIe and summed there.
    Not shared: the engines' kernels - SGLang's and vLLM's custom all-reduce (one- and two-stage kernels with
    in-kernel flag synchronisation) and FlashInfer's PCIe IPC kernels (staged pushes, 4+4 island decomposition at
    8 ranks, autotuned tactics; python/sglang/srt/distributed/device_communicators/pcie_ipc_ar.py) are only in the
    engine's packages; here a copy kernel writes and the process group's barrier synchronises, so a fault in those
    kernels or in their synchronisation is not covered, and neither is their capture in a CUDA graph.
    """
    torch, dist, args, rank, world, device = rc
    expected = world * (world + 1) // 2
    numel = max(1, int(args.ipc_kib * 1024) // 2)
    inbox = torch.zeros((world, numel), dtype=torch.bfloat16, device=device)
    # (device, handle, size, offset, ref counter handle and offset, event handle, event sync required)
    handles: list[Any] = [None] * world
    dist.all_gather_object(handles, inbox.untyped_storage()._share_cuda_())
    here = torch.cuda.current_device()
    peer_access = {str(peer): "same device" if handles[peer][0] == here
                   else bool(torch.cuda.can_device_access_peer(here, handles[peer][0]))
                   for peer in range(world) if peer != rank}
    peers = {}
    for peer in range(world):
        if peer != rank:  # opened on this rank's device: writes go across the fabric to the peer's memory
            storage = torch.UntypedStorage._new_shared_cuda(here, *handles[peer][1:])
            peers[peer] = torch.empty(0, dtype=torch.bfloat16, device=device).set_(storage, 0, (world, numel))
    mine = torch.full((numel,), rank + 1, dtype=torch.bfloat16, device=device)
    seconds, wrong = [], 0
    for _ in range(args.iterations):
        inbox.zero_()
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for remote in peers.values():
            remote[rank].copy_(mine)
        inbox[rank].copy_(mine)
        torch.cuda.synchronize()
        dist.barrier()
        total = inbox.float().sum(0)
        seconds.append(time.perf_counter() - start)
        wrong += int((total != expected).sum().item())
    peers.clear()
    torch.cuda.synchronize()
    dist.barrier()  # every peer is done with this rank's inbox before it is freed
    return {"status": "failed" if wrong else "passed", "dtype": "bfloat16", "kib": args.ipc_kib,
            "iterations": args.iterations, "peer_access": peer_access, **micros(seconds), "wrong_elements": wrong}


STEPS = {"bf16 small messages": bf16_messages, "cuda graph all_reduce": graph_all_reduce,
         "ipc peer-write all_reduce": ipc_all_reduce}


def run_rank(args: argparse.Namespace) -> int:
    workdir, rank, world = Path(args.workdir), args.rank, args.world_size
    # As the engine does, in its own process and before anything loads NCCL.
    applied = engine_environment(args.model, dict(os.environ), args.engine_flags, world)
    os.environ.update(applied)
    seen = {k: os.environ.get(k) for k in applied}
    write_progress(workdir, rank, "importing torch", engine_environment=seen)
    import torch
    import torch.distributed as dist

    device = "cpu"
    if args.backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    progress = {"device": device, "engine_environment": seen}
    write_progress(workdir, rank, "joining the process group", **progress)
    # The ranks' own collective timeout is longer than the parent's deadline: the parent decides, and kills.
    dist.init_process_group(args.backend, init_method=f"file://{workdir / 'store'}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=args.timeout_s * 2 + 30))
    hang = os.environ.get(HANG_ENV)
    if hang is not None and int(hang) == rank:
        write_progress(workdir, rank, "hanging (test hook)", **progress)
        while True:
            time.sleep(3600)
    rc = RankContext(torch, dist, args, rank, world, device)
    results = fp32_sizes(rc, workdir, progress)
    if results is None:
        return EXIT_FAILED
    steps: list[dict[str, Any]] = []
    for name, not_here in step_plan(args, dict(os.environ)):
        if not_here:
            steps.append({"step": name, "status": not_here.split(":")[0], "reason": not_here})
            continue
        write_progress(workdir, rank, name, **progress, done=results, steps=steps)
        start = time.perf_counter()
        outcome = STEPS[name](rc)
        steps.append({"step": name, **outcome, "seconds": round(time.perf_counter() - start, 6)})
        if outcome["status"] != "passed":
            write_progress(workdir, rank, f"wrong sum ({name})", **progress, done=results, steps=steps)
            dist.destroy_process_group()
            return EXIT_FAILED
    dist.barrier()
    dist.destroy_process_group()
    write_progress(workdir, rank, "finished", **progress, done=results, steps=steps,
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


def environment_facts(engine_prefixes: list[str]) -> dict[str, Any]:
    env = proof_environment(dict(os.environ), tuple(engine_prefixes))
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
        import pcie  # plugins/module_utils/host/pcie.py, shipped beside this file
    except ImportError:
        facts["pcie"] = {"error": "pcie.py is not beside the proof script; IOMMU/ACS not checked"}
    else:
        lspci = run_tool(["lspci", "-D", "-vvv"], timeout_s)
        try:
            cmdline = Path("/proc/cmdline").read_text(encoding="utf-8")
        except OSError:
            cmdline = ""
        facts["pcie"] = pcie.gather(lspci["stdout"] if lspci["ok"] else None, cmdline, "/sys/kernel/iommu_groups")
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
                "--sizes-mib", ",".join(f"{m:g}" for m in args.sizes_mib), "--engine", args.engine,
                *(["--engine-model", args.engine_model] if args.engine_model else []),
                "--env-prefixes", ",".join(args.env_prefixes), "--engine-flags", ",".join(args.engine_flags),
                "--bf16-kib", ",".join(f"{k:g}" for k in args.bf16_kib),
                "--graph-kib", f"{args.graph_kib:g}", "--ipc-kib", f"{args.ipc_kib:g}",
                "--iterations", str(args.iterations)] + (["--custom-all-reduce"] if args.custom_all_reduce else [])
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
            "steps": progress.get("steps", []), "engine_environment": progress.get("engine_environment"),
            "torch": progress.get("torch"), "nccl": progress.get("nccl"), "log_tail": log_tail}


def human_line(report: dict[str, Any]) -> str:
    if report["ok"]:
        largest = max(report["sizes_mib"])
        rates = [r["busbw_gbps"] for r in report["ranks"][0]["results"] if r["mib"] == largest]
        steps = "; ".join(f"{s['step']}: {s['status']}" + (f" ({s['median_us']} us median)" if "median_us" in s else "")
                          for s in report["ranks"][0].get("steps", []))
        return (f"interconnect proof PASSED: all_reduce over {report['world_size']} ranks ({report['backend']}), "
                f"sizes {report['sizes_mib']} MiB, sums right, {report['elapsed_s']:.1f} s"
                + (f", bus bandwidth {rates[0]} GB/s at {largest:g} MiB" if rates and rates[0] else "")
                + (f"; {steps}" if steps else "") + f"; engine {report['engine']} settings "
                + (", ".join(f"{k}={v}" for k, v in report["engine_environment"].items()) or "none")
                + f"; uid {report['uid']}, environment hash {report['environment_hash']}")
    parts = [f"interconnect proof FAILED ({report['backend']}, {report['world_size']} ranks): {report['reason']}"]
    pcie = report.get("diagnostics", {}).get("pcie", {})
    if "iommu" in pcie:
        parts.append(f"IOMMU mode: {pcie['iommu']['mode']} ({pcie['iommu']['source']})")
        ports = [f"{p['bdf']} ({'+ '.join(p['redirecting'])}+)" for p in pcie["acs"]["redirecting"]]
        listed = ", ".join(ports) if ports else "none" if pcie["acs"]["checked"] else "not checked"
        parts.append("ACS redirection on: " + listed)
    parts.append(f"fix: {README_FIX}")
    return "; ".join(parts)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="interconnect_proof.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, required=True, help="ranks = the profile's tensor parallel size")
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    parser.add_argument("--sizes-mib", default="1,64,256",
                        type=lambda s: [float(x) for x in s.split(",") if x.strip()])
    parser.add_argument("--engine", default="none", help="the engine's name, as the report gives it")
    parser.add_argument("--engine-model", default="",
                        help="the engine's model (its role's files/interconnect_engine.py): the NCCL/CUDA variables "
                        "it sets in its own process and its peer-to-peer all-reduce switches; none without it")
    parser.add_argument("--engine-flags", default="", help="the profile's engine switches that shape them (the "
                        "model's FLAGS)", type=lambda s: [x.strip() for x in s.split(",") if x.strip()])
    parser.add_argument("--env-prefixes", default="", help="the engine's own environment variable prefixes, reported "
                        "beside NCCL_/CUDA_/TORCH_NCCL_/NVIDIA_",
                        type=lambda s: [x.strip() for x in s.split(",") if x.strip()])
    parser.add_argument("--custom-all-reduce", action="store_true",
                        help="the profile runs the engine's custom (peer-to-peer) all-reduce")
    parser.add_argument("--bf16-kib", default="4,64,256,1024", help="small bfloat16 message sizes, KiB",
                        type=lambda s: [float(x) for x in s.split(",") if x.strip()])
    parser.add_argument("--graph-kib", type=float, default=64.0, help="the CUDA-graph all-reduce's size, KiB")
    parser.add_argument("--ipc-kib", type=float, default=256.0, help="the peer-write all-reduce's size, KiB")
    parser.add_argument("--iterations", type=int, default=10, help="repeats of each small-message step")
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
    sizes = [*args.sizes_mib, *args.bf16_kib, args.graph_kib, args.ipc_kib]
    if args.world_size < 1 or args.timeout_s <= 0 or not args.sizes_mib or not args.bf16_kib or min(sizes) <= 0 \
            or args.iterations < 1:
        parser.error("--world-size, --timeout-s, --iterations and every size must be positive")
    try:
        args.model = load_engine_model(args.engine_model)
    except (OSError, SyntaxError, ValueError, ImportError) as exc:
        parser.error(f"--engine-model: {exc}")
    unknown = sorted({flag for flag in args.engine_flags if flag.split("=", 1)[0] not in args.model.flags})
    if unknown:
        parser.error(f"--engine-flags: unknown {', '.join(unknown)} (known: {', '.join(args.model.flags) or 'none'})")
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
                              "timeout_s": args.timeout_s, "gpus": gpus, **environment_facts(args.env_prefixes),
                              "engine": args.engine, "engine_flags": args.engine_flags,
                              "custom_all_reduce": args.custom_all_reduce,
                              "engine_environment": engine_environment(args.model, dict(os.environ),
                                                                       args.engine_flags, args.world_size),
                              "peer_to_peer_all_reduce": ipc_reason(args.model, dict(os.environ),
                                                                    args.custom_all_reduce),
                              "steps": {name: why or "runs" for name, why in step_plan(args, dict(os.environ))}}
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
    wrong = [r["rank"] for r in reports if any(x["wrong_elements"] for x in r["results"])
             or any(x.get("status") == "failed" for x in r["steps"])]
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
