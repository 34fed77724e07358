#!/usr/bin/env bash
# The GPU tests and the teardown bench on a machine that has an NVIDIA GPU and PyTorch but not the controller
# toolchain (no network either): the toolchain comes as wheels in .whl/ and the collections in
# .cache/collections/, both prepared on a machine with network:
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#     ansible-core==2.21.5 resolvelib==1.2.1 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 \
#     Jinja2==3.1.6 MarkupSafe==3.0.4 PyYAML==6.0.4 ansible-runner==2.4.3 pexpect==4.9.0 ptyprocess==0.7.0 \
#     python-daemon==3.1.2 lockfile==0.12.2                  # the versions of requirements/controller.txt
#   cp -r ~/.cache/blackwell-serving/collections .cache/collections
#   git archive <commit> | tar -x -C .cache/before          # optional: a baseline checkout to time beside
#
# then, from the repository root on the GPU machine:  bash bench/gpu_host_run.sh OUT_DIR
# Everything that signals processes re-executes itself in a private PID namespace.
set -euo pipefail
out=${1:?usage: bench/gpu_host_run.sh OUT_DIR}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/bws-site .whl/*.whl
export PYTHONPATH=/tmp/bws-site PATH=/tmp/bws-site/bin:$PATH
export ANSIBLE_COLLECTIONS_PATH=$PWD/collections:${ANSIBLE_COLLECTIONS_PATH:-$PWD/.cache/collections}  # collections/: this checkout as blackwell.serving
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
ansible-playbook --version | head -1 | tee -a "$out/gpu.txt"

python3 -m pytest -q -p no:cacheprovider tests/gpu/test_release_real_gpu.py 2>&1 | tee "$out/test_release_real_gpu.log"
baseline=()
[ -d .cache/before ] && baseline=(--baseline-tree .cache/before)
python3 bench/bench_teardown.py --reps 9 "${baseline[@]}" --out "$out" 2>&1 | tee "$out/bench_teardown.log"
cp tests/gpu/results/*.json "$out/" 2>/dev/null || true
