"""FLASHINFER TEST DOUBLE: a JIT spec whose build runs the COMPILER TEST DOUBLE into the workspace."""

from __future__ import annotations

import os
from pathlib import Path

import jit_double_common

from flashinfer.jit import env as jit_env


class JitSpec:
    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def build_dir(self) -> Path:
        return jit_env.FLASHINFER_JIT_DIR / self.name

    @property
    def jit_library_path(self) -> Path:
        return self.build_dir / f"{self.name}.so"

    @property
    def is_compiled(self) -> bool:
        return self.jit_library_path.exists()

    def build(self, verbose: bool | None = None, need_lock: bool = False) -> None:
        if os.environ.get("FLASHINFER_DISABLE_JIT"):
            raise RuntimeError(f"JIT compilation is disabled via FLASHINFER_DISABLE_JIT ({self.name})")
        self.build_dir.mkdir(parents=True, exist_ok=True)
        (self.build_dir / "build.ninja").write_text(f"# TEST DOUBLE for {self.name}\n")
        jit_double_common.build(str(self.jit_library_path))

    def load(self) -> object:
        if not self.is_compiled:
            raise FileNotFoundError(self.jit_library_path)
        return self

    def build_and_load(self) -> object:
        if not self.is_compiled:
            self.build(need_lock=True)
        return self.load()


def gen_jit_spec(name: str) -> JitSpec:
    return JitSpec(name)
