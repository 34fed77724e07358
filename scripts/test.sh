#!/usr/bin/env bash
# The project's one test command (README, .ci/run): every stage, each reported, none stopped by another's failure.
# tests/stage_runner.py is its scheduler: it runs the bootstrap (scripts/bootstrap.sh), then starts each stage as soon
# as what it needs is ready, side by side within a CPU budget: lint (yamllint, ruff, ansible-doc of every module and
# role, the execution environment's build context, ansible-test sanity, ansible-lint production), the unit tests
# (ansible-test units on the packed collection; pytest on the rest of tests/unit and tests/integration), Molecule on
# systemd test hosts, the engine contracts (the real SGLang and vLLM code on CPU venvs), and the host scenarios
# (deploys, faults, fleet and the real front ends on booted systemd hosts). The test-host image and the contract
# venvs are stages too: what needs them waits for them, nothing else does.
# Every line a stage prints comes prefixed with its name; the run ends with the stage table (status, start, time,
# test cases) and a last line "PASSED: ..." or "FAILED: <stage> (<why>), ...; N of M stages passed; N tests (...)".
# The exit status is non-zero when any stage failed, timed out or did not run.
# With arguments it runs only the named parts (scripts/test.sh --help); .ci/run gives none: everything.
usage() {
  cat <<'USAGE'
usage: bash scripts/test.sh [PART ...]
       bash scripts/test.sh pytest [PYTEST ARGUMENTS ...]

With no PART, everything (what CI runs: .ci/run). Each PART runs only its stages and what they need, after the
bootstrap (scripts/bootstrap.sh: the toolchain, a no-op when it is installed):
  lint       yamllint, ruff, ansible-doc of every module and role, the execution environment's build
             context, ansible-test sanity (compile, import, pep8, validate-modules), ansible-lint (production)
  unit       ansible-test units (tests/unit/plugins) beside pytest: the rest of tests/unit and
             tests/integration, without the tests that boot hosts
  molecule   the Molecule scenario (provision: provision.yml) on a systemd test host
  contract   the engine contracts: the real SGLang and vLLM code of the pinned versions (CPU venvs)
  host       the host scenarios: deploys, faults, fleet and the real front ends on booted systemd hosts
  pytest ... pytest with the given arguments (after the bootstrap and the test-host image), for instance
             bash scripts/test.sh pytest tests/unit/plugins/modules/test_engine_wait.py -k stall
             bash scripts/test.sh pytest -m container tests/integration/test_real_vllm_host.py
Environment: BWS_TEST_WORKERS (default 2), BWS_HOST_WORKERS (default 5), BWS_MOLECULE_SCENARIOS,
BWS_TEST_SLOTS (stages side by side, in cores' worth; default 5), BWS_STAGE_TIMEOUT_S (per stage; default 3000),
BWS_TEST_RESULTS (a folder that keeps every stage's log and JUnit file; default: a temporary one, removed).
USAGE
}

PARTS=(lint unit molecule contract host)
declare -A WANT=()
PYTEST_ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    pytest) WANT[pytest]=1; shift; PYTEST_ARGS=("$@"); break ;;
    lint|unit|molecule|contract|host) WANT[$1]=1 ;;
    *) printf 'error: unknown part %q: the parts are %s, or pytest ARGS (bash scripts/test.sh --help)\n' \
         "$1" "${PARTS[*]}" >&2; exit 2 ;;
  esac
  shift
done
if [ ${#WANT[@]} -eq 0 ]; then for part in "${PARTS[@]}"; do WANT[$part]=1; done; fi
want() { [ -n "${WANT[$1]:-}" ]; }  # want PART: was it asked for (or is it the whole run)

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

# BWS_TEST_RESULTS keeps each stage's log and JUnit files in that folder; by default they go with the run.
if [ -n "${BWS_TEST_RESULTS:-}" ]; then
  mkdir -p "$BWS_TEST_RESULTS"
  RESULTS=$(cd "$BWS_TEST_RESULTS" && pwd)
else
  RESULTS=$(mktemp -d)
  trap 'rm -rf "$RESULTS"' EXIT
fi

if want pytest; then  # pytest with the user's arguments: after the bootstrap and the test-host images
  bash scripts/bootstrap.sh
  bash scripts/build-image.sh
  bash scripts/build-prepared-image.sh
  stage "pytest ${PYTEST_ARGS[*]}"
  exec pytest -v -p no:cacheprovider "${PYTEST_ARGS[@]}"
fi
parts=()
for part in "${PARTS[@]}"; do if want "$part"; then parts+=("$part"); fi; done
# The scheduler is standard-library Python: it runs on the distribution's python3 before the venv exists.
status=0
python3 tests/stage_runner.py --results "$RESULTS" --parts "${parts[@]}" || status=$?
exit "$status"
