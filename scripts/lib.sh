# shellcheck shell=bash
# Shared helpers for the project's scripts: where the toolchain lives (scripts/env.sh), how to find
# Python >= 3.12, and stage timing. Sourced by the scripts, which want strict mode; to put the toolchain
# on PATH in your own shell without changing its options, source scripts/env.sh instead.
set -euo pipefail
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# The stage clock starts with the first script and is inherited by the scripts it runs (sandbox.sh runs
# bootstrap.sh), so the times a run prints never go back.
case ${BWS_STAGE_T0:-} in
  '' | *[!0-9]*) BWS_STAGE_T0=$(date +%s) ;;
esac
export BWS_STAGE_T0
stage() { printf '\n### [%4ss] %s\n' "$(( $(date +%s) - BWS_STAGE_T0 ))" "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Print the path of a Python >= 3.12 interpreter (ansible-core 2.21 refuses older controllers) that can
# create a venv: BWS_PYTHON, python3.x / python3 on PATH, then Pythons managed by pyenv or uv.
find_python() {
  local candidate
  for candidate in "${BWS_PYTHON:-}" python3.14 python3.13 python3.12 python3 $(_managed_pythons); do
    [ -n "$candidate" ] || continue
    # ensurepip: Debian/Ubuntu split it into pythonX.Y-venv, without which `-m venv` fails
    # The base interpreter, never a venv's (the project venv's bin is on PATH, and is rebuilt from it).
    if "$candidate" -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
      "$candidate" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))'
      return 0
    fi
  done
  return 1
}

_managed_pythons() {
  local uv
  if command -v pyenv >/dev/null 2>&1; then
    ls -d "$(pyenv root)"/versions/3.1[2-9]*/bin/python3 2>/dev/null || true
  fi
  for uv in uv "$HOME/.local/bin/uv"; do
    if command -v "$uv" >/dev/null 2>&1; then
      (cd / && "$uv" python find '>=3.12' 2>/dev/null) || true
      return 0
    fi
  done
}

# The one message bootstrap stops with when no interpreter fits; $1 = what was found instead.
python_missing_message() {
  local sudo="sudo "
  [ "$EUID" -ne 0 ] || sudo=""  # root: the commands as root types them (a root shell may have no sudo)
  cat <<MSG
no Python >= 3.12 found (the controller toolchain, ansible-core 2.21, needs it); ${1}.
Install one, then run bootstrap again:
  Ubuntu 24.04 (python3 is 3.12):  ${sudo}apt install python3.12-venv
  Debian 12 (ships 3.11; its archive has no python3.12), with uv's managed Python:
      ${sudo}apt install pipx && pipx install uv && ~/.local/bin/uv python install 3.12
      (pipx from the Debian mirror, uv from PyPI; the Python itself comes from GitHub: python-build-standalone)
    or with pyenv:  pyenv install 3.12  (built from python.org's sources; build dependencies from the Debian mirror)
  Bootstrap finds uv's and pyenv's interpreters by itself; any other: BWS_PYTHON=/path/to/python3.12
MSG
}

# What the interpreter search saw, for that message.
python_found_summary() {
  local candidate found=()
  for candidate in python3.14 python3.13 python3.12 python3.11 python3; do
    command -v "$candidate" >/dev/null 2>&1 &&
      found+=("$candidate $("$candidate" -c 'import platform, importlib.util as u
print(platform.python_version() + ("" if u.find_spec("ensurepip") else " without its venv module"))' 2>/dev/null || echo '?')")
  done
  if [ ${#found[@]} -eq 0 ]; then echo "found no python3 on PATH"; else
    local IFS=,; echo "found ${found[*]}"; fi
}

# contract_python X.Y: the interpreter the contract venvs are built with. BWS_CONTRACT_PYTHON when set; else the
# distribution's /usr/bin/pythonX.Y when it can make venvs (Debian: pythonX.Y-venv): distributions build it with
# profile-guided optimisation, and SGLang's server imports took 22% less CPU on it than on pyenv's default build;
# else pythonX.Y on PATH, then pyenv's.
contract_python() {
  local want=$1 candidate
  for candidate in "${BWS_CONTRACT_PYTHON:-}" "/usr/bin/python$want" "python$want"; do
    [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 || continue
    if [ "$candidate" = "${BWS_CONTRACT_PYTHON:-}" ] || "$candidate" -c 'import ensurepip' >/dev/null 2>&1; then
      echo "$candidate"; return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    for candidate in "$(pyenv root)/versions/$want".*/bin/python3; do
      [ -x "$candidate" ] && { echo "$candidate"; return 0; }
    done
  fi
  die "python$want (with its venv module) not found: install it (Debian: apt install python$want-venv) or set BWS_CONTRACT_PYTHON"
}

# python_identity PYTHON: the interpreter's real path and full version, for the venv recipes' stamps (a venv built
# with another interpreter is rebuilt).
python_identity() {
  "$1" -c 'import os, platform, sys; print(os.path.realpath(sys.executable), platform.python_version())'
}

# What tests/sandbox/prepare_host.yml puts on a test host is a function of these files and of the image it runs on:
# their digest names a prepared host (the stamp sandbox.sh writes) and the prepared image (build-prepared-image.sh).
sandbox_prepared_hash() {
  {
    podman image inspect -f '{{.Id}}' "$SANDBOX_IMAGE"
    (cd "$REPO_ROOT" && find tests/sandbox tests/doubles tests/fixtures/nvidia-smi/rtxpro6000-8gpu-constructed \
       inventory/sandbox -type f -not -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -d' ' -f1
}
