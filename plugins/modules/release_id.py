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
author: the blackwell-llm-serving authors (!UNKNOWN)
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
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.secrets.host_secret import (
    HostSecretError,
    ensure_host_secret,
)

SALT_BYTES = 32


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
        salt, created = ensure_host_secret(p["salt_file"], SALT_BYTES, module.check_mode)
    except (HostSecretError, OSError) as exc:
        module.fail_json(msg=f"release salt: {exc}")
    module.exit_json(changed=created, release_id=release_id(p["name"], salt, p["digest"]), salt_created=created)


if __name__ == "__main__":
    main()
