"""Shared by the vLLM contract tests: contract venvs, upstream sdist files, the patch-set machinery.

Venvs and sdists come from scripts/contract-venv-vllm.sh (cached under the project cache, keyed by version).
If one cannot be built the tests skip with the reason, except under CI (CI=true), where the contract tests
must run and a build failure fails them.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_SCRIPT = REPO_ROOT / "scripts" / "contract-venv-vllm.sh"
CHECK_SCRIPT = REPO_ROOT / "roles" / "vllm" / "files" / "check_vllm_args.py"
PATCHES_DIR = REPO_ROOT / "roles" / "vllm" / "patches"
KIMI_SET = PATCHES_DIR / "kimi-eagle3-0.17"
BUILD_TIMEOUT_S = 900
# Used only when no lock file says which vLLM is pinned (roles/vllm/locks/, `pinned: true`).
FALLBACK_PINNED_VLLM = "0.33.0"

sys.path.insert(0, str(REPO_ROOT))  # the tests package, also when this runs as a script
from tests.module_utils_loader import use_repository_module_utils  # noqa: E402

use_repository_module_utils()
sys.path.insert(0, str(REPO_ROOT / "tests"))


def pinned_vllm_version() -> str:
    try:
        from engine_locks import pinned_version
    except ImportError:
        return FALLBACK_PINNED_VLLM
    return pinned_version("vllm")


def other_locked_vllm_versions() -> list[str]:
    """Versions with a lock file that are not the pinned one (a deploy may still choose them)."""
    try:
        from engine_locks import lock_paths, read_lock_file
    except ImportError:
        return []
    pinned = pinned_vllm_version()
    return sorted(str(read_lock_file(p)["version"]) for p in lock_paths("vllm")
                  if str(read_lock_file(p)["version"]) != pinned)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"contract venv unavailable under CI: {reason}")
    pytest.skip(reason)


@functools.cache
def _run_script(*args: str) -> tuple[Path | None, str]:
    try:
        proc = subprocess.run(["bash", str(VENV_SCRIPT), *args], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None, f"{VENV_SCRIPT.name} {' '.join(args)} ran past {BUILD_TIMEOUT_S} s"
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return None, (f"{VENV_SCRIPT.name} {' '.join(args)} failed (rc {proc.returncode}): "
                      f"{proc.stderr.strip()[-1500:]}")
    return Path(lines[-1]), ""


def contract_venv(version: str) -> Path:
    """The CPU contract venv of vLLM `version` (built on first use)."""
    path, reason = _run_script(version)
    if path is None:
        _unavailable(reason)
    return path


def sdist(version: str) -> Path:
    path, reason = _run_script("--sdist-only", version)
    if path is None:
        _unavailable(reason)
    return path


@functools.cache
def _upstream_bytes(version: str, paths: tuple[str, ...]) -> dict[str, bytes]:
    """The given files out of the sdist, read in one pass that stops once all are found."""
    wanted = {f"vllm-{version}/{rel}": rel for rel in paths}
    found: dict[str, bytes] = {}
    with tarfile.open(sdist(version), "r|gz") as tar:
        for member in tar:
            rel = wanted.get(member.name)
            if rel is not None and member.isfile():
                found[rel] = tar.extractfile(member).read()
                if len(found) == len(wanted):
                    break
    return found


def extract_upstream_files(version: str, paths: list[str], dest: Path) -> Path:
    """Copy the given files (relative to the package root) out of the vLLM sdist into dest; returns dest.

    A file absent upstream (llm_base_proposer.py before 0.20) is simply not there, as in an installed tree.
    """
    for rel, data in _upstream_bytes(version, tuple(sorted(paths))).items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def load_kimi_set():
    from ansible_collections.blackwell.serving.plugins.module_utils.patch import patchset as bws_patchset

    manifest = yaml.safe_load((KIMI_SET / "patchset.yml").read_text())
    return bws_patchset.load_patchset(str(KIMI_SET), manifest), manifest


def files_the_set_reads(patchset) -> list[str]:
    """Touched files plus every file an upstream marker looks at."""
    paths = list(patchset.touched)
    for entry in patchset.patches:
        paths.extend(c.path for c in entry.upstream_fixed_if if c.path not in paths)
    return sorted(set(paths))
