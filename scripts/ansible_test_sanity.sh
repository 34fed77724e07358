#!/usr/bin/env bash
# ansible-test sanity on this collection (blackwell.serving): compile, import, pep8 and validate-modules, with
# Python 3.12, on the collection as `ansible-galaxy collection build` packs it, installed in a scratch
# ansible_collections tree (ansible-test runs inside one), with tests/sanity/ (the ignore file) beside it.
#   bash scripts/ansible_test_sanity.sh [more ansible-test sanity arguments]
# ansible-test bootstraps pip into each sanity venv with a get-pip script it downloads from outside the package
# registries; scripts/ansible_test_seed.py puts one in its cache that installs pip from PyPI's pip wheel instead.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python scripts/ansible_test_seed.py
ansible-galaxy collection build --force --output-path "$work" >/dev/null
ansible-galaxy collection install --force --offline --no-deps -p "$work/c" "$work"/blackwell-serving-*.tar.gz >/dev/null
target="$work/c/ansible_collections/blackwell/serving"
mkdir -p "$target/tests" && cp -r tests/sanity "$target/tests/"
cd "$target"
ansible-test sanity --python 3.12 --color no --test compile --test import --test pep8 --test validate-modules "$@"
