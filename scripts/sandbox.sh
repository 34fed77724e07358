#!/usr/bin/env bash
# The README's first command: runs the real deploy playbook against the embedded default, a local
# systemd container ("bws-sandbox") standing in for a GPU server, with the ENGINE TEST DOUBLE in place
# of the engine. Usage: bash scripts/sandbox.sh [playbook] [ansible-playbook options...]
#   bash scripts/sandbox.sh                                   # deploy SGLang (default)
#   bash scripts/sandbox.sh deploy_vllm.yml                    # switch the sandbox to vLLM
#   bash scripts/sandbox.sh teardown.yml
#   bash scripts/sandbox.sh deploy_sglang.yml --check --diff
#   BWS_SANDBOX_DESTROY=1 bash scripts/sandbox.sh             # remove the sandbox container
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
SANDBOX=bws-sandbox

if [ "${BWS_SANDBOX_DESTROY:-0}" = 1 ]; then
  podman rm -f --ignore -t 0 "$SANDBOX" >/dev/null 2>&1 || true
  echo "sandbox removed"; exit 0
fi

playbook=deploy_sglang.yml
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then playbook=$1; shift; fi

stage "set-up (toolchain, test-host image)"
bash scripts/bootstrap.sh
bash scripts/build-image.sh

if [ "$(podman inspect -f '{{.State.Running}}' "$SANDBOX" 2>/dev/null)" != true ]; then
  stage "boot $SANDBOX (systemd container standing in for a GPU server)"
  bash scripts/boot-test-host.sh "$SANDBOX"
fi
ansible-playbook -i inventory/sandbox tests/sandbox/prepare_host.yml >/dev/null

stage "ansible-playbook -i inventory/sandbox $playbook $*"
ansible-playbook -i inventory/sandbox "$playbook" "$@"
cat <<TXT

Sandbox outcome: the playbook above ran for real against $SANDBOX (systemd, podman).
The engine there is the ENGINE TEST DOUBLE, not SGLang or vLLM. Look around:
  podman exec $SANDBOX systemctl status sglang vllm --no-pager
  podman exec $SANDBOX python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:30000/health').status)"
Against a real GPU server: ansible-playbook -i inventory/<yours> $playbook (see README).
TXT
