#!/usr/bin/python
"""Ansible module: a release id that reveals nothing about what went into it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_id
short_description: Derive a release id keyed by a secret salt kept on the host
description:
  - A release's id names its directory, which every local user can list. An unsalted hash of the release's
    content (its unit and files, the API key's file included) would let anyone who knows the rest of the content
    test guesses of the key against it. The id is instead C(<name>-) and the first 12 hex digits of
    HMAC-SHA256(salt, I(digest)), the salt being 32 random bytes created once per host in I(salt_file) (root,
    0600, written atomically and synced, so a reboot keeps it). Same content, same host, same id.
  - I(digest) is the sha256 of the release's content, computed on the controller and kept out of every log (a
    no_log parameter); the salt never leaves the host.
options:
  name:
    description: The release's prefix (the engine unit's name).
    type: str
    required: true
  digest:
    description: sha256 hex digest of the release's content.
    type: str
    required: true
  salt_file:
    description: Where the host keeps its salt; created (and its directory, root 0755) when missing.
    type: path
    required: true
notes:
  - Supports check mode. On a host without a salt yet, check mode reports the salt as to be created and derives
    the id from a salt it does not keep (every release is new on such a host anyway). Standard library only.
author: Blackwell serving maintainers
"""

EXAMPLES = r"""
- name: Release | derive the release id
  release_id:
    name: sglang
    digest: "{{ release_material | hash('sha256') }}"
    salt_file: /var/lib/llm-serving/release-salt
  register: release
"""

RETURN = r"""
release_id:
  description: C(<name>-<12 hex digits>).
  type: str
  returned: success
salt_created:
  description: Whether this run created the host's salt (would create it, in check mode).
  type: bool
  returned: success
"""

import hashlib
import hmac
import os
import re
import secrets
import stat

from ansible.module_utils.basic import AnsibleModule

SALT_BYTES = 32


class SaltError(Exception):
    """The salt file exists but cannot be trusted."""


def read_salt(path: str) -> bytes | None:
    """The salt, or None when the file does not exist. Only a root-owned regular file no one else can read."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o077:
        raise SaltError(f"{path} must be a regular file of root's that no one else can read "
                        f"(mode {stat.filemode(info.st_mode)}, owner uid {info.st_uid}); remove it to start a new one")
    with open(path, "rb") as handle:
        salt = handle.read()
    if len(salt) != SALT_BYTES:
        raise SaltError(f"{path} holds {len(salt)} bytes, not {SALT_BYTES}; remove it to start a new one")
    return salt


def write_salt(path: str, salt: bytes) -> None:
    """Atomically, synced: after a power cut the file is either absent or whole."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    temporary = f"{path}.tmp-{os.getpid()}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(descriptor, salt)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.rename(temporary, path)
    directory_descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_descriptor)
    finally:
        os.close(directory_descriptor)


def release_id(name: str, salt: bytes, digest: str) -> str:
    return f"{name}-{hmac.new(salt, digest.encode('ascii'), hashlib.sha256).hexdigest()[:12]}"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            # A digest of content that holds the API key is a way to test guesses of the key: kept out of the
            # logged invocation, so not even the controller's records keep it.
            "digest": {"type": "str", "required": True, "no_log": True},
            "salt_file": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not re.fullmatch(r"[0-9a-f]{64}", p["digest"]):
        module.fail_json(msg=f"digest must be a sha256 hex digest, got {p['digest']!r}")
    try:
        salt = read_salt(p["salt_file"])
    except (SaltError, OSError) as exc:
        module.fail_json(msg=f"release salt: {exc}")
    created = salt is None
    if salt is None:
        salt = secrets.token_bytes(SALT_BYTES)
        if not module.check_mode:
            try:
                write_salt(p["salt_file"], salt)
            except OSError as exc:
                module.fail_json(msg=f"release salt: cannot write {p['salt_file']}: {exc}")
    module.exit_json(changed=created, release_id=release_id(p["name"], salt, p["digest"]), salt_created=created)


if __name__ == "__main__":
    main()
