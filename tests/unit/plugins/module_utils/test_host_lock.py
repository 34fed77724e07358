"""plugins/module_utils/host/lock.py: one release of a host's engines at a time (gpu_release takes it)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from tests.module_utils_loader import use_repository_module_utils

use_repository_module_utils()
from ansible_collections.blackwell.serving.plugins.module_utils.host.lock import (  # noqa: E402
    HostLockError,
    host_lock,
)


class FakeTime:
    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds


def hold(path: Path) -> int:
    """Another holder: an open file with the flock taken and its pid written, as host_lock writes it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, b"4242\n", 0)
    return fd


def test_a_second_release_waits_its_timeout_then_fails_naming_the_lock_and_its_holder(tmp_path: Path) -> None:
    lock, fake = tmp_path / "release.lock", FakeTime()
    holder = hold(lock)
    ran = []
    with pytest.raises(HostLockError) as refused, \
            host_lock(str(lock), 2.0, "gpu_release", clock=fake.clock, sleep=fake.sleep, poll_s=0.5):
        ran.append(True)
    assert ran == [] and fake.sleeps == 4, "it polled until its deadline and never entered the block"
    assert str(refused.value) == (
        f"gpu_release: another release of this host's engines (a teardown, or a deploy's switch) holds {lock} "
        "(pid 4242) and did not end within 2 s; nothing was changed. Run again once it has ended.")
    os.close(holder)
    with host_lock(str(lock), 0, "gpu_release", clock=fake.clock, sleep=fake.sleep):
        ran.append(True)
        assert lock.read_text() == f"{os.getpid()}\n"
    assert ran == [True]


def test_the_lock_is_released_when_the_block_ends_even_by_an_error(tmp_path: Path) -> None:
    lock = tmp_path / "release.lock"
    with pytest.raises(RuntimeError), host_lock(str(lock), 0, "x"):
        raise RuntimeError("boom")
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again: no BlockingIOError
    os.close(fd)


def test_a_link_in_place_of_the_lock_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (tmp_path / "release.lock").symlink_to(victim)
    with pytest.raises(HostLockError, match="is a symbolic link; remove it"), \
            host_lock(str(tmp_path / "release.lock"), 0, "x"):
        pass
    assert victim.read_text() == "keep me\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another user needs root")
def test_a_lock_file_another_user_made_is_refused(tmp_path: Path) -> None:
    lock = tmp_path / "release.lock"
    lock.write_text("")
    os.chown(lock, 65534, 65534)
    with pytest.raises(HostLockError, match=r"belongs to another user \(uid 65534\); remove it"), \
            host_lock(str(lock), 0, "x"):
        pass
