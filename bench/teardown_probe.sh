#!/usr/bin/env bash
# Where a teardown.yml's time goes on a GPU machine, beside what ansible-playbook and one ping cost there:
# interpreter start-up (with and without site), an empty play, a one-ping play and teardown.yml (5 each, with the
# profile_tasks recap), then one ping play and one teardown.yml under ANSIBLE_DEBUG for the controller/module split
# (module payload built, module ran). Needs what bench/gpu_host_run.sh needs (.whl/, .cache/collections/); it
# runs in a private PID namespace (teardown.yml signals engine processes: here only its own could be reached).
# Usage, from the repository root: bash bench/teardown_probe.sh
set -uo pipefail
if [ "${BWS_IN_PIDNS:-}" != 1 ]; then BWS_IN_PIDNS=1 exec unshare --pid --fork --mount-proc bash "$0" "$@"; fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/bws-site .whl/*.whl
export PYTHONPATH=/tmp/bws-site PATH=/tmp/bws-site/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$PWD/collections:$PWD/.cache/collections
py=$(command -v python3)
for i in 1 2 3; do /usr/bin/time -f "python3 -c pass %e" $py -c pass; /usr/bin/time -f "python3 -S -c pass %e" $py -S -c pass; /usr/bin/time -f "python3 -I -c pass %e" $py -I -c pass; done
$py -c "import sys; print(sys.version); print(len(sys.path), sys.path)"
printf '{"all":{"children":{"gpu_servers":{"hosts":{"localhost":{"ansible_connection":"local","ansible_python_interpreter":"%s"}}}}}}' "$py" > /tmp/inv.json
printf -- "- hosts: gpu_servers\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n" > /tmp/ping.yml
printf -- "- hosts: gpu_servers\n  gather_facts: false\n  tasks: []\n" > /tmp/empty.yml
for i in 1 2 3 4 5; do
  /usr/bin/time -f "empty %e" ansible-playbook -i /tmp/inv.json /tmp/empty.yml >/dev/null
  /usr/bin/time -f "ping %e" ansible-playbook -i /tmp/inv.json /tmp/ping.yml > /tmp/p.log; grep -E -- "---" /tmp/p.log | tail -1
  /usr/bin/time -f "teardown %e" ansible-playbook -i /tmp/inv.json playbooks/teardown.yml -e teardown_confirm=yes -e gpu_release_service_users='["root"]' > /tmp/t.log; grep -E -- "---" /tmp/t.log
done
for pb in /tmp/ping.yml playbooks/teardown.yml; do
  ANSIBLE_DEBUG=1 ansible-playbook -i /tmp/inv.json $pb -e gpu_release_service_users='["root"]' > /tmp/d.log 2>&1
  echo "== $pb"; grep -E "ANSIBALLZ: (Creating module|Writing module into)|getting output with|done communicating|entering _queue_task|TASK \[" /tmp/d.log | cut -c1-110
  head -3 /tmp/d.log | cut -c1-100; tail -2 /tmp/d.log | cut -c1-100
done
