"""The test hosts' connection (tests/plugins/connection/podman_nsenter.py) gives a task what `podman exec` gives it:
the container's systemd, files, processes, cgroups, environment and capability bounding set, none of the controller's
environment, files that travel both ways, a container found again after a restart, and a stopped one named."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.integration.engine_host import EngineHost, podman
from tests.integration.lifecycle_helpers import CONTAINER_MARKS

pytestmark = CONTAINER_MARKS
NAME = "bws-it-connection"
CONTROLLER_ONLY = "BWS_CONTROLLER_ONLY_MARKER"

PLAYBOOK = """
- name: What a task sees through the test hosts' connection
  hosts: gpu_servers
  gather_facts: false
  become: true
  tasks:
    # Without become: sudo would reset the environment, hiding whose it is.
    - name: Read PID 1, the host name, the bounding set, the cgroups and the environment
      ansible.builtin.shell: |
        cat /proc/1/comm; hostname; grep ^CapBnd: /proc/self/status | cut -f2
        sort /proc/self/cgroup | paste -sd' '; env
      register: seen
      changed_when: false
      become: false

    - name: Put the payload and what was seen into files
      ansible.builtin.copy:
        content: "{{ item.content }}\\n"
        dest: /root/{{ item.name }}
        mode: "0600"
      loop:
        - {name: payload.txt, content: "{{ payload }}"}
        - {name: seen.txt, content: "{{ seen.stdout }}"}

    - name: Fetch them back
      ansible.builtin.fetch:
        src: /root/{{ item }}
        dest: "{{ fetched }}/{{ item }}"
        flat: true
      loop: [payload.txt, seen.txt]
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    host = EngineHost(NAME, tmp_path_factory.mktemp("connection"))
    host.write_inventory({})
    host.boot()
    (host.workdir / "play.yml").write_text(PLAYBOOK)
    os.environ[CONTROLLER_ONLY] = "1"
    try:
        yield host
    finally:
        os.environ.pop(CONTROLLER_ONLY, None)
        host.destroy()


def run(host: EngineHost, payload: str):
    """The play's result, the payload it fetched back and what its shell task saw (its lines), when it got so far."""
    fetched = host.workdir / f"fetched-{payload}"
    result = host.run_playbook(str(host.workdir / "play.yml"), extravars={"payload": payload, "fetched": str(fetched)})
    payload_back = (fetched / "payload.txt").read_text() if (fetched / "payload.txt").exists() else None
    seen = (fetched / "seen.txt").read_text().splitlines() if (fetched / "seen.txt").exists() else None
    return result, payload_back, seen


def test_a_task_sees_the_container_as_podman_exec_shows_it(host):
    result, payload, seen = run(host, "first")
    assert result.status == "successful", result.stdout[-3000:]
    comm, hostname, bounding_set, cgroups, *environment = seen
    assert (comm, hostname) == ("systemd", NAME)
    # podman exec's own process: the container's bounding set, which is narrower than the controller's
    assert bounding_set == host.sh("grep ^CapBnd: /proc/self/status | cut -f2")
    assert bounding_set != Path("/proc/self/status").read_text().split("CapBnd:")[1].split()[0]
    # in the container's cgroups where podman exec puts its processes (the module judges its scope by them)
    assert cgroups == host.sh("sort /proc/self/cgroup | paste -sd' '"), cgroups
    assert not [line for line in environment if line.startswith(CONTROLLER_ONLY)]
    assert "container=podman" in environment, environment
    assert payload == "first\n"
    assert host.sh("cat /root/payload.txt") == "first"


def test_a_unit_gets_its_credentials_as_on_a_real_host(host):
    """/run is shared, as systemd makes it on a real host (scripts/boot-test-host.sh): under podman's private /run a
    unit's $CREDENTIALS_DIRECTORY is empty and the vllm role's key never reaches vLLM (systemd/systemd#38103)."""
    assert host.sh("findmnt -no PROPAGATION /run") == "shared"
    host.sh("id credtest >/dev/null 2>&1 || useradd --system credtest; umask 077; printf s3cr3t-cred > /root/cred")
    seen = host.sh("systemd-run --wait --pipe --quiet -p User=credtest -p PrivateMounts=yes"
                   " -p LoadCredential=api-key:/root/cred sh -c 'cd \"$CREDENTIALS_DIRECTORY\";"
                   " stat -c \"%U %a\" api-key; cat api-key; echo; env | grep -c s3cr3t-cred || true'")
    assert seen.splitlines() == ["credtest 400", "s3cr3t-cred", "0"]


def test_a_restarted_container_is_found_again_and_a_stopped_one_is_named(host):
    before = podman("inspect", "--format", "{{.State.Pid}}", NAME).stdout.strip()
    podman("restart", "-t", "0", NAME)
    deadline = time.monotonic() + 90
    while host.sh("systemctl is-system-running --wait", check=False) not in ("running", "degraded"):
        assert time.monotonic() < deadline, f"{NAME} did not boot again"
        time.sleep(0.5)
    assert podman("inspect", "--format", "{{.State.Pid}}", NAME).stdout.strip() != before
    result, payload, _ = run(host, "again")
    assert result.status == "successful", result.stdout[-3000:]
    assert payload == "again\n"
    podman("stop", "-t", "0", NAME)
    result, _, _ = run(host, "stopped")
    assert result.status != "successful"
    assert f"container {NAME} is not running" in result.stdout, result.stdout[-3000:]
