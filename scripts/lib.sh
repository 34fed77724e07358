# shellcheck shell=bash
# Shared helpers for the project's scripts: where the toolchain lives, how to find Python >= 3.12,
# and stage timing. Sourced, never executed.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_DIR=${BWS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/blackwell-serving}
VENV_DIR=${BWS_VENV_DIR:-$CACHE_DIR/venv}
COLLECTIONS_DIR=${BWS_COLLECTIONS_DIR:-$CACHE_DIR/collections}
CONTAINERS_CONF_FILE=$CACHE_DIR/containers.conf
SANDBOX_IMAGE=${BWS_SANDBOX_IMAGE:-localhost/bws-debian-systemd:bookworm}
export REPO_ROOT CACHE_DIR VENV_DIR COLLECTIONS_DIR SANDBOX_IMAGE
# Our podman settings live in a file we own; a user's /etc/containers is never rewritten.
export CONTAINERS_CONF=$CONTAINERS_CONF_FILE
export ANSIBLE_COLLECTIONS_PATH=$COLLECTIONS_DIR
export ANSIBLE_CONFIG=$REPO_ROOT/ansible.cfg
export PATH=$VENV_DIR/bin:$PATH

_t0=$(date +%s)
stage() { printf '\n### [%4ss] %s\n' "$(( $(date +%s) - _t0 ))" "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Print the path of a Python >= 3.12 interpreter (ansible-core 2.21 refuses older controllers).
find_python() {
  local candidate
  for candidate in "${BWS_PYTHON:-}" python3.13 python3.12 python3; do
    [ -n "$candidate" ] || continue
    if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
      command -v "$candidate" 2>/dev/null || echo "$candidate"
      return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    for candidate in "$(pyenv root)"/versions/3.1[2-9]*/bin/python3; do
      [ -x "$candidate" ] && { echo "$candidate"; return 0; }
    done
  fi
  return 1
}

# boot_test_host NAME: start a systemd container from the test-host image and wait until systemd
# reports the system up (podman exec races the container's bus at first, so poll).
boot_test_host() {
  local name=$1 state="" i
  podman run -d --replace --name "$name" --hostname "$name" --systemd=always --cap-add=SYS_ADMIN \
    --label owner=bws-test "$SANDBOX_IMAGE" /sbin/init >/dev/null
  for i in $(seq 1 60); do
    state=$(podman exec "$name" systemctl is-system-running --wait 2>/dev/null || true)
    case $state in running|degraded) return 0;; esac
    sleep 0.5
  done
  die "$name did not boot (systemd: ${state:-no answer})"
}
