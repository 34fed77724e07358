#!/usr/bin/env bash
# Boots systemd test hosts from the test-host image (scripts/build-image.sh) with rootful podman, all at once, and
# waits until systemd reports each one up. The one way the project boots a test host: the sandbox (sandbox.sh),
# the Molecule scenarios (molecule/shared/create.yml) and the host scenarios (tests/integration/engine_host.py).
#   bash scripts/boot-test-host.sh [--label KEY=VALUE] [--image IMAGE] [--volume SRC:DEST[:OPTIONS]]...
#                                  [--cap-add CAPABILITY]... [--shm-size SIZE] NAME...
# (--volume: podman's bind mount, e.g. the test-engine venvs read-only for the real front-end scenarios;
# --cap-add: a capability besides SYS_ADMIN, e.g. SYS_PTRACE, so that root on the host reads /proc/<pid>/io of
# another user's process as root on a real host does; --shm-size: the host's /dev/shm, podman's 64m unless given,
# e.g. 512m for the real vLLM core, whose shared-memory message queue takes 160 MiB, as a real host's /dev/shm has.)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

label=owner=bws-test
image=$SANDBOX_IMAGE
volumes=()
caps=()
shm=()
usage="usage: boot-test-host.sh [--label KEY=VALUE] [--image IMAGE] [--volume SRC:DEST[:OPTIONS]]... [--cap-add CAP]..."
usage+=" [--shm-size SIZE] NAME..."
while [ $# -gt 0 ]; do
  case $1 in
    --label) label=$2; shift 2 ;;
    --image) image=$2; shift 2 ;;
    --volume) [ -d "${2%%:*}" ] || die "--volume $2: no directory ${2%%:*}"; volumes+=(--volume "$2"); shift 2 ;;
    --cap-add) [[ $2 =~ ^[A-Z_]+$ ]] || die "--cap-add $2: not a capability name"; caps+=(--cap-add="$2"); shift 2 ;;
    --shm-size) [[ $2 =~ ^[0-9]+[kmg]$ ]] || die "--shm-size $2: not a size like 512m"; shm=(--shm-size="$2"); shift 2 ;;
    -*) die "unknown option $1 ($usage)" ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || die "no host name given ($usage)"

# /run shared, as systemd makes every mount on a real host (podman's own /run is private, and systemd, run by a
# container manager, leaves it so): systemd mounts a unit's credentials (LoadCredential=, the vllm role's API key)
# through /run/systemd/propagate, and under a private /run the unit finds its $CREDENTIALS_DIRECTORY empty, silently
# (systemd/systemd#38103).
run_tmpfs=(--tmpfs /run:rw,nosuid,nodev,mode=755,rshared)
for name in "$@"; do
  podman run -d --replace --name "$name" --hostname "$name" --systemd=always --cap-add=SYS_ADMIN "${caps[@]}" "${shm[@]}" \
    "${run_tmpfs[@]}" --label "$label" "${volumes[@]}" "$image" /sbin/init >/dev/null
done
# podman exec races the container's bus at first: poll, within a bound.
for name in "$@"; do
  state=""
  for _ in $(seq 1 180); do
    state=$(podman exec "$name" systemctl is-system-running --wait 2>/dev/null || true)
    case $state in running|degraded) continue 2 ;; esac
    sleep 0.5
  done
  die "$name did not boot (systemd: ${state:-no answer})"
done
