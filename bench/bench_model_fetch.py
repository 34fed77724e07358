#!/usr/bin/env python3
"""How fast playbooks/fetch_models.yml moves model weights, against native tools, in one run.

Generates a model of --gib GiB in --shards safetensors shards, serves it with the mirror double over
loopback (as a Hub for `type: hf` and as a plain mirror for `type: http`) and times, best of --reps:

  fetch_models.yml type http   parallel ranges, sha256 while the bytes arrive (verification on)
  fetch_models.yml type hf     the huggingface_hub client (Xet off), sha256 as the client writes each file
  hf download                  the Hub's own CLI from the same huggingface_hub (the role's tools venv),
                               pointed at the double with HF_ENDPOINT, Xet off, no verification
  hf download + sha256sum      the same, then sha256sum(1) of the files
  curl, one stream             the files one after the other, no hashing
  curl, 4 files in parallel    no hashing
  4 x curl | tee | sha256sum   the native reference: four parallel pipelines that download and hash
  sha256sum                    one read of the payload (page cache warm)

A playbook is timed from its start until `.model_store/manifest.json` is written (the copy is then
verified and recorded); the whole command is timed too. Every destination is checked against the source
before it counts. For the Hub path the run's profile is printed: Ansible's tasks (profile_tasks) and the
module's timeline of the client run (client start, metadata, transfer, verification, recording, manifest),
with the peak memory (max RSS) of the client and of the module; `hf download`'s peak memory comes from
wait4(2). `--baseline-tree DIR` adds the Hub path of another checkout (before/after in the same run).
The http transfer alone (plan, fetch, verify, record in one process, no Ansible) is timed with 1, 2, 4
and 8 streams, with its peak memory (max RSS). Needs the controller toolchain (ansible-playbook), curl and
sha256sum, and the role's tools venv (the Hub path creates it on first use); run from the repository root:

    python3 bench/bench_model_fetch.py --gib 2 --shards 4 --reps 3 --out bench/results
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))
sys.path.insert(0, str(REPO_ROOT))

from model_helpers import TOOLS_VENV, mirror_double, run_fetch_playbook  # noqa: E402

MIB = 1024 * 1024
NATIVE = "native: 4 x curl | tee file | sha256sum"
HUB = "fetch_models.yml type hf (huggingface_hub, Xet off, sha256 as written)"
BASELINE = "fetch_models.yml type hf, baseline tree"
HF = "hf download (same huggingface_hub, Xet off, no verification)"
HF_SHA = "hf download + sha256sum"
# profile_tasks' recap lines: "<role> : <task name> ---- 1.23s"
TASK_LINE = re.compile(r"^(?P<task>\S.*?) -+ (?P<seconds>\d+\.\d+)s$")


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
        [sys.executable, str(REPO_ROOT / "plugins" / "module_utils" / "model" / "store.py"), "write-manifest",
         str(root)],
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


def task_times(output: str) -> dict[str, float]:
    """The per-task seconds of profile_tasks' recap (enabled in ansible.cfg)."""
    recap = output[output.rfind("TASKS RECAP") :] if "TASKS RECAP" in output else ""
    return {match["task"]: float(match["seconds"]) for line in recap.splitlines() if (match := TASK_LINE.match(line))}


def time_playbook(work: Path, kind: str, url: str, dest: Path, *, tree: Path, venv: Path) -> dict:
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
        "model_store_tools_venv": str(venv),
    }
    start = time.time()
    run = run_fetch_playbook(work, profiles, extra, tree=tree)
    total = time.time() - start
    if run.rc != 0:
        raise SystemExit(f"fetch_models.yml ({kind}) failed:\n{run.stdout[-3000:]}")
    manifest = dest / ".model_store" / "manifest.json"
    progress = json.loads((dest / ".model_store" / "progress.json").read_text())
    slice_start = progress["slice_started_at"]
    return {
        "seconds": manifest.stat().st_mtime - slice_start,
        "command_s": total,
        "command_to_manifest_s": manifest.stat().st_mtime - start,
        "before_slice_s": slice_start - start,
        "after_manifest_s": total - (manifest.stat().st_mtime - start),
        "hub_client": (progress.get("profile") or {}).get("hub_client"),
        "tasks": task_times(run.stdout),
    }


# Runs argv and writes its peak memory to a file: the largest max RSS of argv and what it waited for (wait4(2)).
# A process forked from the benchmark itself would start with the benchmark's own high-water mark (Linux keeps
# it across exec), so argv is forked from this small interpreter instead.
PEAK_RSS_WRAPPER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(argv: list[str], cwd: Path, env: dict | None = None) -> tuple[float, float]:
    """Seconds and peak RSS (MiB) of argv."""
    with tempfile.NamedTemporaryFile("r", suffix=".maxrss") as peak:
        start = time.time()
        result = subprocess.run(
            [sys.executable, "-I", "-S", "-c", PEAK_RSS_WRAPPER, peak.name, *argv], check=False, cwd=cwd, env=env
        )
        seconds = time.time() - start
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(argv)[:300]} failed ({result.returncode})")
        return seconds, round(int(peak.read() or 0) / 1024, 1)


def time_shell(script: str, cwd: Path, env: dict | None = None) -> dict:
    seconds, peak = run_measured(["bash", "-c", f"set -euo pipefail; {script}"], cwd, env)
    return {"seconds": seconds, "peak_rss_mib": peak}


def check_sums(dest: Path, sums: dict[str, str]) -> None:
    """Every `<name>  <sha256>` line that a pipeline wrote (*.sha256 files) agrees with the source."""
    for sha_file in dest.glob("*.sha256"):
        for line in sha_file.read_text().splitlines():
            digest, _, name = line.partition("  ")
            name = name if name and name != "-" else sha_file.name[: -len(".sha256")]
            if digest != sums[name]:
                raise SystemExit(f"the sha256 of {name} from {sha_file.name} is wrong")


def transfer_alone(url: str, dest: Path, streams: int) -> dict:
    """Wall time and max RSS of a process that runs only the http transfer (module defaults but `streams`)."""
    code = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
from tests.module_utils_loader import load_module_util
t = load_module_util("model.transfer")
source = t.make_source({{"type": "http", "url": {url + "/mirror/acme/big/"!r}}}, None, 60)
store = t.ModelStore({str(dest)!r}, source, streams={streams})
plan = store.plan()
store.fetch(plan)
store.finalize(store.plan(listing=plan["listing"]))
"""
    os.sync()
    seconds, peak = run_measured([sys.executable, "-c", code], REPO_ROOT)
    drop(dest)
    return {"streams": streams, "seconds": round(seconds, 3), "peak_rss_mib": peak}


def hf_env(url: str, home: Path) -> dict:
    """The environment of `hf download`: the double as the Hub, Xet off, a fresh HF_HOME (no cache)."""
    return {
        **{key: value for key, value in os.environ.items() if not key.startswith("HF_")},
        "HF_ENDPOINT": url,
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }


def run_methods(
    work: Path, url: str, source: Path, sums: dict[str, str], reps: int, *, baseline: tuple[Path, Path] | None
) -> dict[str, list[dict]]:
    """Time every method `reps` times, interleaved; every copy is checked against the source."""
    names = sorted(sums)
    results: dict[str, list[dict]] = {}
    base = f"{url}/mirror/acme/big"
    curls = " ".join(f"-o {n} {base}/{n}" for n in names)
    parallel = " ".join(f"curl -sf -o {n} {base}/{n} &" for n in names) + " wait"
    pipelines = " ".join(f"(curl -sf {base}/{n} | tee {n} | sha256sum > {n}.sha256) &" for n in names) + " wait"
    hf = f"{TOOLS_VENV}/bin/hf download acme/big --revision main --local-dir . > /dev/null"
    methods = {
        "fetch_models.yml type http (parallel ranges, sha256 in-stream)": ("playbook", "http"),
        HUB: ("playbook", "hf"),
        HF: ("hf", hf),
        HF_SHA: ("hf", f"{hf} && sha256sum {' '.join(names)} > payload.sha256"),
        "curl, one stream, files in sequence": ("shell", f"curl -sf {curls}"),
        "curl, 4 files in parallel": ("shell", parallel),
        NATIVE: ("shell", pipelines),
        "sha256sum over the payload (one read)": ("hash", None),
    }
    if baseline:
        methods[f"{BASELINE} ({baseline[0]})"] = ("baseline", "hf")
    for rep in range(reps):
        for label, (kind, what) in methods.items():
            dest = work / f"dest-{rep}"
            drop(dest)
            dest.mkdir(parents=True)
            os.sync()  # every method starts without the previous one's dirty pages
            if kind in ("playbook", "baseline"):
                tree, venv = baseline if kind == "baseline" else (REPO_ROOT, TOOLS_VENV)
                sample = time_playbook(work, what, url, dest / "model", tree=tree, venv=venv)
                check_copy(sums, dest / "model")
            elif kind in ("shell", "hf"):
                env = hf_env(url, work / f"hf-home-{rep}") if kind == "hf" else None
                sample = time_shell(what, dest, env)
                drop(work / f"hf-home-{rep}")
                check_copy(sums, dest)
                check_sums(dest, sums)
            else:
                sample = time_shell("sha256sum " + " ".join(names) + " > /dev/null", source)
            results.setdefault(label, []).append(sample)
            print(f"rep {rep + 1}: {label}: {sample['seconds']:.2f} s", flush=True)
            drop(dest)
    return results


def hub_profile(sample: dict) -> list[dict]:
    """The Hub path's time, phase by phase, from one playbook run (see the README for what each covers)."""
    client = sample["hub_client"] or {}
    tasks = sample["tasks"]

    def task(prefix: str) -> float:
        return sum(seconds for name, seconds in tasks.items() if name.startswith(prefix))

    listing = task("model_store : Compare each directory with its source")
    tools = sum(
        task(f"model_store : {name}")
        for name in (
            "Install the Hub client",  # the include (this tree) or the task of the tree before it
            "Ask the tools venv",
            "Read which lock",
            "Create the tools venv",
            "Put the lock",
            "Install the locked client",
            "Record the installed lock",
        )
    )
    manifest_s = sample["seconds"]

    def between(start: str, end: str) -> float | None:
        if client.get(start) is None or client.get(end) is None:
            return None
        return round(client[end] - client[start], 3)

    rows = [
        ("Ansible start-up, input check, other tasks before the slice", sample["before_slice_s"] - listing - tools),
        ("plan: list the Hub (task 'Compare each directory with its source')", listing),
        ("tools venv: its check and install tasks (skipped when current)", tools),
        ("client start: spawn to huggingface_hub imported", between("client_spawn_s", "client_imported_s")),
        ("metadata: first file handed over to its first body byte (HEAD)", between("first_start_s", "first_body_s")),
        ("transfer with sha256 as written: first body byte to last file done", between("first_body_s", "last_done_s")),
        (
            "verification after the last file (in-stream digests compared; reads where needed)",
            between("last_done_s", "last_verified_s"),
        ),
        ("client exit, verified.json records", between("last_verified_s", "recorded_s")),
        (
            "finalize: second plan (local) and manifest written",
            None if client.get("recorded_s") is None else round(manifest_s - client["recorded_s"], 3),
        ),
        ("after the manifest: ownership, completeness check, Ansible's end", sample["after_manifest_s"]),
    ]
    return [{"phase": name, "seconds": None if value is None else round(value, 3)} for name, value in rows]


def best_of(samples: list[dict], key: str = "seconds") -> dict:
    return min(samples, key=lambda sample: sample[key])


def hub_against_cli(results: dict[str, list[dict]]) -> dict:
    """The Hub path against `hf download` (transfer) and `hf download` + sha256sum (whole command)."""
    hub, hf, hf_sha = results[HUB], results[HF], results[HF_SHA]
    transfer = [round(c["seconds"] / h["seconds"], 3) for h, c in zip(hub, hf, strict=True)]
    whole = [round(c["seconds"] / h["command_to_manifest_s"], 3) for h, c in zip(hub, hf_sha, strict=True)]
    peak = [round(h["hub_client"]["client_max_rss_mib"] + h["hub_client"]["module_max_rss_mib"], 1) for h in hub]
    return {
        "transfer_vs_hf_download": round(best_of(hf)["seconds"] / best_of(hub)["seconds"], 3),
        "transfer_vs_hf_download_by_rep": transfer,
        "transfer_target": 0.8,
        "whole_vs_hf_download_sha256sum": round(
            best_of(hf_sha)["seconds"] / best_of(hub, "command_to_manifest_s")["command_to_manifest_s"], 3
        ),
        "whole_vs_hf_download_sha256sum_by_rep": whole,
        "whole_target": 1.0,
        "hub_peak_rss_mib_client_plus_module": max(peak),
        "hf_download_peak_rss_mib": max(sample["peak_rss_mib"] for sample in hf),
        "peak_rss_budget_mib": 512,
    }


def summarize(results: dict[str, list[dict]], mib: float, files: int, reps: int, sweep: list[dict]) -> dict:
    reference = min(s["seconds"] for s in results[NATIVE])
    rows = []
    for label, samples in results.items():
        best = best_of(samples)
        row = {
            "how": label,
            "best_s": round(best["seconds"], 3),
            "mib_per_s": round(mib / best["seconds"], 1),
            "vs_native_reference": round(reference / best["seconds"], 3),
            "samples_s": [round(s["seconds"], 3) for s in samples],
        }
        if "peak_rss_mib" in best:
            row["peak_rss_mib"] = max(s["peak_rss_mib"] for s in samples)
        if best.get("hub_client"):
            row["peak_rss_mib"] = max(
                round(s["hub_client"]["client_max_rss_mib"] + s["hub_client"]["module_max_rss_mib"], 1) for s in samples
            )
        if "command_to_manifest_s" in best:
            whole = min(s["command_to_manifest_s"] for s in samples)
            row.update(
                command_to_manifest_s=round(whole, 3),
                command_mib_per_s=round(mib / whole, 1),
                command_vs_native_reference=round(reference / whole, 3),
                command_total_s=round(min(s["command_s"] for s in samples), 3),
                samples_command_to_manifest_s=[round(s["command_to_manifest_s"], 3) for s in samples],
            )
        rows.append(row)
    hub_best = best_of(results[HUB])
    baseline = next((label for label in results if label.startswith(BASELINE)), None)
    return {
        "payload_mib": round(mib, 1),
        "files": files,
        "reps": reps,
        "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "huggingface_hub": hub_version(),
        "http_transfer_alone_by_streams": [{**row, "mib_per_s": round(mib / row["seconds"], 1)} for row in sweep],
        "rows": rows,
        "hub_vs_hf_cli": hub_against_cli(results),
        "hub_profile_best_rep": hub_profile(hub_best),
        "hub_client_timeline_best_rep": hub_best["hub_client"],
        "hub_tasks_best_rep": hub_best["tasks"],
        "baseline_profile_best_rep": hub_profile(best_of(results[baseline])) if baseline else None,
        "baseline_tasks_best_rep": best_of(results[baseline])["tasks"] if baseline else None,
    }


def hub_version() -> str:
    code = "import huggingface_hub; print(huggingface_hub.__version__)"
    python = f"{TOOLS_VENV}/bin/python"
    return subprocess.run([python, "-c", code], check=False, capture_output=True, text=True).stdout.strip()


def seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f} s"


def table_text(report: dict) -> str:
    lines = [
        f"{report['payload_mib']:.0f} MiB in {report['files']} files over loopback, {report['cpus']} CPUs, "
        f"best of {report['reps']} (load average at the end: {report['load_average_at_end'][0]:.1f}); "
        f"huggingface_hub {report['huggingface_hub']}",
        "| how | transfer | MiB/s | × native | whole command to manifest | MiB/s | × native | peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        whole = (
            f"{row['command_to_manifest_s']:.2f} s | {row['command_mib_per_s']:.0f} | "
            f"{row['command_vs_native_reference']:.2f}"
            if "command_to_manifest_s" in row
            else " | | "
        )
        rss = f"{row['peak_rss_mib']:.0f} MiB" if "peak_rss_mib" in row else ""
        lines.append(
            f"| {row['how']} | {row['best_s']:.2f} s | {row['mib_per_s']:.0f} | {row['vs_native_reference']:.2f} | "
            f"{whole} | {rss} |"
        )
    cli = report["hub_vs_hf_cli"]
    lines += [
        "",
        "Hub path against the Hub's CLI (time of the CLI / time of the Hub path; best of each, then per repetition):",
        f"- transfer vs `hf download`: {cli['transfer_vs_hf_download']:.2f}× "
        f"(by repetition {', '.join(f'{r:.2f}' for r in cli['transfer_vs_hf_download_by_rep'])}; target ≥ 0.8)",
        f"- whole command vs `hf download` + sha256sum: {cli['whole_vs_hf_download_sha256sum']:.2f}× "
        f"(by repetition {', '.join(f'{r:.2f}' for r in cli['whole_vs_hf_download_sha256sum_by_rep'])}; "
        "target ≥ 1.0)",
        f"- peak memory: Hub path {cli['hub_peak_rss_mib_client_plus_module']:.0f} MiB (client + module, "
        f"the larger of the repetitions), hf download {cli['hf_download_peak_rss_mib']:.0f} MiB; budget 512 MiB",
    ]
    for title, key in (("Hub path", "hub_profile_best_rep"), ("baseline tree's Hub path", "baseline_profile_best_rep")):
        if report.get(key):
            lines += ["", f"{title}: where the time goes (its best repetition):", "| phase | seconds |", "|---|---|"]
            lines += [f"| {row['phase']} | {seconds(row['seconds'])} |" for row in report[key]]
    lines.append("")
    lines.append("http transfer alone (one process: plan, fetch, verify, record), by streams:")
    lines.append("| streams | seconds | MiB/s | peak RSS |")
    lines.append("|---|---|---|---|")
    for row in report["http_transfer_alone_by_streams"]:
        rss = row["peak_rss_mib"]
        lines.append(f"| {row['streams']} | {row['seconds']:.2f} | {row['mib_per_s']:.0f} | {rss} MiB |")
    return "\n".join(lines) + "\n"


def warm_double(url: str) -> None:
    """One listing, so that the double has the ids of every file before anything is timed (as the Hub does)."""
    commit = json.load(urllib.request.urlopen(f"{url}/api/models/acme/big/revision/main", timeout=600))["sha"]
    urllib.request.urlopen(f"{url}/api/models/acme/big/tree/{commit}?recursive=true", timeout=600).read()


def baseline_of(tree: Path | None, work: Path) -> tuple[Path, Path] | None:
    """The other checkout and a copy of the tools venv for it (each tree keeps its own fetch program there)."""
    if tree is None:
        return None
    venv = work / "baseline-tools-venv"
    shutil.copytree(TOOLS_VENV, venv, symlinks=True)
    return tree.resolve(), venv


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--streams",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 2, 4, 8],
        help="stream counts for the transfer-alone sweep (default 1,2,4,8)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--baseline-tree", type=Path, default=None, help="another checkout: its Hub path too")
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
            warm_double(mirror.url)
            (work / "requests.jsonl").unlink(missing_ok=True)
            if not (TOOLS_VENV / "bin" / "hf").exists():  # the role creates the venv: one Hub fetch first
                time_playbook(work, "hf", mirror.url, work / "warm-up" / "model", tree=REPO_ROOT, venv=TOOLS_VENV)
                drop(work / "warm-up")
            baseline = baseline_of(args.baseline_tree, work)
            results = run_methods(work, mirror.url, source, sums, args.reps, baseline=baseline)
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
