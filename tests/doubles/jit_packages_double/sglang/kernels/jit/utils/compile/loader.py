"""SGLANG TEST DOUBLE: load_jit - a cached build, or one built in a staging directory and published by rename."""

from __future__ import annotations

import os
import pathlib
import shutil
import uuid

import jit_double_common

from sglang.kernels.jit.utils.compile import cache


def _find_prebuilt(*, spec: str, scope: pathlib.Path) -> pathlib.Path | None:
    return cache.find_prebuilt(scope=scope, module_name=spec)


def load_jit(*args: str) -> pathlib.Path:
    module_name = "_".join(str(arg) for arg in args[:1])
    module_args = tuple(str(arg) for arg in args)
    scope = cache.build_key_dir(module_name=module_name, build_key=cache.compute_build_key(module_args))
    prebuilt = _find_prebuilt(spec=module_name, scope=scope)
    if prebuilt is not None:
        return prebuilt
    if os.environ.get("SGLANG_CRASH_ON_JIT_COMPILE", "") in ("1", "true", "True"):
        raise RuntimeError(f"JIT module '{module_name}' has no usable cached build under {scope}, and "
                           "SGLANG_CRASH_ON_JIT_COMPILE forbids compiling at runtime.")
    scope.mkdir(parents=True, exist_ok=True)
    staging = scope / f".staging-{uuid.uuid4().hex}"
    try:
        jit_double_common.build(str(staging / f"{module_name}.so"))
        leaf = scope / f"deps-{uuid.uuid4().hex[:16]}"
        os.rename(staging, leaf)  # the leaf appears complete or not at all
        return leaf / f"{module_name}.so"
    finally:
        shutil.rmtree(staging, ignore_errors=True)
