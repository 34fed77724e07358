#!/usr/bin/env python3
"""Build the directory tests/gpu/prebuild_smoke_device.sh carries to a GPU machine that has no network.

It holds, within the device machine's 64 MiB carry limit:

* ``sglang_trim.tgz``: SGLang 0.5.23's Python files and its kernel sources (everything under ``sglang/kernels``:
  what ``load_jit`` compiles) and its dist-info;
* ``flashinfer_trim.tgz``: FlashInfer 0.7.2's Python files and the headers its ``sampling`` module and SGLang's
  ``flashinfer`` include dependency need (``data/include``, ``data/cccl``, ``data/spdlog``, CUTLASS's ``include``
  and ``tools/util/include``: SGLang's ``kernels/jit/utils/deps.py`` refuses to build without them) and the three
  sampling sources of ``data/csrc`` with the headers beside them;
* the wheels SGLang and FlashInfer import at module level that a GPU machine with PyTorch may lack, at the lock's
  versions, for CPython 3.12 on x86_64 Linux (the device's interpreter); the device script drops each one the
  machine already has.

    python3 tests/gpu/make_prebuild_carry.py DIR      # then: run with carry [DIR], bash ...device.sh DIR $OUT

Needs PyPI (pip download). DIR is created; existing files in it are replaced.
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

SGLANG = "sglang==0.5.23"
FLASHINFER = "flashinfer-python==0.7.2"
# What `import sglang`, flashinfer.sampling and sglang.kernels.ops.speculative.sampling load besides torch, numpy
# and triton (which come with the machine's PyTorch), with their own import-time dependencies: the lock's versions.
DEPENDENCIES = [
    "aiohappyeyeballs==2.7.1", "aiohttp==3.14.5", "aiosignal==1.4.0", "annotated-types==0.8.0", "anyio==4.16.0",
    "apache-tvm-ffi==0.1.11", "attrs==26.1.0", "certifi==2026.10.19.post1", "charset-normalizer==3.5.3",
    "decorator==5.3.1", "dill==0.4.1", "fastapi==0.165.0", "frozenlist==1.8.0", "idna==3.20", "ipython==9.18.1",
    "ipython-pygments-lexers==1.1.1", "msgspec==0.22.0", "multidict==7.2.1", "ninja==1.13.2",
    "nvidia-ml-py==13.615.71", "orjson==3.13.0", "packaging==26.4", "pillow==13.0.0", "propcache==0.5.4",
    "psutil==7.2.2", "pybase64==1.5.1", "pydantic==2.14.4", "pydantic-core==2.50.5", "pygments==2.21.0",
    "python-multipart==0.0.34", "pyzmq==27.3.0", "requests==2.34.2", "setproctitle==1.3.8", "sniffio==1.3.1",
    "starlette==1.10.0", "tqdm==4.70.1", "traitlets==5.16.1", "typing-inspection==0.4.5", "urllib3==2.8.0",
    "yarl==1.25.1",
]
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:", "--platform",
            "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64"]
SGLANG_KEEP = ["*.py", "sglang/kernels/*", "sglang-*.dist-info/*"]
FLASHINFER_KEEP = ["*.py", "flashinfer/data/include/*", "flashinfer/data/cccl/*", "flashinfer/data/spdlog/*",
                   "flashinfer/data/cutlass/include/*", "flashinfer/data/cutlass/tools/util/include/*",
                   "flashinfer/data/csrc/*.h", "flashinfer/data/csrc/sampling.cu", "flashinfer/data/csrc/renorm.cu",
                   "flashinfer/data/csrc/flashinfer_sampling_binding.cu", "flashinfer_python-*.dist-info/*"]
FLASHINFER_DROP = ["flashinfer/data/cutlass/*"]  # CUTLASS's Python, tests and examples: not headers
LIMIT = 64 * 1024 * 1024


def download(requirements: list[str], dest: Path, platform: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *platform, "--dest", str(dest),
                    *requirements], check=True)


def kept(name: str, keep: list[str], drop: list[str]) -> bool:
    """A wheel member to carry: matched by keep, unless it is a Python file that drop matches."""
    if not any(fnmatch.fnmatch(name, pattern) for pattern in keep):
        return False
    return not (name.endswith(".py") and any(fnmatch.fnmatch(name, pattern) for pattern in drop))


def trim(wheel: Path, keep: list[str], drop: list[str], out: Path) -> int:
    """Write the kept members of a wheel to a gzip tarball; the number of files kept."""
    count = 0
    with zipfile.ZipFile(wheel) as archive, tarfile.open(out, "w:gz") as tarball:
        for member in archive.infolist():
            if member.is_dir() or not kept(member.filename, keep, drop):
                continue
            data = archive.read(member)
            info = tarfile.TarInfo(member.filename)
            info.size, info.mode = len(data), 0o644
            tarball.addfile(info, io.BytesIO(data))
            count += 1
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        engines = Path(tmp)
        # Only their Python files and sources are carried, the same in every wheel of a version: this interpreter's.
        download([SGLANG, FLASHINFER], engines, [])
        sglang = next(engines.glob("sglang-*.whl"))
        flashinfer = next(engines.glob("flashinfer_python-*.whl"))
        print("sglang_trim.tgz:", trim(sglang, SGLANG_KEEP, [], args.dir / "sglang_trim.tgz"), "files")
        print("flashinfer_trim.tgz:", trim(flashinfer, FLASHINFER_KEEP, FLASHINFER_DROP,
                                           args.dir / "flashinfer_trim.tgz"), "files")
    download(DEPENDENCIES, args.dir, PLATFORM)
    total = sum(path.stat().st_size for path in args.dir.iterdir() if path.is_file())
    print(f"{args.dir}: {total / 2**20:.1f} MiB (the carry limit is 64 MiB with the working tree)")
    return 0 if total < LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
