"""Build every contract venv the contract tests use, through the same functions the tests call.

scripts/test.sh runs this in the background while the lint and unit stages run, so that the downloads
and installs (network and disk bound) overlap with CPU-bound work; the contract stage then finds the
venvs built. Run by hand: `python tests/contract/prepare_venvs.py`. Exit 1 when
one cannot be built, naming it (the contract tests would fail on it under CI anyway).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the contract tests import their helpers by bare name
import sglang_helpers
import sglang_resolve
import vllm_helpers


def builders() -> list[tuple[str, Callable[[], tuple[Path | None, str]]]]:
    vllm_versions = [vllm_helpers.pinned_vllm_version(), *vllm_helpers.other_locked_vllm_versions()]
    return [
        ("sglang (pinned)", sglang_helpers._build_venv),
        ("sglang ServerArgs resolution packages", sglang_resolve._build),
        *[(f"vllm {version}", lambda version=version: vllm_helpers._run_script(version)) for version in vllm_versions],
    ]


def main() -> int:
    failed = []
    for name, build in builders():
        start = time.monotonic()
        try:
            path, reason = build()
        except (pytest.skip.Exception, pytest.fail.Exception) as refused:  # a venv it depends on is missing
            path, reason = None, str(refused)
        took = time.monotonic() - start
        if path is None:
            failed.append(name)
            print(f"contract venv {name}: FAILED after {took:.0f} s: {reason}", flush=True)
        else:
            print(f"contract venv {name}: ready in {took:.0f} s ({path.name})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
