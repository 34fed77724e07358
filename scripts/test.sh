#!/usr/bin/env bash
# The project's one test command (README, .ci/run). Installs what it needs, then runs, failing on
# the first error: yamllint, ruff, ansible-doc of every module, the execution environment's build context
# (ansible-builder create), ansible-test sanity on the collection, ansible-lint (production; it runs `ansible-playbook --syntax-check` on every
# playbook, root-level entry points included, and every role) beside pytest (unit + integration), Molecule on
# systemd test hosts beside the engine contracts, and the
# engine lifecycle scenarios (deploys, faults with rollback, secrets, fleet) on booted systemd hosts.
# Test files run two (hosts: four) at a time with pytest-xdist; image and contract venvs build in the background.
# Each stage ends with a line giving its duration; pytest and the Molecule verifiers print one line per test
# (-v) and Molecule one line per scenario step and task, so a long stage shows where it is. The run ends with
# the stage times (each stage once), a "stages: N ok, N failed" line naming the failed ones, and a pytest-style
# "N passed, N failed" line that counts the test cases of the JUnit files (tests/summary.py).
# With arguments it runs only the named parts (scripts/test.sh --help); .ci/run gives none: everything.
usage() {
  cat <<'USAGE'
usage: bash scripts/test.sh [PART ...]
       bash scripts/test.sh pytest [PYTEST ARGUMENTS ...]

With no PART, everything, in this order (what CI runs: .ci/run). Each PART runs only its stages, after the
bootstrap (scripts/bootstrap.sh: the toolchain, a no-op when it is installed):
  lint       yamllint, ruff, ansible-doc of every module and role, the execution environment's build
             context, ansible-test sanity (compile, import, pep8, validate-modules), ansible-lint (production)
  unit       ansible-test units (tests/unit/plugins), then pytest: the rest of tests/unit and
             tests/integration, without the tests that boot hosts
  molecule   the Molecule scenarios (default, provision) on systemd test hosts
  contract   the engine contracts: the real SGLang and vLLM code of the pinned versions (CPU venvs)
  host       the host scenarios: deploys, faults, fleet and the real front ends on booted systemd hosts
  pytest ... pytest with the given arguments (after the bootstrap and the test-host image), for instance
             bash scripts/test.sh pytest tests/unit/plugins/modules/test_engine_wait.py -k stall
             bash scripts/test.sh pytest -m container tests/integration/test_real_vllm_host.py
Environment: BWS_TEST_WORKERS (default 2), BWS_HOST_WORKERS (default 5), BWS_MOLECULE_SCENARIOS.
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

RESULTS=$(mktemp -d)
# On an early stop, the background stages still running. Under `set -e` a bare `kill` with no job left
# exits 2 inside the trap, and that becomes the script's status: a green run would end with rc 2.
trap 'jobs -pr | xargs -r kill 2>/dev/null || true; rm -rf "$RESULTS"' EXIT

# summary STATUS: the stage table, the stages' verdicts and the test cases' line from $RESULTS (tests/summary.py),
# then exits with STATUS: the run's status is what fails CI, whatever the lines say.
summary() {
  local status=$1 python=$VENV_DIR/bin/python
  [ -x "$python" ] || python=python3  # a bootstrap that failed may have left no venv
  "$python" "$REPO_ROOT/tests/summary.py" "$RESULTS" \
    || { printf '\n### stages (name, status, seconds)\n'; sed 's/^/  /' "$RESULTS/stages.tsv" 2>/dev/null || true; }
  exit "$status"
}

verdict() { [ "$1" -eq 0 ] && echo ok || echo FAILED; }  # verdict RC

# run_stage NAME COMMAND...: times the stage and records it in $RESULTS/stages.tsv (name, status, seconds: the
# stage table's rows); on failure stops everything.
run_stage() {
  local name=$1 start rc=0 took; shift
  start=$(date +%s)
  stage "$name"
  "$@" || rc=$?
  took=$(( $(date +%s) - start ))
  printf '### %s: %s in %ss\n' "$name" "$(verdict $rc)" "$took"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$took" >> "$RESULTS/stages.tsv"
  [ $rc -eq 0 ] || summary 1
}

module_docs() {  # one ansible-doc run for every module (it names each one it cannot document, and exits 1)
  local -a modules=()
  local module
  for module in plugins/modules/*.py; do modules+=("$(basename "$module" .py)"); done
  ansible-doc "${modules[@]/#/blackwell.serving.}" >/dev/null || { echo "ansible-doc failed (the module named above)"; return 1; }
  echo "ansible-doc ok: ${#modules[@]} modules"
  # roles: their argument specs (defaults included) render, as users read them
  ansible-doc -t role -r roles $(ls roles) >/dev/null || { echo "ansible-doc -t role failed"; return 1; }
  echo "ansible-doc ok: $(ls roles | wc -l) roles"
}

ee_create() {  # the execution environment's build context (building it needs a registry: not here)
  rm -rf artifacts/collection
  ansible-galaxy collection build --force --output-path artifacts/collection >/dev/null
  ansible-builder create -f execution-environment.yml -c "$RESULTS/ee-context" >/dev/null
  ls "$RESULTS"/ee-context/_build/collection/blackwell-serving-*.tar.gz >/dev/null \
    || { echo "the collection's tarball is not in the build context"; return 1; }
  [ -s "$RESULTS/ee-context/Containerfile" ] || { echo "ansible-builder create wrote no Containerfile"; return 1; }
  echo "execution environment context ok: $(grep -c '^FROM' "$RESULTS/ee-context/Containerfile") build stages"
}

pytest_stage() {  # pytest_stage NAME ARGS...
  local name=$1; shift
  pytest -v -p no:cacheprovider --durations=12 --junitxml="$RESULTS/$name.xml" "$@"
}

lane_time() {  # lane_time NAME START RC: a line of the stage table's side-by-side part
  printf '%-28s %5ss  %s\n' "$1" "$(( $(date +%s) - $2 ))" "$(verdict "$3")" >> "$RESULTS/lane-times"
}

molecule_scenario() {  # molecule_scenario NAME: one scenario on hosts of its own, each line prefixed with its name
  local scenario=$1 start status=0
  start=$(date +%s)
  BWS_JUNIT="$RESULTS/molecule-$scenario.xml" molecule test -s "$scenario" 2>&1 | sed -u "s/^/[$scenario] /" \
    || status=$?
  printf '### molecule scenario %s: %s in %ss\n' "$scenario" "$(verdict $status)" "$(( $(date +%s) - start ))"
  lane_time "molecule $scenario" "$start" "$status"
  return "$status"
}

contracts_after_venvs() {  # the contract stage: waits for its venvs (in this shell: it waits on its job), then runs
  local start rc=0
  if [ -d tests/contract ]; then
    await_background contract-venvs || rc=$?
    start=$(date +%s)
    [ $rc -ne 0 ] || pytest_stage contracts "${PARALLEL[@]}" tests/contract || rc=$?
    lane_time contracts "$start" "$rc"
  fi
  return "$rc"
}

# Molecule and the contracts in two lanes. Molecule provision (a bare host provisioned, re-run, verified: the
# longest scenario) is mostly serial apt, systemd and playbook start-up, about one core; the other lane runs
# the default scenario, then the contract stage (its venvs built by then, or awaited), on the other core.
molecule_and_contracts() {
  local rc=0 scenario
  local -a scenarios=() pids=()
  if want molecule; then
    for scenario in ${BWS_MOLECULE_SCENARIOS:-$(ls molecule)}; do  # molecule/shared holds playbooks, no scenario
      [ ! -f "molecule/$scenario/molecule.yml" ] || scenarios+=("$scenario")
    done
  fi
  for scenario in "${scenarios[@]}"; do
    [ "$scenario" != default ] || continue
    stage "molecule test -s $scenario"
    molecule_scenario "$scenario" & pids+=($!)
  done
  if [[ " ${scenarios[*]} " == *" default "* ]]; then
    stage "molecule test -s default"
    molecule_scenario default || rc=1
  fi
  if want contract; then
    stage "contracts (beside Molecule ${scenarios[*]:-nothing})"
    contracts_after_venvs > >(sed -u 's/^/[contracts] /') 2>&1 || rc=1
  fi
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  return "$rc"
}

# Downloads and installs that only later stages need (the test-host image, the contract venvs) run in the
# background while the lint, unit and Molecule stages run; the stage that needs one waits for it and prints its log.
# The contract venvs (3.6 GB, mostly CPU: unpacking and byte-compiling torch and the engines) build at a lower CPU
# priority: they take the CPU the stages before them leave instead of slowing the lint and unit stages. The
# contract stage itself runs beside Molecule provision, after the default scenario (molecule_and_contracts).
declare -A BACKGROUND=() AWAITED=()
start_background() {  # start_background NAME COMMAND...
  local name=$1; shift
  printf '### %s: started in the background\n' "$name"
  ( start=$(date +%s); rc=0; "$@" > "$RESULTS/$name.log" 2>&1 || rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - start ))" > "$RESULTS/$name.done"; exit "$rc" ) &
  BACKGROUND[$name]=$!
}
# await_background NAME: its log, its own duration, its status. Once: awaited again (the image, by two parts), it
# only returns the status. The stage table takes its own duration from $RESULTS/NAME.done and puts it in the row
# of the stage of the same name that awaited it (tests/summary.py).
await_background() {
  local name=$1 rc=0 took
  if [ -n "${AWAITED[$name]:-}" ]; then return "${AWAITED[$name]}"; fi
  wait "${BACKGROUND[$name]}" || rc=$?
  AWAITED[$name]=$rc
  sed "s/^/[$name] /" "$RESULTS/$name.log"
  took=$(cut -f3 "$RESULTS/$name.done" 2>/dev/null || echo "?")
  printf '### %s (background): %s in %ss\n' "$name" "$(verdict $rc)" "$took"
  return "$rc"
}

# Test files that boot hosts of their own run side by side, one file per worker (module-scoped hosts).
PARALLEL=(-n "${BWS_TEST_WORKERS:-2}" --dist loadfile)

run_stage bootstrap bash scripts/bootstrap.sh
if want molecule || want host || want pytest; then start_background image bash scripts/build-image.sh; fi
if [ -d tests/contract ] && { want contract || want host; }; then
  start_background contract-venvs nice -n 10 python tests/contract/prepare_venvs.py
fi
if want lint; then
  run_stage yamllint yamllint --strict .
  run_stage ruff ruff check .
  run_stage ansible-doc module_docs
  run_stage execution-environment ee_create
  run_stage ansible-test-sanity bash scripts/ansible_test.sh sanity
  # ansible-lint (about 1.3 cores for 2 minutes) runs beside the unit and integration tests, which leave part of
  # the second core idle while their playbooks and engine doubles wait; its verdict is read before anything boots
  # a host.
  start_background ansible-lint ansible-lint --strict -q
fi
if want unit; then
  # the plugins' own unit tests run under ansible-test, on the collection as it is packed
  run_stage ansible-test-units env BWS_JUNIT="$RESULTS/ansible-test-units.xml" bash scripts/ansible_test.sh units
  run_stage pytest pytest_stage pytest "${PARALLEL[@]}" -m "not container" --ignore=tests/unit/plugins tests/unit \
    tests/integration
fi
if want lint; then run_stage ansible-lint await_background ansible-lint; fi
if want pytest; then
  run_stage image await_background image
  run_stage "pytest ${PYTEST_ARGS[*]}" pytest_stage pytest-args "${PYTEST_ARGS[@]}"
fi
if want molecule || want host; then run_stage image await_background image; fi
if want molecule || want contract; then run_stage "molecule + contracts" molecule_and_contracts; fi
# Six scenario files with hosts of their own (lifecycle, faults, faults after start, proof, fleet, release scope):
# five workers, so that the five long files start at once (xdist hands files out by test count, largest first)
# and the short release-scope file follows the first to finish. Most of their time is spent waiting on engine
# doubles, systemd and timeouts; the CPU-bound part is shared out by the kernel either way.
if want host; then
  # the real-front-end hosts run on the contract venvs; without the contract part nothing has waited for them
  if ! want contract && [ -n "${BACKGROUND[contract-venvs]:-}" ]; then
    run_stage contract-venvs await_background contract-venvs
  fi
  run_stage host-scenarios pytest_stage host-scenarios -n "${BWS_HOST_WORKERS:-5}" --dist loadfile -m container \
    tests/integration
fi
summary 0
