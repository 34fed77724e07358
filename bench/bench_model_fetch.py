#!/usr/bin/env python3
"""How fast playbooks/fetch_models.yml moves model weights, against native tools, in one run.

Generates a model of --gib GiB in --shards safetensors shards, serves it with the mirror double over
loopback (as a Hub for `type: hf` and as a plain mirror for `type: http`) and times, best of --reps:

  fetch_models.yml type http   parallel ranges, sha256 while the bytes arrive (verification on)
  fetch_models.yml type hf     the huggingface_hub client (Xet off), then the sha256 read (verify: read)
  curl, one stream             the files one after the other, no hashing
  curl, 4 files in parallel    no hashing
  4 x curl | tee | sha256sum   the native reference: four parallel pipelines that download and hash
  sha256sum                    one read of the payload (page cache warm)

A playbook is timed from its start until `.model_store/manifest.json` is written (the copy is then
verified and recorded); the whole command is timed too. Every destination is checked against the source
before it counts. The http transfer alone (plan, fetch, verify, record in one process, no Ansible) is
timed with 1, 2, 4 and 8 streams, with its peak memory (max RSS). Needs the controller toolchain (ansible-playbook),
curl and sha256sum; run from the repository root:

    python3 bench/bench_model_fetch.py --gib 2 --shards 4 --reps 2 --out bench/results
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))
sys.path.insert(0, str(REPO_ROOT))

from model_helpers import mirror_double, run_fetch_playbook  # noqa: E402

MIB = 1024 * 1024
NATIVE = "native: 4 x curl | tee file | sha256sum"


def make_model(root: Path, gib: float, shards: int) -> int:
    """Shards of random float data in safetensors format, index, config; returns the total bytes."""
    root.mkdir(parents=True)
    per_shard_floats = int(gib * 1024**3 / shards / 4)
    weight_map = {}
    for number in range(1, shards + 1):
        name = f"model-{number:05d}-of-{shards:05d}.safetensors"
        # header + data written in blocks, so that memory stays small
        header = json.dumps(
            {f"w{number}": {"dtype": "F32", "shape": [per_shard_floats], "data_offsets": [0, 4 * per_shard_floats]}}
        ).encode()
        header += b" " * (-len(header) % 8)
        with open(root / name, "wb") as out:
            out.write(len(header).to_bytes(8, "little") + header)
            left = 4 * per_shard_floats
            while left:
                block = os.urandom(min(64 * MIB, left))
                out.write(block)
                left -= len(block)
        weight_map[f"w{number}"] = name
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"architectures": ["BenchForCausalLM"]}))
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "module_utils" / "bws_model.py"), "write-manifest", str(root)],
        check=True,
        capture_output=True,
    )
    return sum(p.stat().st_size for p in root.iterdir() if p.is_file())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(8 * MIB):
            digest.update(chunk)
    return digest.hexdigest()


def payload(source: Path) -> list[str]:
    return sorted(p.name for p in source.iterdir() if p.is_file())


def check_copy(source_sums: dict[str, str], dest: Path) -> None:
    for name, digest in source_sums.items():
        if sha256_of(dest / name) != digest:
            raise SystemExit(f"{dest / name} differs from the source")


def drop(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def time_playbook(work: Path, kind: str, url: str, dest: Path, token_env: dict) -> dict:
    source = (
        {"type": "http", "url": f"{url}/mirror/acme/big/"}
        if kind == "http"
        else {"type": "hf", "repo": "acme/big", "revision": "main", "endpoint": url}
    )
    profiles = {"bench": {"model": {"path": str(dest), "source": source}, "drafter": None}}
    extra = {
        "engine_profile": "bench",
        "model_store_http_piece_mib": 64,
        "model_store_hf_workers": 8,
        "model_store_slice_s": 3600,  # one slice: its start is where the transfer starts
        **token_env,
    }
    start = time.time()
    run = run_fetch_playbook(work, profiles, extra)
    total = time.time() - start
    if run.rc != 0:
        raise SystemExit(f"fetch_models.yml ({kind}) failed:\n{run.output[-3000:]}")
    manifest = dest / ".model_store" / "manifest.json"
    progress = json.loads((dest / ".model_store" / "progress.json").read_text())
    return {
        "seconds": manifest.stat().st_mtime - progress["slice_started_at"],
        "command_s": total,
        "command_to_manifest_s": manifest.stat().st_mtime - start,
    }


def time_shell(script: str, cwd: Path) -> dict:
    start = time.time()
    subprocess.run(["bash", "-c", f"set -euo pipefail; {script}"], cwd=cwd, check=True)
    return {"seconds": time.time() - start}


def transfer_alone(url: str, dest: Path, streams: int) -> dict:
    """Wall time and max RSS of a process that runs only the http transfer (module defaults but `streams`)."""
    code = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
from tests.module_utils_loader import load_module_util
for name in ("bws_model", "bws_model_parallel", "bws_model_hub"):
    load_module_util(name)
t = load_module_util("bws_model_transfer")
source = t.make_source({{"type": "http", "url": {url + "/mirror/acme/big/"!r}}}, None, 60)
store = t.ModelStore({str(dest)!r}, source, streams={streams})
plan = store.plan()
store.fetch(plan)
store.finalize(store.plan(listing=plan["listing"]))
"""
    os.sync()
    start = time.time()
    process = subprocess.Popen([sys.executable, "-c", code])
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.time() - start
    if status != 0:
        raise SystemExit("the transfer alone failed")
    drop(dest)
    return {"streams": streams, "seconds": round(seconds, 3), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}


def run_methods(work: Path, url: str, source: Path, sums: dict[str, str], reps: int) -> dict[str, list[dict]]:
    """Time every method `reps` times, interleaved; every copy is checked against the source."""
    names = sorted(sums)
    results: dict[str, list[dict]] = {}
    base = f"{url}/mirror/acme/big"
    curls = " ".join(f"-o {n} {base}/{n}" for n in names)
    parallel = " ".join(f"curl -sf -o {n} {base}/{n} &" for n in names) + " wait"
    pipelines = " ".join(
        f"(curl -sf {base}/{n} | tee {n} | sha256sum > {n}.sha256) &" for n in names
    ) + " wait"
    methods = {
        "fetch_models.yml type http (parallel ranges, sha256 in-stream)": ("playbook", "http"),
        "fetch_models.yml type hf (huggingface_hub, Xet off, verify: read)": ("playbook", "hf"),
        "curl, one stream, files in sequence": ("shell", f"curl -sf {curls}"),
        "curl, 4 files in parallel": ("shell", parallel),
        NATIVE: ("shell", pipelines),
        "sha256sum over the payload (one read)": ("hash", None),
    }
    for rep in range(reps):
        for label, (kind, what) in methods.items():
            dest = work / f"dest-{rep}"
            drop(dest)
            dest.mkdir(parents=True)
            os.sync()  # every method starts without the previous one's dirty pages
            if kind == "playbook":
                sample = time_playbook(work, what, url, dest / "model", {})
                check_copy(sums, dest / "model")
            elif kind == "shell":
                sample = time_shell(what, dest)
                check_copy(sums, dest)
                for sha_file in dest.glob("*.sha256"):
                    name = sha_file.name[: -len(".sha256")]
                    if sha_file.read_text().split()[0] != sums[name]:
                        raise SystemExit(f"the pipeline's sha256 of {name} is wrong")
            else:
                sample = time_shell("sha256sum " + " ".join(names) + " > /dev/null", source)
            results.setdefault(label, []).append(sample)
            print(f"rep {rep + 1}: {label}: {sample['seconds']:.2f} s", flush=True)
            drop(dest)
    return results


def summarize(results: dict[str, list[dict]], mib: float, files: int, reps: int, sweep: list[dict]) -> dict:
    reference = min(s["seconds"] for s in results[NATIVE])
    rows = []
    for label, samples in results.items():
        best = min(samples, key=lambda s: s["seconds"])
        row = {
            "how": label,
            "best_s": round(best["seconds"], 3),
            "mib_per_s": round(mib / best["seconds"], 1),
            "vs_native_reference": round(reference / best["seconds"], 3),
            "samples_s": [round(s["seconds"], 3) for s in samples],
        }
        if "command_to_manifest_s" in best:
            whole = min(s["command_to_manifest_s"] for s in samples)
            row.update(
                command_to_manifest_s=round(whole, 3),
                command_mib_per_s=round(mib / whole, 1),
                command_vs_native_reference=round(reference / whole, 3),
                command_total_s=round(min(s["command_s"] for s in samples), 3),
            )
        rows.append(row)
    return {
        "payload_mib": round(mib, 1),
        "files": files,
        "reps": reps,
        "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "http_transfer_alone_by_streams": [
            {**row, "mib_per_s": round(mib / row["seconds"], 1)} for row in sweep
        ],
        "rows": rows,
    }


def table_text(report: dict) -> str:
    lines = [
        f"{report['payload_mib']:.0f} MiB in {report['files']} files over loopback, {report['cpus']} CPUs, "
        f"best of {report['reps']} (load average at the end: {report['load_average_at_end'][0]:.1f})",
        "| how | transfer | MiB/s | × native | whole command to manifest | MiB/s | × native |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        whole = (
            f"{row['command_to_manifest_s']:.2f} s | {row['command_mib_per_s']:.0f} | "
            f"{row['command_vs_native_reference']:.2f}"
            if "command_to_manifest_s" in row
            else " | | "
        )
        lines.append(
            f"| {row['how']} | {row['best_s']:.2f} s | {row['mib_per_s']:.0f} | {row['vs_native_reference']:.2f} | "
            f"{whole} |"
        )
    lines.append("")
    lines.append("http transfer alone (one process: plan, fetch, verify, record), by streams:")
    lines.append("| streams | seconds | MiB/s | peak RSS |")
    lines.append("|---|---|---|---|")
    for row in report["http_transfer_alone_by_streams"]:
        rss = row["peak_rss_mib"]
        lines.append(f"| {row['streams']} | {row['seconds']:.2f} | {row['mib_per_s']:.0f} | {rss} MiB |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--streams", type=lambda text: [int(n) for n in text.split(",")], default=[1, 2, 4, 8],
        help="stream counts for the transfer-alone sweep (default 1,2,4,8)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()
    for tool in ("curl", "sha256sum", "tee", "ansible-playbook"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed")

    work = Path(tempfile.mkdtemp(prefix="bench-model-fetch-", dir=args.workdir))
    try:
        hub = work / "hub"
        source = hub / "acme" / "big"
        print(f"generating {args.gib} GiB in {args.shards} shards under {work} ...", flush=True)
        total = make_model(source, args.gib, args.shards)
        names = payload(source)
        sums = {name: sha256_of(source / name) for name in names}
        mib = total / MIB
        with mirror_double(hub, work / "requests.jsonl", "--redirect-host", "localhost") as mirror:
            (work / "requests.jsonl").unlink(missing_ok=True)
            results = run_methods(work, mirror.url, source, sums, args.reps)
            sweep = [transfer_alone(mirror.url, work / "alone", streams) for streams in args.streams]
            for row in sweep:
                print(f"transfer alone, {row['streams']} streams: {row['seconds']:.2f} s, {row['peak_rss_mib']} MiB")
    finally:
        drop(work)

    report = summarize(results, mib, len(names), args.reps, sweep)
    print("\n" + table_text(report), end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_model_fetch.txt").write_text(table_text(report))
        (args.out / "bench_model_fetch.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
