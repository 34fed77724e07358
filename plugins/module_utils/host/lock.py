# SPDX-License-Identifier: Apache-2.0
"""One release of a host's engines at a time: an exclusive flock on a lock file, taken before anything is stopped.

Two teardowns of one host (or a teardown beside a deploy's switch) would otherwise both stop units, signal processes
and write state.json. The second waits for the lock up to its timeout and then fails, naming the lock and the process
that holds it, before it changes anything. The lock file lives in a directory every user may write to (/run/lock), so
it is opened without following a link and refused when another user made it. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator

__all__ = ["HostLockError", "host_lock"]


class HostLockError(Exception):
    """The lock is held past the timeout, or its file is not one this user made."""


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return f"pid {text}" if text.isdigit() else "unknown"


def _open(path: str) -> int:
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HostLockError(f"the host lock {path} is a symbolic link; remove it") from exc
        raise HostLockError(f"cannot open the host lock {path}: {exc}") from exc
    if os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise HostLockError(f"the host lock {path} belongs to another user (uid {os.stat(path).st_uid}); remove it")
    return fd


@contextlib.contextmanager
def host_lock(path: str, timeout_s: float, what: str, *, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep, poll_s: float = 0.1) -> Iterator[None]:
    """Hold the lock at `path` while the block runs; wait up to `timeout_s` for it (0: one try)."""
    fd = _open(path)
    try:
        deadline = clock() + max(timeout_s, 0.0)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if clock() >= deadline:
                    raise HostLockError(
                        f"{what}: another release of this host's engines (a teardown, or a deploy's switch) holds "
                        f"{path} ({_holder(fd)}) and did not end within {timeout_s:g} s; nothing was changed. Run "
                        "again once it has ended.") from None
                sleep(poll_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the flock
