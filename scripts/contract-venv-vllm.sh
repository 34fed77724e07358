#!/usr/bin/env bash
# Build, once, a CPU-only venv in which vLLM VERSION's `vllm serve` parser and the patched model modules
# import. Used by the contract tests; never by a deploy.
#
#   scripts/contract-venv-vllm.sh VERSION               build (or reuse) the venv; prints its path last
#   scripts/contract-venv-vllm.sh --sdist-only VERSION  only fetch vllm-VERSION.tar.gz; prints its path last
#
# Layout (all under $CACHE_DIR, never inside the clone):
#   downloads/vllm-VERSION.tar.gz         the sdist, fetched once
#   contract/torch-TORCH-pyX.Y/           base venv: CPU torch + vLLM's build tools (shared by every version)
#   contract/vllm-VERSION/                the version's venv; a .pth file puts the base's site-packages on its path
#
# Environment: BWS_TORCH_CPU_INDEX, an extra index that serves the '+cpu' torch wheel where pip's configuration
# does not (PyTorch's own: https://download.pytorch.org/whl/cpu).
#
# vLLM pins a CUDA torch. No resolver ever sees vLLM's requirements here: the sdist is built with
# VLLM_TARGET_DEVICE=empty, --no-build-isolation and installed with --no-deps; the few packages its parser
# imports are installed by name, with the version ranges the sdist's requirements/common.txt gives them.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TORCH_VERSION=2.13.0
# Bump when the recipe below changes: cached venvs with another recipe id are rebuilt.
RECIPE=3
# Packages the `vllm serve` parser and the EAGLE-3 model modules import (research: engine-packages §2.3;
# loguru for compressed-tensors, model-hosting-container-standards for 0.17's serve CLI).
PARSER_DEPS=(huggingface-hub regex pydantic numpy cbor2 psutil pyzmq urllib3 transformers aiohttp requests
  openai-harmony openai msgspec cloudpickle pillow pybase64 cachetools uvloop py-cpuinfo fastapi
  prometheus-client partial-json-parser llguidance uvicorn watchfiles orjson einops apache-tvm-ffi
  blake3 gguf tokenizers sentencepiece tiktoken protobuf pyyaml six setproctitle diskcache lark
  mistral_common loguru model-hosting-container-standards)
# Installed without their requirements: xgrammar requires triton (a 1 GB wheel) on Linux, which the parser
# does not need; compressed-tensors requires torch, which comes from the base venv.
NO_DEPS=(xgrammar compressed-tensors)

usage() { echo "usage: $0 [--sdist-only] VERSION   (e.g. 0.33.0)" >&2; exit 2; }
sdist_only=false
case "${1:-}" in
  --sdist-only) sdist_only=true; shift ;;
  -h|--help) usage ;;
esac
[ $# -eq 1 ] || usage
VERSION=$1
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?$ ]] || die "not a vLLM release version: '$VERSION'"

# (after the usage check: --help needs no interpreter)
CONTRACT_PYTHON=$(contract_python 3.11)
PYTHON_ID=$(python_identity "$CONTRACT_PYTHON")
PYVER=$("$CONTRACT_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
DOWNLOADS=$CACHE_DIR/downloads
CONTRACT=$CACHE_DIR/contract
BASE=$CONTRACT/torch-$TORCH_VERSION-py$PYVER
VENV=$CONTRACT/vllm-$VERSION
SDIST=$DOWNLOADS/vllm-$VERSION.tar.gz
mkdir -p "$DOWNLOADS" "$CONTRACT"

log() { printf '[contract-venv-vllm %s %4ss] %s\n' "$VERSION" "$SECONDS" "$*" >&2; }
# pip compiles byte-code at install on purpose: the tests import torch and vLLM in many short processes, and where
# PYTHONDONTWRITEBYTECODE is set (as on the machines this was timed on) nothing compiled at import time is kept: a cold run with
# --no-compile spent 170 s more in the contract stage than it saved in the build.
quiet_pip() { "$1"/bin/python -m pip --disable-pip-version-check -q "${@:2}" >&2; }

# Parallel builders wait instead of corrupting a half-built venv: one lock for the shared base venv and the
# downloads, one per version's venv, so that two versions build side by side once the base exists.
exec 9>"$CONTRACT/.lock"
exec 8>"$CONTRACT/.lock-vllm-$VERSION"

stamp_ok() { [ -f "$1/.bws-contract-ok" ] && [ "$(cat "$1/.bws-contract-ok")" = "$2" ]; }

ensure_base() {
  local want="base-recipe=2 torch=$TORCH_VERSION python=$PYTHON_ID"
  stamp_ok "$BASE" "$want" && return 0
  log "building base venv $BASE (CPU torch $TORCH_VERSION + build tools)"
  rm -rf "$BASE"
  "$CONTRACT_PYTHON" -m venv "$BASE"
  # The +cpu local label: where no CPU wheel is offered pip fails, instead of fetching the CUDA build.
  # 'setuptools<81' is vLLM's own build requirement.
  local index=()
  [ -z "${BWS_TORCH_CPU_INDEX:-}" ] || index=(--extra-index-url "$BWS_TORCH_CPU_INDEX")
  quiet_pip "$BASE" install "${index[@]}" "torch==$TORCH_VERSION+cpu" 'setuptools<81' setuptools-scm setuptools-rust \
    wheel packaging ninja jinja2 cmake \
    || die "could not install torch $TORCH_VERSION+cpu (pip's message above); ${BWS_TORCH_CPU_INDEX:+BWS_TORCH_CPU_INDEX=$BWS_TORCH_CPU_INDEX was used. }a '+cpu' torch wheel is not on PyPI: set BWS_TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu (PyTorch's CPU wheel index) and run again"
  "$BASE"/bin/python -c 'import torch, sys; sys.exit(torch.version.cuda is not None)' \
    || die "a CUDA torch was installed into $BASE; expected the CPU wheel"
  echo "$want" >"$BASE/.bws-contract-ok"
  log "base venv ready"
}

ensure_sdist() {
  # Downloads land in a temp dir and are renamed into place: a file that exists is complete.
  [ -s "$SDIST" ] && return 0
  ensure_base
  log "downloading the vllm==$VERSION sdist"
  local tmp
  tmp=$(mktemp -d "$DOWNLOADS/.vllm-$VERSION.XXXXXX")
  # Metadata generation runs vLLM's setup.py: no build isolation (it would bring a CUDA torch), no GPU target,
  # and the version override, or pip discards the sdist for reporting '0.33.0+empty'.
  if ! VLLM_TARGET_DEVICE=empty VLLM_VERSION_OVERRIDE=$VERSION PATH=$BASE/bin:$PATH \
      "$BASE"/bin/python -m pip --disable-pip-version-check -q download --no-deps --no-binary :all: \
      --no-build-isolation "vllm==$VERSION" -d "$tmp" >&2; then
    rm -rf "$tmp"
    die "could not download the vllm==$VERSION sdist (vLLM 0.15.x was published as wheels only)"
  fi
  mv "$tmp/vllm-$VERSION.tar.gz" "$SDIST"
  rm -rf "$tmp"
  log "sdist saved: $SDIST"
}

# The parser deps, each with the version range of the sdist's requirements/common.txt when it names it.
pinned_parser_deps() {
  "$BASE"/bin/python - "$SDIST" "$VERSION" "$@" <<'PY'
import re, sys, tarfile
sdist, version, wanted = sys.argv[1], sys.argv[2], sys.argv[3:]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
specs = {}
with tarfile.open(sdist) as tar:
    try:
        text = tar.extractfile(f"vllm-{version}/requirements/common.txt").read().decode()
    except KeyError:
        text = ""
for line in text.splitlines():
    line = line.split(" #", 1)[0].strip()
    m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*([^;]*)(;.*)?$", line)
    if m and not line.startswith(("-", "#")):
        specs[norm(m.group(1))] = (m.group(3).strip(), m.group(4) or "")
for name in wanted:
    spec, marker = specs.get(norm(name), ("", ""))
    print(f"{name}{spec}{marker}")
PY
}

ensure_venv() {
  local want="recipe=$RECIPE torch=$TORCH_VERSION vllm=$VERSION sdist=$(stat -c %s "$SDIST") python=$PYTHON_ID"
  stamp_ok "$VENV" "$want" && return 0
  log "building $VENV"
  rm -rf "$VENV"
  "$CONTRACT_PYTHON" -m venv "$VENV"
  # The venv's bundled setuptools would shadow the base's (vLLM's pyproject needs a newer one).
  quiet_pip "$VENV" uninstall -y setuptools
  local site base_site
  site=$("$VENV"/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  base_site=$("$BASE"/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base_site" >"$site/_bws_contract_base.pth"
  local deps
  mapfile -t deps < <(pinned_parser_deps "${PARSER_DEPS[@]}")
  quiet_pip "$VENV" install "${deps[@]}"
  mapfile -t deps < <(pinned_parser_deps "${NO_DEPS[@]}")
  quiet_pip "$VENV" install --no-deps "${deps[@]}"
  VLLM_TARGET_DEVICE=empty VLLM_VERSION_OVERRIDE=$VERSION PATH=$BASE/bin:$PATH \
    quiet_pip "$VENV" install --no-deps --no-build-isolation "$SDIST"
  "$VENV"/bin/python -c 'import torch, sys; sys.exit(torch.version.cuda is not None)' \
    || die "$VENV sees a CUDA torch; expected the CPU wheel"
  "$VENV"/bin/python -c 'import importlib.metadata as m, sys; sys.exit(m.version("vllm") != sys.argv[1])' \
    "$VERSION" || die "$VENV: installed vllm is not $VERSION"
  echo "$want" >"$VENV/.bws-contract-ok"
  log "venv ready"
}

flock 8
flock 9
ensure_sdist
if $sdist_only; then
  echo "$SDIST"
  exit 0
fi
ensure_base
flock -u 9
ensure_venv
echo "$VENV"
