#!/usr/bin/env python3
"""Smoke of the sglang role's JIT pre-build (roles/sglang/files/prebuild_kernels.py) on a real NVIDIA GPU host.

What the sandbox cannot show (its engines are TEST DOUBLES): that the modules the script builds through FlashInfer's
and SGLang's own entry points are the ones the engine then loads without compiling. On the local GPU it

1. starts the pre-build on cold caches in a transient unit (``systemd-run``, KillMode=control-group, as the deploy
   runs it; a process group of its own where systemd-run is not there), waits for a compiler (nvcc, cicc, ptxas),
   SIGKILLs the unit's main process and checks that no compiler of that build is left and nothing was published;
2. runs the pre-build again on fresh caches and records the seconds per module, then once more (all cached);
3. in a fresh process with the unit's environment (the engine's: the GPU visible, SGLANG_CRASH_ON_JIT_COMPILE=1)
   loads the modules through the engines' own entry points - ``flashinfer.sampling.get_sampling_module()`` and a
   ``top_k_renorm_probs`` call on the GPU, SGLang's ``_jit_sampling_module`` (what
   ``tree_speculative_sampling_target_only`` loads) - while watching that no nvcc/cicc/ptxas starts.

Without systemd (as root) it re-executes itself in a private PID namespace (``unshare --pid --fork --mount-proc``).
Runnable with what a GPU machine has (PyTorch with CUDA, nvcc, a C++ compiler) plus carried wheels: ``--wheels DIR``
holds sglang 0.5.23 and flashinfer-python 0.7.2 (with what they import that the machine lacks: apache-tvm-ffi,
msgspec, ninja, ...); they are installed with ``--no-deps`` into a venv that sees the machine's torch
(``--system-site-packages``). Or ``--python`` names an interpreter that already has both.

    python3 tests/gpu/prebuild_kernels_smoke.py --wheels /path/to/wheels [--out tests/gpu/results]
        [--vocab-size 163840] [--timeout-s 1800]

Prints the result as JSON and writes ``<out>/prebuild_kernels_smoke.json``. Exit 0 when every check holds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles" / "sglang" / "files" / "prebuild_kernels.py"
MODULES = ["flashinfer-sampling", "sglang-speculative-sampling"]
COMPILERS = ("nvcc", "cicc", "ptxas", "cudafe++", "fatbinary", "nvlink")

LOAD = r"""
import json, sys, time
import torch
began = time.monotonic()
import flashinfer.sampling
flashinfer.sampling.get_sampling_module()
probs = torch.rand(4, int(sys.argv[1]), device="cuda").softmax(-1)
flashinfer.sampling.top_k_renorm_probs(probs, 8)
torch.cuda.synchronize()
flashinfer_s = time.monotonic() - began
began = time.monotonic()
import math
from sglang.kernels.ops.speculative import sampling
sampling._jit_sampling_module(math.gcd(4, int(sys.argv[1])), True)
print(json.dumps({"flashinfer-sampling": round(flashinfer_s, 2), "sglang-speculative-sampling":
                  round(time.monotonic() - began, 2)}))
"""


def jit_target(cuda_home: str) -> str:
    """The target as the sglang role derives it: compute capability + SGLang's and FlashInfer's suffix rule."""
    cc = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                        text=True, check=True).stdout.split()[0]
    out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"], capture_output=True, text=True,
                         check=True).stdout
    found = re.search(r"release (\d+)\.(\d+)", out)
    release = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    major, minor = (int(part) for part in cc.split("."))
    if major == 12 and minor == 0 and release >= (12, 9):
        return f"{cc}f"
    return f"{cc}a" if major >= 9 else cc


def compilers() -> list[str]:
    """pid and name of every compiler process running now."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                comm = (proc / "comm").read_text().strip()
            except OSError:
                continue
            if comm in COMPILERS:
                found.append(f"{proc.name}:{comm}")
    return found


def prepare_python(args: argparse.Namespace, work: Path) -> str:
    if args.python:
        return args.python
    env_dir = work / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env_dir)
    wheels = sorted(str(path) for path in Path(args.wheels).glob("*.whl"))
    subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--no-index", *wheels],
                   check=True)
    return str(env_dir / "bin" / "python")


def unit_env(python: str, work: Path, name: str, arch: str, cuda_home: str) -> dict[str, str]:
    """The SGLang unit's JIT environment (roles/sglang), its caches under work/name."""
    root = work / name
    (root / "home").mkdir(parents=True, exist_ok=True)
    return {"HOME": str(root / "home"), "SGLANG_CACHE_DIR": str(root / "cache"), "CUDA_HOME": cuda_home,
            "PATH": f"{Path(python).parent}:{cuda_home}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin",
            "FLASHINFER_WORKSPACE_BASE": str(root / "jit-cache"), "FLASHINFER_CUDA_ARCH_LIST": arch,
            "SGLANG_JIT_CACHE_DIR": str(root / "cache" / "jit")}


def prebuild_argv(python: str, arch: str, model: Path) -> list[str]:
    return [python, str(SCRIPT), "--arch", arch, "--model", str(model), *[f"--module={m}" for m in MODULES]]


def killed_mid_build(argv: list[str], env: dict[str, str], root: Path) -> dict:
    """Start the pre-build as the deploy does, SIGKILL its main process once a compiler runs; what is left."""
    unit = f"bws-prebuild-smoke-{os.getpid()}"
    before = set(compilers())
    if shutil.which("systemd-run") and os.geteuid() == 0:
        setenv = [f"--setenv={key}={value}" for key, value in env.items()]
        job = subprocess.Popen(["systemd-run", "--wait", "--pipe", "--collect", "--quiet", f"--unit={unit}",
                                "-p", "KillMode=control-group", *setenv, "--", *argv],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        how = "systemd-run"
    elif shutil.which("unshare") and os.geteuid() == 0:
        # No systemd (a container): a PID namespace stands in for the unit's cgroup. The build is its init; when
        # the init dies the kernel kills every process of the namespace, ninja's compilers in their own groups too,
        # as KillMode=control-group does for the unit's cgroup.
        job = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child=SIGKILL", "--mount-proc", *argv],
                               env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        how = "pid namespace"
    else:
        job = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        how = "process group"
    deadline = time.monotonic() + 300
    while not set(compilers()) - before:
        if job.poll() is not None or time.monotonic() > deadline:
            return {"how": how, "ok": False, "why": "no compiler started"}
        time.sleep(0.2)
    seen = sorted(set(compilers()) - before)
    if how == "systemd-run":
        subprocess.run(["systemctl", "kill", "--kill-whom=main", "--signal=SIGKILL", f"{unit}.service"], check=False)
    elif how == "pid namespace":
        job.kill()  # unshare passes SIGKILL on to the namespace's init (--kill-child): the namespace goes with it
    else:
        os.killpg(job.pid, 9)  # what a timeout of a process group does; ninja's compilers have groups of their own
    job.wait(timeout=120)
    time.sleep(2)
    left = sorted(set(compilers()) - before)
    published = [str(path) for path in root.rglob("*.so")]
    return {"how": how, "compilers_seen": seen, "compilers_left": left, "published": published,
            "ok": not published and (how == "process group" or not left)}  # a bare group cannot take them all


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--wheels", help="a directory of wheels: sglang 0.5.23, flashinfer-python 0.7.2 and more")
    source.add_argument("--python", help="an interpreter that has SGLang 0.5.23 and FlashInfer 0.7.2")
    parser.add_argument("--vocab-size", type=int, default=163840, help="the target model's (Kimi K2: 163840)")
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("--out", default=str(REPO / "tests" / "gpu" / "results"))
    args = parser.parse_args()
    if shutil.which("nvidia-smi") is None:
        print("no nvidia-smi: this smoke needs a host with an NVIDIA GPU", file=sys.stderr)
        return 2
    if (os.geteuid() == 0 and shutil.which("unshare") and not Path("/run/systemd/system").is_dir()
            and os.environ.get("BWS_IN_PRIVATE_PID_NS") != "1"):
        # Without systemd its kill test signals processes of its own: inside a PID namespace of its own, they are the
        # only ones it can reach. With systemd it kills its own transient unit, which must be outside one.
        env = {**os.environ, "BWS_IN_PRIVATE_PID_NS": "1"}
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, *sys.argv], env=env,
                              check=False).returncode
    cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    arch = jit_target(cuda_home)
    result: dict = {"arch": arch, "cuda_home": cuda_home}
    with tempfile.TemporaryDirectory(prefix="prebuild-smoke-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        python = prepare_python(args, work)
        model = work / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"vocab_size": args.vocab_size}))

        env = unit_env(python, work, "killed", arch, cuda_home)
        result["kill"] = killed_mid_build(prebuild_argv(python, arch, model), env, work / "killed")

        env = unit_env(python, work, "built", arch, cuda_home)
        reports = []
        for _ in range(2):
            began = time.monotonic()
            proc = subprocess.run(prebuild_argv(python, arch, model), env=env, capture_output=True, text=True,
                                  timeout=args.timeout_s, check=False)
            if proc.returncode != 0:
                result["prebuild_failed"] = proc.stderr[-4000:]
                break
            reports.append({**json.loads(proc.stdout.splitlines()[-1]), "wall_s": round(time.monotonic() - began, 1)})
        result["prebuild"] = reports

        seen: set[str] = set()
        before = set(compilers())
        watching = threading.Event()

        def watch() -> None:
            while not watching.is_set():
                seen.update(set(compilers()) - before)
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        load_env = {**env, "SGLANG_CRASH_ON_JIT_COMPILE": "1"}
        proc = subprocess.run([python, "-c", LOAD, str(args.vocab_size)], env=load_env, capture_output=True,
                              text=True, timeout=600, check=False)
        watching.set()
        watcher.join()
        result["load"] = {"rc": proc.returncode, "compilers_started": sorted(seen),
                          "seconds": json.loads(proc.stdout.splitlines()[-1]) if proc.returncode == 0 else None,
                          "stderr": proc.stderr[-3000:] if proc.returncode else ""}
    ok = (result["kill"]["ok"] and len(result.get("prebuild", [])) == 2
          and all(m["status"] == "cached" for m in result["prebuild"][1]["modules"])
          and result["load"]["rc"] == 0 and not result["load"]["compilers_started"])
    result["ok"] = ok
    text = json.dumps(result, indent=1, sort_keys=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "prebuild_kernels_smoke.json").write_text(text + "\n")
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
