#!/usr/bin/env python3
"""Build the JIT kernel modules an SGLang profile reaches, ahead of the switch, through the engines' own entry points.

Installed by roles/engine_service (engine_service_prebuild) and run by the deploy before the switch, as the service
user, with the SGLang unit's environment, in a transient unit of its own, with the engine venv's python (standard
library + what that venv has). It never touches a GPU (CUDA_VISIBLE_DEVICES is emptied before torch is imported):
the target architecture is given (--arch, as FLASHINFER_CUDA_ARCH_LIST says it in the unit) and each engine is told
to build for it.

Modules (--module, repeatable; roles/sglang/vars/main.yml says which profile reaches which and how):

* ``flashinfer-sampling``: FlashInfer's JIT module ``sampling`` (flashinfer.jit.sampling.gen_sampling_module), the
  one flashinfer.sampling.get_sampling_module() builds and loads. Written into FlashInfer's workspace,
  $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch>/cached_ops/sampling (flashinfer/jit/env.py).
* ``sglang-speculative-sampling``: SGLang's JIT module ``speculative_sampling``, the load_jit build behind
  tree_speculative_sampling_target_only (sglang/kernels/ops/speculative/sampling.py, _jit_sampling_module), with the
  vector size EAGLE verify uses for the target model's vocabulary (gcd(4, vocab_size), deterministic). Written into
  SGLang's content-keyed cache, $SGLANG_JIT_CACHE_DIR/sm<arch>/speculative_sampling/build-<key>
  (sglang/kernels/jit/utils/compile/cache.py), published there by staging and rename.

FlashInfer's workspace is keyed by the toolchain here: a stamp (toolchain.json in $FLASHINFER_WORKSPACE_BASE)
records the architecture, nvcc's and the C++ compiler's versions and this interpreter; when it differs the
workspace is emptied first (FlashInfer's ninja would not see a new compiler). SGLang's cache keys on them itself.

Prints one JSON object: {"arch", "reset", "modules": [{"name", "status", "seconds", "path"}]}, status "built" or
"cached" (with --dry-run, which builds nothing: "would build" or "cached"); --report FILE writes it there too.
--resolve prints the directories each module is written into, building nothing. Exit 0 when every module is
there; 1 when a build failed; 2 when the environment does not name the directories or the architecture the
engine would use (the unit's environment and this build must agree, or the engine compiles again).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

MODULES = ("flashinfer-sampling", "sglang-speculative-sampling")
STAMP = "toolchain.json"


class RefusedError(Exception):
    """The environment does not say what the engine will use: nothing is built."""


def _parse_arch(arch: str) -> tuple[int, int, str]:
    match = re.fullmatch(r"(\d+)\.(\d+)([a-z]?)", arch)
    if match is None:
        raise RefusedError(f"--arch {arch!r} is not a CUDA architecture such as 12.0f")
    return int(match.group(1)), int(match.group(2)), match.group(3)


def _version_text(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        return f"unavailable: {error}"


def toolchain(arch: str) -> dict[str, str]:
    """What a build depends on besides the sources: the key of FlashInfer's workspace."""
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    return {
        "arch": arch,
        "nvcc": _version_text([os.path.join(cuda_home, "bin", "nvcc"), "--version"]),
        "cxx": _version_text([os.environ.get("CXX", "c++"), "--version"]),
        "python": sys.executable,
    }


def _required_env(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        raise RefusedError(f"{name} is not set: the unit's environment names it, or the engine looks elsewhere")
    return value


def check_environment(arch: str) -> None:
    """The unit's environment names what this build writes for (FlashInfer reads it at import)."""
    listed = _required_env("FLASHINFER_CUDA_ARCH_LIST")
    if listed.split() != [arch]:
        raise RefusedError(f"FLASHINFER_CUDA_ARCH_LIST is {listed!r}, not {arch!r}: FlashInfer would build and look "
                           "for another architecture's workspace than this pre-build fills")
    _required_env("FLASHINFER_WORKSPACE_BASE")
    _required_env("SGLANG_JIT_CACHE_DIR")


def reset_workspace(arch: str, *, dry_run: bool) -> str | None:
    """Empty FlashInfer's workspace when the toolchain it was built with differs; the reason, or None."""
    base = pathlib.Path(_required_env("FLASHINFER_WORKSPACE_BASE"))
    stamp = base / STAMP
    wanted = toolchain(arch)
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        recorded = None
    if recorded == wanted:
        return None
    workspace = base / ".cache"
    if recorded is None:
        reason = None if not workspace.exists() else "the workspace had no toolchain stamp: emptied"
    else:
        changed = sorted(key for key in wanted if recorded.get(key) != wanted[key])
        reason = f"the toolchain changed ({', '.join(changed)}): FlashInfer's workspace emptied"
    if dry_run:
        return reason and reason.replace("emptied", "would be emptied")
    if workspace.exists():
        shutil.rmtree(workspace)
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=base, prefix=f".{STAMP}.", delete=False) as handle:
        json.dump(wanted, handle, indent=1, sort_keys=True)
    os.replace(handle.name, stamp)
    return reason


def vocab_size(model_dir: str | None) -> int | None:
    """The target model's vocabulary, as EAGLE verify's target_probs has it (config.json)."""
    if not model_dir:
        return None
    config = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    for holder in (config, config.get("text_config") or {}):
        if isinstance(holder.get("vocab_size"), int):
            return int(holder["vocab_size"])
    return None


# FlashInfer --------------------------------------------------------------------------------------------------------

def flashinfer_sampling(*, dry_run: bool, resolve: bool) -> dict[str, Any]:
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.sampling import gen_sampling_module

    spec = gen_sampling_module()
    library = pathlib.Path(spec.jit_library_path)
    result: dict[str, Any] = {"path": str(library.parent), "workspace": str(jit_env.FLASHINFER_WORKSPACE_DIR)}
    if resolve:
        return result
    before = library.stat().st_mtime_ns if library.exists() else None
    if dry_run:
        return result | {"status": "cached" if spec.is_compiled else "would build"}
    # What get_sampling_module() does on first use, minus the GPU: write build.ninja, run ninja (nothing to do when
    # the workspace is current), load the library.
    spec.build(need_lock=True)
    spec.load()
    after = library.stat().st_mtime_ns if library.exists() else None
    return result | {"status": "cached" if before is not None and before == after else "built"}


# SGLang ------------------------------------------------------------------------------------------------------------

def sglang_speculative_sampling(*, arch: str, vocab: int | None, dry_run: bool, resolve: bool) -> dict[str, Any]:
    major, minor, _suffix = _parse_arch(arch)
    if dry_run:
        # load_jit refuses to compile under this flag and loads a cached build: a miss says "would build".
        os.environ["SGLANG_CRASH_ON_JIT_COMPILE"] = "1"
    from sglang.kernels.jit.utils import arch as sglang_arch
    from sglang.kernels.jit.utils.compile import cache, loader
    from sglang.kernels.ops.speculative import sampling

    with sglang_arch.override_jit_cuda_arch(major, minor):
        # SGLang reads the architecture from the GPU (none here): the suffix it derives from this nvcc must be the
        # one FlashInfer is told (12.0f with CUDA >= 12.9; a 12.0a build lands where the engine never looks).
        resolved = sglang_arch.get_jit_cuda_arch().target_name
        if resolved != arch:
            cuda_home = os.environ.get("CUDA_HOME", "")
            raise RefusedError(f"SGLang resolves compute capability {major}.{minor} to {resolved} with this "
                               f"toolchain (CUDA_HOME={cuda_home}), not {arch}: the unit's architecture is wrong "
                               "for its nvcc")
        target_dir = cache.cache_root() / cache._target_tag() / "speculative_sampling"
        result: dict[str, Any] = {"path": str(target_dir)}
        if resolve:
            return result
        vec_size = math.gcd(4, vocab) if vocab else 4
        hits: list[bool] = []
        find_prebuilt: Callable[..., Any] = loader._find_prebuilt

        def recording(**kwargs: Any) -> Any:
            found = find_prebuilt(**kwargs)
            hits.append(found is not None)
            return found

        loader._find_prebuilt = recording  # the first lookup says whether the cache had it
        try:
            # The same call tree_speculative_sampling_target_only makes (deterministic, as eagle_sample asks).
            sampling._jit_sampling_module(vec_size, True)
        except RuntimeError as error:
            if dry_run and "SGLANG_CRASH_ON_JIT_COMPILE" in str(error):
                return result | {"status": "would build", "vec_size": vec_size}
            raise
        finally:
            loader._find_prebuilt = find_prebuilt
    status = "cached" if hits[:1] == [True] else "built"
    return result | {"status": status, "vec_size": vec_size}


def run(args: argparse.Namespace) -> dict[str, Any]:
    _parse_arch(args.arch)
    check_environment(args.arch)
    # Built for the given architecture, never on a GPU: the GPUs may be serving the release before this one.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    report: dict[str, Any] = {"arch": args.arch, "reset": None, "modules": []}
    if not args.resolve and "flashinfer-sampling" in args.module:
        report["reset"] = reset_workspace(args.arch, dry_run=args.dry_run)
    vocab = vocab_size(args.model)
    for name in args.module:
        began = time.monotonic()
        if name == "flashinfer-sampling":
            entry = flashinfer_sampling(dry_run=args.dry_run, resolve=args.resolve)
            if args.dry_run and report["reset"]:
                entry["status"] = "would build"  # the workspace would be emptied first
        else:
            entry = sglang_speculative_sampling(arch=args.arch, vocab=vocab, dry_run=args.dry_run,
                                                resolve=args.resolve)
        report["modules"].append({"name": name, **entry, "seconds": round(time.monotonic() - began, 2)})
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", required=True, help="the target as FLASHINFER_CUDA_ARCH_LIST names it (12.0f)")
    parser.add_argument("--module", action="append", choices=MODULES, default=[], help="a module to build")
    parser.add_argument("--model", help="the target model's directory (config.json: the vocabulary size)")
    parser.add_argument("--report", help="write the JSON report here too")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="build nothing; say what would be built")
    mode.add_argument("--resolve", action="store_true", help="build nothing; print the directories written")
    args = parser.parse_args(argv)
    try:
        report = run(args)
    except RefusedError as refused:
        print(f"prebuild_kernels: {refused}", file=sys.stderr)
        return 2
    text = json.dumps(report, sort_keys=True)
    if args.report:
        with contextlib.suppress(OSError):
            pathlib.Path(args.report).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
