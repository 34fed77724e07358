#!/usr/bin/python
"""Ansible module: a secret the host makes once and keeps in a file only root can read."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_secret
short_description: Create once, then read, a random secret kept on the host
description:
  - Returns the secret kept in I(path), creating it first when the file does not exist - 32 random bytes from
    the operating system, written atomically and synced (root, 0600; its directory root 0755 when missing), so
    every later run reads the same value and a reboot keeps it.
  - The secret is returned as URL-safe base64 without padding (43 characters), fit for an HTTP bearer token. The
    task that calls this module must set C(no_log); the value is for the host's own files (SGLang's
    C(admin_api_key) in its root-only config file), never for anything the controller keeps.
  - A file that is not a root-owned regular file no one else can read, or that does not hold 32 bytes, is refused
    (remove it to start a new secret).
options:
  path:
    description: The file that keeps the secret.
    type: path
    required: true
notes:
  - Supports check mode. On a host without the file, check mode reports it as to be created and returns a secret
    it does not keep. Standard library only.
author: the blackwell-llm-serving authors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: SGLang's admin key, made on the host the first time
  host_secret:
    path: /var/lib/llm-serving/sglang-admin-api-key
  register: admin_key
  no_log: true
"""

RETURN = r"""
secret:
  description: The secret, URL-safe base64 without padding.
  type: str
  returned: success
created:
  description: Whether this run created the file (would create it, in check mode).
  type: bool
  returned: success
"""

import base64

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.secrets.host_secret import (
    HostSecretError,
    ensure_host_secret,
)

SECRET_BYTES = 32


def as_token(secret: bytes) -> str:
    return base64.urlsafe_b64encode(secret).decode("ascii").rstrip("=")


def main() -> None:
    module = AnsibleModule(argument_spec={"path": {"type": "path", "required": True}}, supports_check_mode=True)
    path = module.params["path"]
    try:
        secret, created = ensure_host_secret(path, SECRET_BYTES, module.check_mode)
    except (HostSecretError, OSError) as exc:
        module.fail_json(msg=f"host secret: {exc}")
    module.exit_json(changed=created, created=created, secret=as_token(secret))


if __name__ == "__main__":
    main()
