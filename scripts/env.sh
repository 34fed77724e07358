# shellcheck shell=bash
# Puts the project's pinned toolchain (ansible-playbook, molecule, pytest, ...) on PATH in the current
# shell and points Ansible at this repository's ansible.cfg and collections:
#   source scripts/env.sh          (bash; run `bash scripts/bootstrap.sh` once first)
# It only sets environment variables: shell options (set -e, -u, pipefail) are left as they were,
# and sourcing it twice does not grow PATH. scripts/lib.sh sources it for the project's own scripts.

# Bash only. This check is POSIX: sh (dash) reads a sourced file a command at a time, so it stops here before
# it reaches the bash syntax below (where it would print "Bad substitution" and go on with REPO_ROOT=/).
if [ -z "${BASH_VERSION:-}" ]; then
  echo "scripts/env.sh: source it from bash (bash -c 'source scripts/env.sh'), not sh" >&2
  return 1 2>/dev/null || exit 1
fi

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_DIR=${BWS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/blackwell-serving}
VENV_DIR=${BWS_VENV_DIR:-$CACHE_DIR/venv}
COLLECTIONS_DIR=${BWS_COLLECTIONS_DIR:-$CACHE_DIR/collections}
CONTAINERS_CONF_FILE=$CACHE_DIR/containers.conf
SANDBOX_IMAGE=${BWS_SANDBOX_IMAGE:-localhost/bws-debian-systemd:bookworm}
# The same image with tests/sandbox/prepare_host.yml applied (scripts/build-prepared-image.sh): what test hosts boot.
PREPARED_IMAGE=${BWS_PREPARED_IMAGE:-localhost/bws-debian-systemd:prepared}
export REPO_ROOT CACHE_DIR VENV_DIR COLLECTIONS_DIR SANDBOX_IMAGE PREPARED_IMAGE
# Our podman settings live in a file we own; a user's /etc/containers is never rewritten.
export CONTAINERS_CONF=$CONTAINERS_CONF_FILE
# collections/ holds this checkout as the collection blackwell.serving, beside the pinned ones.
export ANSIBLE_COLLECTIONS_PATH=$REPO_ROOT/collections:$COLLECTIONS_DIR
export ANSIBLE_CONFIG=$REPO_ROOT/ansible.cfg
# First on PATH, moved there if it is further down: a Python that pyenv's shims started prepends its own bin
# (its pytest, its python) to the PATH its children inherit.
__bws_path=":$PATH:"
__bws_path=${__bws_path//":$VENV_DIR/bin:"/:}
__bws_path=${__bws_path#:}
export PATH=$VENV_DIR/bin:${__bws_path%:}
unset __bws_path
