"""TEST STUB of `torchvision` for the CPU contract test of SGLang's resolution. It is not torchvision.

SGLang 0.5.23 imports torchvision at module level from its multimodal configs (srt/multimodal/internvl_utils.py,
reached through srt/configs/__init__.py), and transformers reads its version; resolving a text model's server
arguments never transforms an image. There is no CPU torchvision wheel for the contract venv's torch, and the
CUDA wheel cannot load its operators there. Any attribute is a MagicMock, so a real use fails loudly.
"""

from unittest.mock import MagicMock

__version__ = "0.29.1"
IS_CONTRACT_STUB = True


def __getattr__(name: str) -> MagicMock:
    return MagicMock(name=f"torchvision.{name} (contract stub)")
