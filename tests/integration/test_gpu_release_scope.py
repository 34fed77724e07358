"""teardown.yml's scope on real cgroups and a real podman container: what is ours is released, the rest is named.

A podman container's processes are visible only from the host's PID namespace, so this test runs the module
there (not in a private PID namespace, unlike every other signalling test). To be sure it can reach only
what this test started:

* the engine patterns are a marker unique to this run (``bwst<hex>::*``), the managed unit is a name unique to
  this run, and the stand-in GPU device directory and /dev/shm are the test's own, so nothing else on the
  machine can be a target;
* every real run is preceded by a --check run whose would-signal list must be exactly the expected PIDs.

Cgroups are real: the test creates its own ``bwst<hex>.slice`` below the cgroup v2 root, with a system-level
unit cgroup, a user session scope and a user's own service manager (whose unit carries the managed unit's
name), and moves processes there through ``cgroup.procs``.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from gpu_helpers import alive, release_result, run_playbook

from tests.integration.engine_host import IMAGE, podman, podman_available

pytestmark = [
    pytest.mark.container,
    pytest.mark.skipif(not podman_available(), reason="needs podman and the test-host image (scripts/build-image.sh)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create cgroups and run processes as other users"),
]

DAEMON, NOBODY = 1, 65534  # the engine service user of this test, and a user that is not one
CONTAINER = "bws-it-release-scope"
PYTHON = "/usr/bin/python3"
SLEEP = "import time; time.sleep(600)"


def cgroup2_root() -> Path:
    for candidate in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (candidate / "cgroup.procs").exists() and (candidate / "cgroup.controllers").exists():
            return candidate
    pytest.skip("no cgroup v2 hierarchy mounted")


class World:
    """The test's own processes, cgroups and container; stop() ends and removes all of them."""

    def __init__(self, tmp: Path) -> None:
        self.tag = "bwst" + uuid.uuid4().hex[:10]
        self.unit = f"{self.tag}-sglang.service"
        self.root = cgroup2_root()
        self.slice = self.root / f"{self.tag}.slice"
        self.procs: list[subprocess.Popen] = []
        self.cgroups: list[Path] = []
        self.tmp = tmp
        for name in ("dev", "shm"):
            (tmp / name).mkdir()

    def cgroup(self, rel: str) -> Path:
        path = self.slice / rel
        path.mkdir(parents=True, exist_ok=True)
        for parent in [path, *path.parents]:
            if parent == self.root:
                break
            if parent not in self.cgroups:
                self.cgroups.append(parent)
        return path

    def start(self, title: str, uid: int, cgroup: str) -> int:
        """A process titled ``title`` running as ``uid``, moved into ``cgroup`` (relative to the test's slice)."""
        proc = subprocess.Popen([title, "-c", SLEEP], executable=PYTHON, user=uid, cwd="/")
        self.procs.append(proc)
        (self.cgroup(cgroup) / "cgroup.procs").write_text(str(proc.pid))
        return proc.pid

    def start_in_container(self, title: str) -> int:
        code = f"import os; os.execv({PYTHON!r}, [{title!r}, '-c', {SLEEP!r}])"
        podman("run", "-d", "--rm", "--replace", "--name", CONTAINER, "--user", str(DAEMON), "--label",
               "owner=bws-test", IMAGE, PYTHON, "-c", code)  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for name in os.listdir("/proc"):
                try:
                    with open(f"/proc/{name}/cmdline", "rb") as f:
                        if f.read().split(b"\0")[0].decode() == title:
                            return int(name)
                except (OSError, ValueError):
                    continue
            time.sleep(0.1)
        raise AssertionError(f"the container's process {title} never showed up")

    def extravars(self, **more) -> dict:
        return {
            "engine_units": [self.unit],
            "gpu_release_patterns": [f"{self.tag}::*"],
            "gpu_release_service_users": ["daemon"],
            "gpu_release_nvidia_smi": str(self.tmp / "no-nvidia-smi"),
            "gpu_release_driver_proc_dir": str(self.tmp / "no-driver"),
            "gpu_release_dev_dir": str(self.tmp / "dev"),
            "gpu_release_shm_dir": str(self.tmp / "shm"),
            "gpu_release_grace_s": 1,
            "teardown_confirm": "yes",  # nobody is at ansible-runner's terminal: teardown.yml refuses unless told
            **more,
        }

    def stop(self) -> None:
        podman("rm", "-f", "--ignore", "-t", "0", CONTAINER, check=False)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for path in sorted(self.cgroups, key=lambda p: len(p.parts), reverse=True):
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)  # the last process is still leaving the cgroup


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    w.stop()


def teardown(world: World, tmp: Path, expected_targets: set[int], **more) -> tuple[dict, list[str]]:
    """--check first (it must want to signal exactly ``expected_targets``), then the real teardown."""
    runner, results = run_playbook(tmp, world.extravars(**more), check=True)
    assert runner.rc == 0, runner.stdout[-3000:]
    assert set(release_result(results)["signalled"]["TERM"]) == expected_targets, release_result(results)["summary"]
    runner, results = run_playbook(tmp, world.extravars(**more))
    assert runner.rc == 0, runner.stdout[-3000:]
    return release_result(results), results["Teardown | summary"]["msg"]


def named_foreign(res: dict, summary: list[str], pid: int, reason: str) -> None:
    entry = next((f for f in res["foreign"] if f["pid"] == pid), None)
    assert entry is not None and reason in entry["reason"], (pid, res["foreign"])
    assert any(line.startswith(f"foreign, not signalled: {pid} ") and reason in line for line in summary), summary


def test_default_scope_releases_only_our_engines_and_host_scope_never_enters_containers(world, tmp_path):
    title = f"{world.tag}::scheduler_TP0"
    unit_engine = world.start(title, DAEMON, world.unit)
    unit_worker = world.start("python3", NOBODY, f"{world.unit}/worker")  # any member of the unit's cgroup is ours
    stray = world.start(title, DAEMON, "system.slice/stray.service")  # an engine of the service user
    session = world.start(title, DAEMON, "user.slice/user-1000.slice/session-9.scope")
    stranger = world.start(title, NOBODY, "system.slice/other.service")
    user_unit = world.start(title, DAEMON, f"user.slice/user-1000.slice/user@1000.service/app.slice/{world.unit}")
    in_container = world.start_in_container(f"{world.tag}::container")
    spared = [session, stranger, user_unit, in_container]

    res, summary = teardown(world, tmp_path, {unit_engine, unit_worker, stray})
    assert res["scope"] == "default" and summary[1].startswith("scope default: targets are ")
    assert not any(alive(p) for p in (unit_engine, unit_worker, stray))
    assert all(alive(p) for p in spared), [p for p in spared if not alive(p)]
    reasons = {t["pid"]: t["reason"] for t in res["targets"]}
    assert reasons[unit_worker] == f"member of {world.unit} cgroup"
    assert reasons[stray] == f"matches engine pattern '{world.tag}::*'"
    named_foreign(res, summary, session, "in a user session (/")
    named_foreign(res, summary, stranger, "runs as nobody (uid 65534), not an engine service user (daemon)")
    named_foreign(res, summary, user_unit, "in a user session (/")
    named_foreign(res, summary, in_container, "in another PID namespace")

    res, summary = teardown(world, tmp_path, {session, stranger, user_unit}, gpu_release_scope="host")
    assert res["scope"] == "host" and summary[1].startswith("scope host: targets are ")
    assert not any(alive(p) for p in (session, stranger, user_unit))
    assert alive(in_container)
    named_foreign(res, summary, in_container, "in another PID namespace")
