"""TEST STUB of `triton` for the CPU-only contract venvs. It is not Triton and runs no kernel.

SGLang imports triton at module level (sglang/srt/utils/common.py) although nothing the contract tests
call (argument parsing, protocol models, metric names) ever launches a kernel. The real wheel is 1 GB of
CUDA tools, so the contract venv gets this stub through a .pth file instead
(scripts/contract-venv-sglang.sh). Decorators return the function unchanged; any other attribute, and
`triton.language`, is a MagicMock, so module-level kernel definitions import and would fail loudly if run.
"""

import sys
from unittest.mock import MagicMock

__version__ = "0.0.0+contract.stub"
IS_CONTRACT_STUB = True


def jit(fn=None, **_kwargs):
    return fn if fn is not None else (lambda f: f)


def autotune(*_args, **_kwargs):
    return lambda f: f


def heuristics(*_args, **_kwargs):
    return lambda f: f


class Config:
    def __init__(self, *_args, **_kwargs) -> None:
        pass


language = MagicMock(name="triton.language (contract stub)")
sys.modules[__name__ + ".language"] = language


def __getattr__(name: str) -> MagicMock:
    return MagicMock(name=f"triton.{name} (contract stub)")
