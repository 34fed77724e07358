"""Build the test-engine venv of an engine: the engine's real server code, runnable on a CPU.

The contract venv of the pinned version (scripts/contract-venv-<engine>.sh: CPU torch, the engine itself, its
parser packages) lacks what the HTTP server imports (FastAPI, uvicorn, transformers, ...). The test-engine venv
adds exactly that, from the lock's `test_engine` section, and reads everything else from the contract venv
through a `.pth` file, so the 3.6 GB are not installed twice and the CPU torch stays:

    $CACHE_DIR/test-engine/<engine>-<version>/        a venv of the contract venv's base interpreter
        lib/python3.X/site-packages/                   the `test_engine` packages, each pinned, --no-deps
        lib/python3.X/site-packages/_bws_test_engine.pth  -> tests/scripted_engine/stubs (copied in), the
                                                          contract venv's site-packages and what its own
                                                          .pth files add (stubs, vLLM's torch base venv)
The `.pth` paths are relative to the real site-packages folder, so the two cache folders can be mounted
elsewhere together (the systemd test hosts mount them read-only under /opt/bws-test-engine/) and the venv's
lib/ can be reached through a symlink (the engine venv path a deploy expects, /opt/<engine>/venv).

Every package is installed with --no-deps at the version of the lock's GPU requirement set (or the exact pin the
section gives): the resolver must never see the engines' CUDA torch. Rebuilt only when the recipe (the section,
the pins, the stubs, the contract venv's own recipe) changes; one builder at a time per cache.

    python tests/scripted_engine/engine_venv.py ENGINE      build (or find) it; prints the venv's path last
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
from engine_locks import load_lock  # noqa: E402

# Where the lock's test_engine stubs are looked up, in order: the test engine's own, then the benchmark clients'
# (`datasets`, which SGLang's client imports at module level: tests/contract/bench_stubs).
STUB_ROOTS = (HERE / "stubs", REPO_ROOT / "tests" / "contract" / "bench_stubs")
STAMP = ".bws-test-engine-ok"
CONTRACT_SCRIPT = {"sglang": "contract-venv-sglang.sh", "vllm": "contract-venv-vllm.sh"}
BUILD_TIMEOUT_S = 1200


def cache_dir() -> Path:
    explicit = os.environ.get("BWS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "blackwell-serving"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_packages(lock: dict) -> list[str]:
    """The section's packages as name==version: its own exact pins, else the GPU requirement set's version."""
    section = lock.get("test_engine") or {}
    pins = {_normalize(r.split("==")[0].split("[")[0]): r.split("==", 1)[1] for r in lock["requirements"]}
    packages = []
    for package in section.get("packages", []):
        if "==" in package:
            packages.append(package)
        elif _normalize(package) in pins:
            packages.append(f"{package}=={pins[_normalize(package)]}")
        else:
            raise SystemExit(f"{lock['engine']} {lock['version']} lock: test_engine package {package!r} has no "
                             "version in `requirements`: pin it in the section (name==version)")
    return packages


def stub_dirs(lock: dict) -> list[Path]:
    """The folders of the lock's stubs: a package (its __init__.py) or the .dist-info folder that makes
    importlib.metadata find it, from the first of STUB_ROOTS that has it."""
    found, missing = [], []
    for name in (lock.get("test_engine") or {}).get("stubs", []):
        marker = "METADATA" if name.endswith(".dist-info") else "__init__.py"
        folder = next((root / name for root in STUB_ROOTS if (root / name / marker).is_file()), None)
        if folder is None:
            missing.append(name)
        else:
            found.append(folder)
    if missing:
        roots = ", ".join(str(root.relative_to(REPO_ROOT)) for root in STUB_ROOTS)
        raise SystemExit(f"the {lock['engine']} lock names test-engine stubs missing from {roots}: {missing}")
    return found


def recipe_id(lock: dict, contract_stamp: str) -> str:
    digest = hashlib.sha256(json.dumps([pinned_packages(lock), contract_stamp]).encode())
    for folder in stub_dirs(lock):
        files = (path for path in folder.rglob("*") if path.is_file() and "__pycache__" not in path.parts)
        for path in sorted(files):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def contract_venv(engine: str, version: str) -> Path:
    """The version's contract venv, built by its script when missing (prints the path last)."""
    script = REPO_ROOT / "scripts" / CONTRACT_SCRIPT[engine]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run(["bash", str(script), version], capture_output=True, text=True, env=env, check=False,
                          timeout=BUILD_TIMEOUT_S)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{script.name} failed (rc {proc.returncode}): {proc.stderr.strip()[-1500:]}")
    return Path(lines[-1])


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3.*/site-packages"))
    if len(found) != 1:
        raise SystemExit(f"{venv}: expected one lib/python3.*/site-packages, found {found}")
    return found[0]


def contract_path_files(contract_site: Path) -> list[Path]:
    """The folders the contract venv's own `_bws_*.pth` files add (its stubs; vLLM's shared torch base venv):
    a .pth inside a folder that another .pth adds is not read, so they are carried over."""
    folders = []
    for pth in sorted(contract_site.glob("_bws_*.pth")):
        for line in pth.read_text().splitlines():
            if line.strip() and not line.startswith(("#", "import")) and Path(line.strip()).is_dir():
                folders.append(Path(line.strip()))
    return folders


def build(engine: str) -> Path:
    lock = load_lock(engine)
    contract = contract_venv(engine, lock["version"])
    contract_stamp = next(contract.glob(".bws-contract-ok"), None)
    recipe = recipe_id(lock, contract_stamp.read_text() if contract_stamp else "")
    return built_once(cache_dir() / "test-engine" / f"{engine}-{lock['version']}", STAMP, recipe,
                      lambda venv: _install(lock, contract, venv))


def built_once(venv: Path, stamp_name: str, recipe: str, install) -> Path:
    """`venv`, built by `install(venv)` unless its stamp says this recipe: one builder at a time per venv (the others
    wait, then find it built), and never a half-built venv that looks usable."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".lock-{venv.name}", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        stamp = venv / stamp_name
        if stamp.is_file() and stamp.read_text() == f"recipe={recipe}\n" and (venv / "bin" / "python").exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        try:
            install(venv)
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        stamp.write_text(f"recipe={recipe}\n")
    return venv


def _install(lock: dict, contract: Path, venv: Path) -> None:
    base = subprocess.run([str(contract / "bin" / "python"), "-c", "import sys; print(sys._base_executable)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = site_packages(venv)
    stubs = venv / "test-engine-stubs"
    for folder in stub_dirs(lock):
        shutil.copytree(folder, stubs / folder.name, ignore=shutil.ignore_patterns("__pycache__"))
    contract_site = site_packages(contract)
    relative = [os.path.relpath(path, site) for path in (stubs, contract_site, *contract_path_files(contract_site))]
    # One `import` line (site.addpackage runs it with `sitedir` in scope): the paths are resolved from the real
    # location of this site-packages, so the venv also works through a symlinked lib/ (the test hosts' engine
    # venv paths) and wherever the two cache folders are mounted together.
    # (No comprehension: its scope would not see `sitedir`.)
    joined = ", ".join(f"os.path.normpath(os.path.join(d, {path!r}))" for path in relative)
    (site / "_bws_test_engine.pth").write_text(
        f"import os, sys; d = os.path.realpath(sitedir); sys.path.extend([{joined}])\n")
    packages = pinned_packages(lock)
    if packages:
        # The contract venv's pip installs into this venv: --python is pip's own way to target another one.
        proc = subprocess.run([str(contract / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q",
                               "--python", str(venv / "bin" / "python"), "install", "--no-deps", *packages],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"pip install into {venv} failed (rc {proc.returncode}): {proc.stderr.strip()[-1500:]}")
    check = subprocess.run([str(venv / "bin" / "python"), "-c", (lock.get("test_engine") or {}).get("check", "")],
                           capture_output=True, text=True, check=False, timeout=300)
    if check.returncode != 0:
        raise SystemExit(f"{venv} cannot import the {lock['engine']} server: {check.stderr.strip()[-1500:]}")


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in CONTRACT_SCRIPT:
        print(f"usage: {Path(__file__).name} {{{'|'.join(CONTRACT_SCRIPT)}}}", file=sys.stderr)
        return 2
    print(build(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
