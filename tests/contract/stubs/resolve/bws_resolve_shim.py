"""TEST STUB set-up for running SGLang's ServerArgs resolution on the CPU contract venv. Import it first.

The contract venv carries a `triton` stub (tests/contract/stubs/triton) because SGLang imports triton at module
level. Resolution imports more of SGLang (model configs, quantization, kernels' Python wrappers), which reach
deeper: `from triton.language.extra import libdevice`, `triton.runtime.jit._JITFunction`, and torch, seeing a
`triton` module, believes Triton is installed and imports `triton.backends`. This shim:

* tells torch that Triton is absent (`torch.utils._triton.has_triton_package`/`has_triton` -> False), which is
  the truth on this machine, so torch's inductor keeps its own CPU fallbacks;
* answers any `triton.<submodule>` (and `torchvision.<submodule>`, beside the torchvision stub package) import
  with a stub module whose attributes are MagicMocks (classes for
  capitalised names, so isinstance checks still work). No kernel is ever launched by resolution; if one were,
  a MagicMock would fail loudly.

Never shipped: the on-host check runs in the engine venv with the real Triton.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from unittest.mock import MagicMock

import torch.utils._triton as _torch_triton

_torch_triton.has_triton_package = lambda: False
_torch_triton.has_triton = lambda: False


class _StubClassMeta(type):
    def __getattr__(cls, name: str) -> MagicMock:
        if name.startswith("__"):
            raise AttributeError(name)
        return MagicMock(name=f"{cls.__name__}.{name} (contract stub)")


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        if name.lstrip("_")[:1].isupper():
            value: object = _StubClassMeta(name, (), {})
        else:
            value = MagicMock(name=f"{self.__name__}.{name} (contract stub)")
        setattr(self, name, value)
        return value


class _SubmoduleStubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.startswith(("triton.", "torchvision.")):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


sys.meta_path.append(_SubmoduleStubs())

import triton  # noqa: E402  the contract venv's stub; its `language` is a MagicMock that must act as a package

triton.language.__path__ = []
triton.language.__spec__ = importlib.machinery.ModuleSpec("triton.language", None, is_package=True)
