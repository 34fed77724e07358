#!/usr/bin/env bash
# The README's first command: runs the real deploy playbook against the embedded default, a local
# systemd container ("bws-sandbox") standing in for a GPU server, with the ENGINE TEST DOUBLE in place
# of the engine. Usage: bash scripts/sandbox.sh [playbook] [ansible-playbook options...]
#   bash scripts/sandbox.sh                                   # deploy SGLang (default)
#   bash scripts/sandbox.sh deploy_vllm.yml                    # switch the sandbox to vLLM
#   bash scripts/sandbox.sh teardown.yml
#   bash scripts/sandbox.sh deploy_sglang.yml --check --diff
#   BWS_SANDBOX_DESTROY=1 bash scripts/sandbox.sh             # remove the sandbox container
# BWS_SANDBOX_NAME picks another container (default bws-sandbox), so a second sandbox can run beside yours (the
# README's own test does): inventory/sandbox reads the same variable, so `ansible-playbook -i inventory/sandbox`
# reaches the same container.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
SANDBOX=${BWS_SANDBOX_NAME:-bws-sandbox}
# A container name as podman takes it; it also lands in commands this script prints for you to paste.
[[ $SANDBOX =~ ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$ ]] || die "BWS_SANDBOX_NAME=$SANDBOX is not a container name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)"
export BWS_SANDBOX_NAME=$SANDBOX

if [ "${BWS_SANDBOX_DESTROY:-0}" = 1 ]; then
  podman rm -f --ignore -t 0 "$SANDBOX" >/dev/null 2>&1 || true
  echo "sandbox $SANDBOX removed"; exit 0
fi

playbook=deploy_sglang.yml
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then playbook=$1; shift; fi

stage "set-up (toolchain, test-host image)"
bash scripts/bootstrap.sh
bash scripts/build-image.sh
bash scripts/build-prepared-image.sh

if [ "$(podman inspect -f '{{.State.Running}}' "$SANDBOX" 2>/dev/null)" != true ]; then
  stage "boot $SANDBOX (systemd container standing in for a GPU server)"
  # CAP_SYS_PTRACE: root reads the engine's /proc/<pid>/fd as root on a real host does (GPU holders, simulated GPUs).
  bash scripts/boot-test-host.sh --cap-add SYS_PTRACE --image "$PREPARED_IMAGE" "$SANDBOX"
fi
# The prepared image carries the engine test double, the bench client double, the tiny weights and the simulated
# GPUs; a sandbox booted from an older one (its stamp differs) is prepared again here.
PREPARED_STAMP=/etc/bws-sandbox-prepared
prepared=$(sandbox_prepared_hash)
if [ "$(podman exec "$SANDBOX" cat "$PREPARED_STAMP" 2>/dev/null)" != "$prepared" ]; then
  stage "prepare $SANDBOX (the engine test double at the engines' paths, tiny weights)"
  ansible-playbook -i inventory/sandbox tests/sandbox/prepare_host.yml >/dev/null
  podman exec "$SANDBOX" sh -c "echo $prepared > $PREPARED_STAMP"
fi

stage "ansible-playbook -i inventory/sandbox $playbook $*"
rc=0
ansible-playbook -i inventory/sandbox "$playbook" "$@" || rc=$?

# The outcome of this run, and where to look next: what fits the playbook that ran, and its result.
check_mode=false
for argument in "$@"; do case $argument in -C|--check) check_mode=true ;; esac; done
echo
if [ "$rc" -ne 0 ]; then
  echo "Sandbox outcome: $playbook FAILED (ansible-playbook exit $rc); the task and the reason are above."
elif $check_mode; then
  echo "Sandbox outcome: $playbook ran in check mode against $SANDBOX: nothing was changed."
else
  echo "Sandbox outcome: $playbook ran for real against $SANDBOX (systemd, podman)."
fi
echo "The engine there is the ENGINE TEST DOUBLE, not SGLang or vLLM. Look around:"
case $playbook in
  teardown.yml|playbooks/teardown.yml)
    echo "  podman exec $SANDBOX systemctl is-active sglang vllm      # inactive: nothing serves"
    echo "Serve again: bash scripts/sandbox.sh (SGLang) or bash scripts/sandbox.sh deploy_vllm.yml" ;;
  *)
    echo "  podman exec $SANDBOX systemctl status sglang vllm --no-pager"
    echo "  podman exec $SANDBOX python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:30000/health').status)\"" ;;
esac
echo "Against a real GPU server: ansible-playbook -i inventory/<yours> $playbook (see README)."
exit "$rc"
