"""A booted systemd test host (podman) shared by the engine lifecycle tests, and playbook runs on it.

The host is the same image the sandbox uses; the engine programs on it are the ENGINE TEST DOUBLE.
Playbooks run through tests/playbook_run.py (ansible-runner), the way CI drives them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.playbook_run import PlaybookRun, run_playbook

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("BWS_SANDBOX_IMAGE", "localhost/bws-debian-systemd:bookworm")
# The test-host image with tests/sandbox/prepare_host.yml applied, built once (scripts/build-prepared-image.sh); its
# hosts carry the stamp PREPARED_STAMP, the digest of what the playbook puts there (sandbox_prepared_hash).
PREPARED_IMAGE = os.environ.get("BWS_PREPARED_IMAGE", "localhost/bws-debian-systemd:prepared")
PREPARED_STAMP = "/etc/bws-sandbox-prepared"
# The test hosts' connection (tests/plugins/connection/podman_nsenter.py): the container's namespaces entered with
# nsenter, a few milliseconds a command where `podman exec` costs a tenth of a second of CPU.
CONNECTION = "podman_nsenter"
CONNECTION_PLUGINS = str(REPO / "tests" / "plugins" / "connection")
# Every ansible run of the host tests finds it, whichever way it starts: ansible-runner, scripts/ci_playbook.py
# (which passes ANSIBLE_* on) or ansible-playbook itself.
os.environ["ANSIBLE_CONNECTION_PLUGINS"] = os.pathsep.join(
    [CONNECTION_PLUGINS, *filter(None, os.environ.get("ANSIBLE_CONNECTION_PLUGINS", "").split(os.pathsep))])


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


def prepared_digest() -> str:
    """The digest a host prepared from this checkout's test doubles carries (scripts/lib.sh)."""
    return subprocess.run(["bash", "-c", "source scripts/lib.sh && sandbox_prepared_hash"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.strip()


def podman_available() -> bool:
    return shutil.which("podman") is not None and podman("image", "exists", IMAGE, check=False).returncode == 0


class EngineHost:
    """A systemd container (or several) plus an inventory directory that extends the sandbox inventory."""

    def __init__(self, name: str, workdir: Path, fleet: list[str] | None = None,
                 groups: dict[str, list[str]] | None = None, volumes: list[str] | None = None, *,
                 caps: list[str] | None = None, shm_size: str = "") -> None:
        self.name = name
        self.shm_size = shm_size  # the hosts' /dev/shm (boot-test-host.sh --shm-size); "" = podman's 64m
        self.volumes = volumes or []  # podman bind mounts, SRC:DEST[:OPTIONS]
        self.caps = caps or []  # capabilities besides SYS_ADMIN (scripts/boot-test-host.sh --cap-add)
        self.fleet = fleet or [name]
        self.groups = groups or {}
        self.workdir = workdir
        self.inventory = workdir / "inventory"

    def on(self, name: str) -> EngineHost:
        """The same inventory, looking at another container of the fleet."""
        other = EngineHost(name, self.workdir, self.fleet, self.groups, self.volumes, caps=self.caps,
                           shm_size=self.shm_size)
        return other

    def boot(self, image: str = IMAGE) -> None:
        """scripts/boot-test-host.sh: the project's one way to boot a test host."""
        mounts = [argument for volume in self.volumes for argument in ("--volume", volume)]
        caps = [argument for cap in self.caps for argument in ("--cap-add", cap)]
        shm = ["--shm-size", self.shm_size] if self.shm_size else []
        booted = subprocess.run(["bash", str(REPO / "scripts" / "boot-test-host.sh"), "--label", "owner=bws-test",
                                 "--image", image, *mounts, *caps, *shm, *self.fleet],
                                capture_output=True, text=True, check=False)
        if booted.returncode != 0:
            raise RuntimeError(f"{self.fleet} did not boot: {booted.stderr.strip()}")

    def boot_prepared(self) -> None:
        """Boot from the prepared image (scripts/build-prepared-image.sh, built beforehand by the test command) and
        check each host's stamp: a host from an image of other test doubles is prepared by the playbook here."""
        subprocess.run(["bash", str(REPO / "scripts" / "build-prepared-image.sh")], capture_output=True, text=True,
                       check=True)
        self.boot(PREPARED_IMAGE)
        digest = prepared_digest()
        stale = [name for name in self.fleet
                 if podman("exec", name, "cat", PREPARED_STAMP, check=False).stdout.strip() != digest]
        if stale:
            prepared = self.run_playbook("tests/sandbox/prepare_host.yml", limit=",".join(stale))
            assert prepared.status == "successful", prepared.stdout[-2000:]

    def destroy(self) -> None:
        podman("rm", "-f", "--ignore", "-t", "0", *self.fleet, check=False)

    def write_inventory(self, extra_vars: dict, host_vars: dict[str, dict] | None = None) -> None:
        group_vars = self.inventory / "group_vars" / "all"
        group_vars.mkdir(parents=True, exist_ok=True)
        for source in (REPO / "inventory" / "sandbox" / "group_vars" / "all").glob("*.yml"):
            shutil.copy(source, group_vars / source.name)
        (group_vars / "zz_test.yml").write_text(yaml.safe_dump(extra_vars))
        children = {"gpu_servers": {"hosts": {
            name: {"ansible_connection": CONNECTION, **(host_vars or {}).get(name, {})}
            for name in self.fleet}}}
        children.update({group: {"hosts": {name: {} for name in members}} for group, members in self.groups.items()})
        (self.inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": children}}))

    def run_playbook(self, playbook: str, extravars: dict | None = None, check: bool = False,
                     limit: str | None = None, *, tags: str | None = None,
                     skip_tags: str | None = None) -> PlaybookRun:
        return run_playbook(playbook, self.inventory, extravars=extravars, check=check, diff=check, limit=limit,
                            tags=tags, skip_tags=skip_tags, workdir=self.workdir)

    def sh(self, command: str, check: bool = True) -> str:
        return podman("exec", self.name, "sh", "-c", command, check=check).stdout.strip()

    def unit(self, unit: str) -> dict[str, str]:
        out = self.sh(f"systemctl show {unit} -p ActiveState -p UnitFileState -p MainPID -p SubState")
        return dict(line.split("=", 1) for line in out.splitlines())

    def health(self, port: int = 30000) -> int | None:
        code = self.sh(
            'python3 -c "import urllib.request as u; '
            f"print(u.urlopen('http://127.0.0.1:{port}/health', timeout=5).status)\"",
            check=False,
        )
        return int(code) if code.isdigit() else None

    def state(self) -> dict:
        return json.loads(self.sh("cat /var/lib/llm-serving/state.json"))
