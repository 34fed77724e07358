"""Secrets a host makes for itself and keeps: random bytes in a file only root can read, written once.

Used for the salt of the release ids (plugins/modules/release_id.py) and SGLang's admin key
(plugins/modules/host_secret.py).
Standard library only: it runs on the target.
"""

from __future__ import annotations

import os
import secrets
import stat


class HostSecretError(Exception):
    """The file exists but cannot be trusted."""


def read_host_secret(path: str, size: int) -> bytes | None:
    """The secret, or None when the file does not exist. Only a root-owned regular file no one else can read,
    of exactly `size` bytes."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o077:
        raise HostSecretError(f"{path} must be a regular file of root's that no one else can read "
                              f"(mode {stat.filemode(info.st_mode)}, owner uid {info.st_uid}); "
                              "remove it to start a new one")
    with open(path, "rb") as handle:
        secret = handle.read()
    if len(secret) != size:
        raise HostSecretError(f"{path} holds {len(secret)} bytes, not {size}; remove it to start a new one")
    return secret


def write_host_secret(path: str, secret: bytes) -> None:
    """Atomically, synced: after a power cut the file is either absent or whole. Root 0600; its directory is
    created root 0755 when missing."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    temporary = f"{path}.tmp-{os.getpid()}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(descriptor, secret)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.rename(temporary, path)
    directory_descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_descriptor)
    finally:
        os.close(directory_descriptor)


def ensure_host_secret(path: str, size: int, check_mode: bool) -> tuple[bytes, bool]:
    """The secret in `path` and whether it was created now: made (`size` random bytes) and written when the file
    does not exist; in check mode made but not written. Raises HostSecretError or OSError, whose messages name
    the file."""
    secret = read_host_secret(path, size)
    if secret is not None:
        return secret, False
    secret = secrets.token_bytes(size)
    if not check_mode:
        try:
            write_host_secret(path, secret)
        except OSError as exc:
            raise HostSecretError(f"cannot write {path}: {exc}") from exc
    return secret, True
