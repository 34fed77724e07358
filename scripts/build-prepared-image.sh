#!/usr/bin/env bash
# Builds the prepared test-host image once: the test-host image (scripts/build-image.sh) booted, with
# tests/sandbox/prepare_host.yml applied (the ENGINE TEST DOUBLE at the engines' paths, tiny weights, the simulated
# GPUs, the JIT and toolchain doubles), then committed. The sandbox and every host scenario boot it instead of
# preparing each host anew. It is labelled with the digest of what prepare_host.yml puts there (sandbox_prepared_hash,
# scripts/lib.sh) and skipped when an image of that digest exists; the same digest is the host's stamp,
# /etc/bws-sandbox-prepared, which sandbox.sh and the host scenarios compare before they use a host as prepared.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

mkdir -p "$CACHE_DIR"
exec 9>"$CACHE_DIR/prepared-image.lock"
flock 9  # the sandbox and a test run may ask at once: one builds, the other finds it built

digest=$(sandbox_prepared_hash)
if podman image exists "$PREPARED_IMAGE" &&
   [ "$(podman image inspect -f '{{ index .Labels "bws.prepared" }}' "$PREPARED_IMAGE" 2>/dev/null)" = "$digest" ]; then
  exit 0
fi
stage "build $PREPARED_IMAGE (the test-host image with tests/sandbox/prepare_host.yml applied)"
host=bws-prepare-image-$$
trap 'podman rm -f --ignore -t 0 "$host" >/dev/null 2>&1 || true' EXIT
bash scripts/boot-test-host.sh --label owner=bws-image "$host"
log=$(mktemp)
if ! BWS_SANDBOX_NAME=$host ansible-playbook -i inventory/sandbox tests/sandbox/prepare_host.yml >"$log" 2>&1; then
  cat "$log" >&2; rm -f "$log"; die "tests/sandbox/prepare_host.yml failed on $host (its output is above)"
fi
rm -f "$log"
podman exec "$host" sh -c "echo $digest > /etc/bws-sandbox-prepared"
podman stop -t 30 "$host" >/dev/null  # systemd halts (STOPSIGNAL SIGRTMIN+3): the journal is closed, nothing half-written
podman commit --quiet --change "LABEL bws.prepared=$digest" "$host" "$PREPARED_IMAGE" >/dev/null
echo "built $PREPARED_IMAGE (prepared: $digest)"
