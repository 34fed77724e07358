#!/usr/bin/env bash
# Build, once, the CPU-only venv in which SGLang VERSION's real argument parser, protocol models and metric
# definitions import. Used by the contract tests (tests/contract/test_sglang_*.py, test_double_protocol.py);
# never by a deploy.
#
#   scripts/contract-venv-sglang.sh [VERSION]    VERSION defaults to the pinned lock; prints the venv path last
#
# The recipe is the `contract:` section of roles/sglang/locks/sglang-VERSION.yml: a python3.11 venv, the CPU
# torch wheel (a '+cpu' pin, so pip fails rather than fetching a CUDA build), the small packages sglang's
# parser imports (pinned to the versions of the lock's GPU requirement set), sglang itself with --no-deps,
# and the test stubs it names (copied from tests/contract/stubs/, put on the path by a .pth file).
# The venv lives in $CACHE_DIR/contract/sglang-VERSION and is rebuilt only when the recipe changes.
#
# Environment: BWS_CONTRACT_PYTHON (default: the distribution's python3.11 where it can make venvs, see
# contract_python in lib.sh), BWS_TORCH_CPU_INDEX (an extra index that serves the '+cpu' torch wheel, for machines
# whose pip configuration does not provide it; PyTorch's own is https://download.pytorch.org/whl/cpu).
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { echo "usage: $0 [VERSION]   (default: the sglang lock with 'pinned: true')" >&2; exit 2; }
case "${1:-}" in -h|--help) usage ;; esac
[ $# -le 1 ] || usage

LOCKS="python3 $REPO_ROOT/tests/engine_locks.py"
VERSION=${1:-$($LOCKS pinned sglang)} || die "no pinned sglang lock"
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?$ ]] || die "not an SGLang release version: '$VERSION'"
LOCK_FILE=$($LOCKS path sglang "$VERSION") || die "no usable lock file for sglang $VERSION"

log() { printf '[contract-venv-sglang %s] %s\n' "$VERSION" "$*" >&2; }
lock_get() { $LOCKS get sglang "$VERSION" "$1"; }

CONTRACT_PYTHON=$(contract_python "$(lock_get contract.python)")
CONTRACT=$CACHE_DIR/contract
VENV=$CONTRACT/sglang-$VERSION
STUBS=$REPO_ROOT/tests/contract/stubs
mkdir -p "$CONTRACT"

# The recipe id: the lock's contract section and the stub sources. Any change rebuilds the venv.
recipe_id() {
  {
    python_identity "$CONTRACT_PYTHON"
    lock_get contract
    lock_get requirements
    find "$STUBS" -name '*.py' -type f -print0 | sort -z | xargs -0 cat
  } | sha256sum | cut -c1-16
}
RECIPE=$(recipe_id)
STAMP=$VENV/.bws-contract-ok

# One builder at a time per cache: parallel test runs wait instead of corrupting a half-built venv.
exec 9>"$CONTRACT/.lock-sglang-$VERSION"
flock 9

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "recipe=$RECIPE" ] && [ -x "$VENV/bin/python" ]; then
  log "cached (recipe $RECIPE)"
  echo "$VENV"
  exit 0
fi

# Each contract package at the version the GPU lock pins, when the lock has it; `name==x` entries as they are.
pinned_packages() {
  python3 - "$LOCK_FILE" <<'PY'
import re, sys
import yaml
lock = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
pins = {norm(r.split("==")[0].split("[")[0]): r.split("==", 1)[1] for r in lock["requirements"]}
for package in lock["contract"]["packages"]:
    name = norm(package)
    print(package if "=" in package or name not in pins else f"{package}=={pins[name]}")
PY
}

build() {
  local pip torch packages stub site
  log "building $VENV with $CONTRACT_PYTHON (recipe $RECIPE)"
  rm -rf "$VENV"
  "$CONTRACT_PYTHON" -m venv "$VENV"
  pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
  [ -n "${BWS_TORCH_CPU_INDEX:-}" ] && pip+=(--extra-index-url "$BWS_TORCH_CPU_INDEX")
  torch=$(lock_get contract.torch)
  mapfile -t packages < <(pinned_packages)
  log "pip install $torch ${packages[*]}"
  "${pip[@]}" install "$torch" "${packages[@]}" >&2 \
    || die "could not install $torch and the parser packages (pip's message above); ${BWS_TORCH_CPU_INDEX:+BWS_TORCH_CPU_INDEX=$BWS_TORCH_CPU_INDEX was used. }a '+cpu' torch wheel is not on PyPI: set BWS_TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu (PyTorch's CPU wheel index) and run again"
  "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)' \
    || die "$VENV got a CUDA torch; the contract venv must use the CPU build"
  log "pip install $(lock_get contract.engine_install) $(lock_get contract.engine)"
  # shellcheck disable=SC2046  # engine_install is a list of pip options
  "${pip[@]}" install $(lock_get contract.engine_install) "$(lock_get contract.engine)" >&2
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # Stubs are copied into the venv (a clone elsewhere must not break a cached venv) and put on its path by
  # a .pth file, after site-packages: a real package of the same name would win and is refused below.
  mkdir -p "$VENV/contract-stubs"
  while read -r stub; do
    [ -n "$stub" ] || continue
    [ -f "$STUBS/$stub/__init__.py" ] || die "lock names stub '$stub' but $STUBS/$stub/__init__.py is missing"
    "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$stub') is not None)" \
      || die "$stub is installed for real in $VENV; drop it from contract.stubs"
    cp -r "$STUBS/$stub" "$VENV/contract-stubs/"
  done < <(lock_get contract.stubs)
  echo "$VENV/contract-stubs" >"$site/_bws_contract_stubs.pth"
  "$VENV/bin/python" - "$VERSION" <<'PY' >&2 || die "$VENV cannot import sglang's server_args"
import importlib.metadata, sys
import sglang.srt.server_args  # noqa: F401  the import the contract tests rely on
assert importlib.metadata.version("sglang") == sys.argv[1], importlib.metadata.version("sglang")
PY
  echo "recipe=$RECIPE" >"$STAMP"
}

# A failed or interrupted build leaves no half-built venv behind.
cleanup() { [ -f "$STAMP" ] || rm -rf "$VENV"; }
trap cleanup EXIT
start=$(date +%s)
build
log "built in $(( $(date +%s) - start )) s"
echo "$VENV"
