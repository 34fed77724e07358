#!/usr/bin/env bash
# ansible-test on this collection (blackwell.serving), as `ansible-galaxy collection build` packs it, installed in a
# scratch ansible_collections tree (ansible-test runs inside one), with Python 3.12:
#   bash scripts/ansible_test.sh sanity [ARGS]   compile, import, pep8 and validate-modules (tests/sanity/ beside it)
#   bash scripts/ansible_test.sh units [ARGS]    tests/unit/plugins/ (the modules', module_utils' and filters' tests)
# ansible-test bootstraps pip into each sanity venv with a get-pip script it downloads from outside the package
# registries; scripts/ansible_test_seed.py puts one in its cache that installs pip from PyPI's pip wheel instead.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
command=${1:?usage: bash scripts/ansible_test.sh sanity|units [ansible-test arguments]}
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ansible-galaxy collection build --force --output-path "$work" >/dev/null
ansible-galaxy collection install --force --offline --no-deps -p "$work/c" "$work"/blackwell-serving-*.tar.gz >/dev/null
target="$work/c/ansible_collections/blackwell/serving"
case $command in
  sanity)
    python scripts/ansible_test_seed.py
    mkdir -p "$target/tests" && cp -r tests/sanity "$target/tests/"
    cd "$target"
    ansible-test sanity --python 3.12 --color no --test compile --test import --test pep8 --test validate-modules "$@"
    ;;
  units)
    # the tests' own helpers, doubles and fixtures come along (tests/ is not part of the built collection)
    cp -r tests "$target/"
    cd "$target"
    status=0
    ansible-test units --python 3.12 --color no --num-workers "${BWS_TEST_WORKERS:-2}" "${@:-tests/unit/plugins/}" \
      || status=$?
    # BWS_JUNIT: where the test command's summary reads this run's results
    if [ -n "${BWS_JUNIT:-}" ]; then
      for result in tests/output/junit/*.xml; do cp "$result" "${BWS_JUNIT%.xml}-${result##*/}"; done
    fi
    exit "$status"
    ;;
  *) echo "unknown ansible-test command: $command (sanity or units)" >&2; exit 2 ;;
esac
