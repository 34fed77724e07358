"""TEST STUB of `triton` for the scripted SGLang test engine (tests/scripted_engine). It is not Triton.

The contract venv's stub (tests/contract/stubs/triton) covers `import triton` and `triton.language`, enough for
SGLang's parser. The HTTP server imports more: transformers' continuous-batching cache and SGLang's configs import
torch._inductor, and torch (torch/utils/_triton.py has_triton_package) then believes Triton is installed and
imports `triton.backends.compiler`, `triton.compiler.compiler`, `triton.runtime...` at module level. The real
wheel is 1 GB of CUDA tools and nothing in the scripted engine launches a kernel (the GPU scheduler is replaced).
So every `triton.<anything>` submodule is made on import: decorators return the function unchanged, any other
attribute is a MagicMock, so a real kernel launch fails loudly. This stub shadows the contract one (the
test-engine .pth lists tests/scripted_engine/stubs first).
"""

import importlib.abc
import importlib.machinery
import sys
import types
from unittest.mock import MagicMock


class _StubMeta(type):
    """Stub classes: class attributes (enum members, constants) are MagicMocks too."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return MagicMock(name=f"{cls.__module__}.{cls.__name__}.{name} (test stub)")

__version__ = "0.0.0+scripted.stub"
IS_CONTRACT_STUB = True
IS_SCRIPTED_ENGINE_STUB = True


def jit(fn=None, **_kwargs):
    return fn if fn is not None else (lambda f: f)


def autotune(*_args, **_kwargs):
    return lambda f: f


def heuristics(*_args, **_kwargs):
    return lambda f: f


class Config:
    def __init__(self, *_args, **_kwargs) -> None:
        pass


def __getattr__(name: str) -> MagicMock:
    if name.startswith("__"):
        raise AttributeError(name)
    return MagicMock(name=f"triton.{name} (test stub)")


class _NoActiveDriver:
    """triton.runtime.driver on a machine without a GPU: real Triton raises when asked for the active driver
    ("0 active drivers"); SGLang's probes (kernels/ops/attention/fla/utils.py get_available_device) then fall
    back to "cpu"."""

    @property
    def active(self):
        raise RuntimeError("0 active drivers ([]). There should only be one. (triton test stub: no GPU)")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return MagicMock(name=f"triton.runtime.driver.{name} (test stub)")


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "driver" and self.__name__ == "triton.runtime":
            value = _NoActiveDriver()
            setattr(self, name, value)
            return value
        if name in ("jit",):
            return jit
        if name in ("autotune", "heuristics"):
            return autotune
        # capitalised names become classes, so isinstance/issubclass checks keep working
        value = (_StubMeta(name, (), {"__module__": self.__name__}) if name[:1].isupper()
                 else MagicMock(name=f"{self.__name__}.{name} (test stub)"))
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StubFinder())
