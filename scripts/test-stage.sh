#!/usr/bin/env bash
# The test command's stages that are more than one command (tests/stage_runner.py runs them; BWS_RESULTS is its
# results folder, where JUnit files go):
#   bash scripts/test-stage.sh module-docs           ansible-doc of every module and role
#   bash scripts/test-stage.sh ee-create             the execution environment's build context (ansible-builder create)
#   bash scripts/test-stage.sh ansible-test-units    ansible-test units on the collection as it is packed
#   bash scripts/test-stage.sh molecule SCENARIO     one Molecule scenario, its verifier's JUnit file kept
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
RESULTS=${BWS_RESULTS:?BWS_RESULTS: the results folder (tests/stage_runner.py sets it)}

module_docs() {  # one ansible-doc run for every module (it names each one it cannot document, and exits 1)
  local -a modules=()
  local module
  for module in plugins/modules/*.py; do modules+=("$(basename "$module" .py)"); done
  ansible-doc "${modules[@]/#/blackwell.serving.}" >/dev/null || { echo "ansible-doc failed (the module named above)"; return 1; }
  echo "ansible-doc ok: ${#modules[@]} modules"
  # roles: their argument specs (defaults included) render, as users read them
  # shellcheck disable=SC2046
  ansible-doc -t role -r roles $(ls roles) >/dev/null || { echo "ansible-doc -t role failed"; return 1; }
  echo "ansible-doc ok: $(ls roles | wc -l) roles"
}

ee_create() {  # the execution environment's build context (building it needs a registry: not here)
  local context
  context=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$context'" EXIT
  rm -rf artifacts/collection  # execution-environment.yml takes the collection's tarball from here
  ansible-galaxy collection build --force --output-path artifacts/collection >/dev/null
  ansible-builder create -f execution-environment.yml -c "$context" >/dev/null
  ls "$context"/_build/collection/blackwell-serving-*.tar.gz >/dev/null \
    || { echo "the collection's tarball is not in the build context"; return 1; }
  [ -s "$context/Containerfile" ] || { echo "ansible-builder create wrote no Containerfile"; return 1; }
  echo "execution environment context ok: $(grep -c '^FROM' "$context/Containerfile") build stages"
}

case ${1:-} in
  module-docs) module_docs ;;
  ee-create) ee_create ;;
  ansible-test-units) BWS_JUNIT="$RESULTS/ansible-test-units.xml" exec bash scripts/ansible_test.sh units ;;
  molecule)
    scenario=${2:?usage: bash scripts/test-stage.sh molecule SCENARIO}
    BWS_JUNIT="$RESULTS/molecule-$scenario.xml" exec molecule test -s "$scenario"
    ;;
  *) echo "usage: bash scripts/test-stage.sh module-docs|ee-create|ansible-test-units|molecule SCENARIO" >&2; exit 2 ;;
esac
