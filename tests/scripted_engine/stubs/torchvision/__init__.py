"""TEST STUB of `torchvision` for the scripted SGLang test engine (tests/scripted_engine). It is not torchvision.

SGLang 0.5.23's HTTP server imports torchvision at module level through its multimodal configs
(srt/configs/__init__.py -> srt/multimodal/internvl_utils.py and others), and transformers reads its version.
There is no CPU torchvision wheel for the CPU torch 2.13.0+cpu of the contract venv, and `pip install
torchvision` would replace that torch with a CUDA build. The scripted engine serves a text model and never
transforms an image. Any attribute is a MagicMock (capitalised names are classes), any `torchvision.<sub>`
module is made on import, so a real use fails loudly. Same idea as tests/contract/stubs/resolve/torchvision.
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

__version__ = "0.29.1"
IS_CONTRACT_STUB = True


def _attr(module_name, name):
    if name.startswith("__"):
        raise AttributeError(name)
    if name[:1].isupper():
        return _StubMeta(name, (), {"__module__": module_name})
    return MagicMock(name=f"{module_name}.{name} (test stub)")


def __getattr__(name: str):
    return _attr(__name__, name)


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        value = _attr(self.__name__, name)
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
