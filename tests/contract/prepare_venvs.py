"""Build every contract venv the contract tests use, through the same functions the tests call.

scripts/test.sh runs this in the background, at a lower CPU priority, while the lint, unit and Molecule
stages run, so that the downloads and installs take the CPU those stages leave; the contract stage then
finds the venvs built. The builders run in lanes side by side (SGLang's venvs; the pinned vLLM; the other vLLM
versions, which wait for the pinned one's shared torch base venv): one after another, a cold build took
longer than every stage before the contracts. Run by hand: `python tests/contract/prepare_venvs.py`. Exit 1 when
one cannot be built, naming it (the contract tests would fail on it under CI anyway).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the contract tests import their helpers by bare name
import sglang_helpers
import sglang_resolve
import vllm_helpers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripted_engine"))
import engine_venv  # the test-engine venvs of the real front ends, layered on the pinned contract venvs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "real_core"))
import real_core_venv  # the REAL-CORE TEST ENGINE (vLLM 0.32.0 CPU build), on the torch base venv

Builder = tuple[str, Callable[[], tuple[Path | None, str]]]


def lanes() -> list[list[Builder]]:
    """Builders that depend on each other share a lane; lanes run side by side."""
    pinned, *others = [vllm_helpers.pinned_vllm_version(), *vllm_helpers.other_locked_vllm_versions()]
    vllm = [(f"vllm {version}", lambda version=version: vllm_helpers._run_script(version))
            for version in (pinned, *others)]
    return [
        [("sglang (pinned)", sglang_helpers._build_venv),
         ("sglang ServerArgs resolution packages", sglang_resolve._build),
         ("sglang pre-build's FlashInfer", sglang_resolve._build_prebuild),
         ("sglang test engine", lambda: build_test_engine("sglang"))],
        [*vllm[:1], ("vllm test engine", lambda: build_test_engine("vllm")),
         (f"real-core test engine ({real_core_venv.LABEL})", build_real_core)],
        vllm[1:],  # the version's own venv; the script waits for the base venv the pinned lane builds
    ]


def build_test_engine(engine: str) -> tuple[Path | None, str]:
    try:
        return engine_venv.build(engine), ""
    except SystemExit as failed:
        return None, str(failed)


def build_real_core() -> tuple[Path | None, str]:
    try:
        return real_core_venv.build(), ""
    except SystemExit as failed:
        return None, str(failed)


def build(name: str, builder: Callable[[], tuple[Path | None, str]]) -> bool:
    start = time.monotonic()
    try:
        path, reason = builder()
    except (pytest.skip.Exception, pytest.fail.Exception) as refused:  # a venv it depends on is missing
        path, reason = None, str(refused)
    took = time.monotonic() - start
    if path is None:
        print(f"contract venv {name}: FAILED after {took:.0f} s: {reason}", flush=True)
        return False
    print(f"contract venv {name}: ready in {took:.0f} s ({path.name})", flush=True)
    return True


def run_lane(lane: list[Builder]) -> list[str]:
    """The names of the lane's builders that failed (a failed one does not stop the next)."""
    return [name for name, builder in lane if not build(name, builder)]


def main() -> int:
    start = time.monotonic()
    work = [lane for lane in lanes() if lane]
    with ThreadPoolExecutor(max_workers=len(work)) as pool:
        failed = [name for names in pool.map(run_lane, work) for name in names]
    print(f"contract venvs: {'FAILED: ' + ', '.join(failed) if failed else 'all ready'} "
          f"in {time.monotonic() - start:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
