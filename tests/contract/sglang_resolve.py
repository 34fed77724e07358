"""What SGLang's ServerArgs resolution (and the JIT pre-build's FlashInfer half) need on top of the CPU contract venv.

The lock's `contract_resolve` section names the packages, installed once with `pip --target --no-deps` at the
versions of the lock's `requirements` into a directory next to the contract venv, keyed by a hash of that
list, so the parser venv that the other contract tests share is never rebuilt for it; and the test stubs,
which stay in the repository (tests/contract/stubs/resolve/). Code that runs resolution puts both directories
first on sys.path and imports ``bws_resolve_shim`` before SGLang.

`contract_prebuild` names FlashInfer and what it imports, in an overlay of its own built the same way
(prebuild_path()): with FlashInfer importable SGLang's resolution takes other branches, so the resolution tests
never see it.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from sglang_helpers import REPO_ROOT, contract_python, pinned_sglang_lock, unavailable

STUBS = REPO_ROOT / "tests" / "contract" / "stubs" / "resolve"
BUILD_TIMEOUT_S = 900


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_packages(lock: dict, section: str = "contract_resolve") -> list[str]:
    pins = {_normalize(r.split("==")[0].split("[")[0]): r.split("==", 1)[1] for r in lock["requirements"]}
    return [f"{name}=={pins[_normalize(name)]}" for name in lock[section]["packages"]]


def _recipe(lock: dict, section: str) -> str:
    return hashlib.sha256(json.dumps(pinned_packages(lock, section)).encode()).hexdigest()[:16]


@functools.cache
def _build(section: str = "contract_resolve") -> tuple[Path | None, str]:
    python = contract_python()
    lock = pinned_sglang_lock()
    recipe = _recipe(lock, section)
    name = section.removeprefix("contract_")
    contract_dir = python.parents[2]
    target = contract_dir / f"sglang-{lock['version']}-{name}-{recipe}"
    stamp = target / ".bws-resolve-ok"
    with open(contract_dir / f".lock-sglang-{lock['version']}-{name}", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # one builder at a time; others wait, then find it built
        if stamp.exists():
            return target, ""
        shutil.rmtree(target, ignore_errors=True)
        try:
            proc = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "-q", "install",
                                   "--no-deps", "--target", str(target), *pinned_packages(lock, section)],
                                  capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return None, f"pip install ran past {BUILD_TIMEOUT_S} s"
        if proc.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            return None, f"pip install failed (rc {proc.returncode}): {proc.stderr.strip()[-1500:]}"
        stamp.write_text(f"recipe={recipe}\n")
    return target, ""


def resolve_path() -> list[Path]:
    """The directories to put first on sys.path (stubs, packages); skips (fails under CI) when they cannot be built."""
    target, reason = _build()
    if target is None:
        unavailable(f"the SGLang resolution overlay cannot be built: {reason}")
    missing = [stub for stub in pinned_sglang_lock()["contract_resolve"]["stubs"] if not (STUBS / stub).is_dir()]
    if missing:
        pytest.fail(f"the lock names resolution stubs missing from {STUBS}: {missing}")
    return [STUBS, target]


def _build_prebuild() -> tuple[Path | None, str]:
    return _build("contract_prebuild")


def prebuild_path() -> list[Path]:
    """The directory with FlashInfer for the pre-build's contract test; skips (fails under CI) without it."""
    target, reason = _build_prebuild()
    if target is None:
        unavailable(f"the FlashInfer overlay cannot be built: {reason}")
    return [target]
