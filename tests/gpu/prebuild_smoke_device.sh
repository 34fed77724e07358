#!/usr/bin/env bash
# Runs tests/gpu/prebuild_kernels_smoke.py on a GPU machine that has PyTorch with CUDA, nvcc, ninja and a C++
# compiler but no network: SGLang 0.5.23 and FlashInfer 0.7.2 come as trimmed trees (what the pre-build and the
# engine's loaders read: SGLang's Python files and kernel sources; FlashInfer's Python files, its headers, CCCL,
# spdlog and the three sampling sources), apache-tvm-ffi, ninja and SGLang's import-time dependencies (the lock's
# versions) as wheels, all in one directory, which tests/gpu/make_prebuild_carry.py DIR writes (it needs PyPI):
#   bash tests/gpu/prebuild_smoke_device.sh DIR [OUT]
# They are installed into a directory of their own, beside the machine's Python (which may itself be a venv, whose
# packages a new venv would not see); an interpreter wrapper puts that directory first on its path, and its bin/
# directory (the engine venv's bin on the unit's PATH) holds ninja, as the engine's venv does.
set -euo pipefail
carry=${1:?usage: prebuild_smoke_device.sh DIR [OUT]}
out=${2:-tests/gpu/results}
base=$(command -v python3)
work=$(mktemp -d)
mkdir -p "$work/site" "$work/bin"
"$base" -m pip install -q --no-deps --no-index --target "$work/site" "$carry"/*.whl
# The machine's own copy of a dependency wins (torch's, say): a carried one is kept only where the machine has none.
for entry in "$work/site"/*; do
  name=$(basename "$entry" .py)
  case $name in *.dist-info|bin|__pycache__) continue ;; esac
  if "$base" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$name') is None)" 2>/dev/null; then
    rm -rf "$entry"
  fi
done
tar xzf "$carry/sglang_trim.tgz" -C "$work/site"
tar xzf "$carry/flashinfer_trim.tgz" -C "$work/site"
printf '#!/bin/sh\nPYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH} exec %s "$@"\n' "$work/site" "$base" > "$work/bin/python"
chmod +x "$work/bin/python"
if [ -x "$work/site/bin/ninja" ]; then ln -s "$work/site/bin/ninja" "$work/bin/ninja"; else ln -s "$(command -v ninja)" "$work/bin/ninja"; fi
"$work/bin/python" -c 'import flashinfer.jit.sampling, sglang.kernels.ops.speculative.sampling' \
  || { echo "the carried trees do not import: see above" >&2; exit 1; }
exec "$base" "$(dirname "$0")/prebuild_kernels_smoke.py" --python "$work/bin/python" --out "$out"
