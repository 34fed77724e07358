#!/usr/bin/python
"""Ansible module: a file written (or removed) so that a power cut leaves the old or the new one, never neither."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: durable_file
short_description: Write or remove a small file atomically, synced to disk with its directory
description:
  - Writes I(content) (or the bytes of the host file I(src)) to I(dest) the way a power cut cannot half-do - a
    temporary file beside I(dest), written and C(fsync)ed, renamed over I(dest), then the directory C(fsync)ed so the
    rename itself is on disk. C(ansible.builtin.copy) renames too but syncs neither, so after a crash the file can
    be empty or the rename lost.
  - With I(state=absent) it removes I(dest) and syncs the directory.
  - Used for what a host boots from - C(state.json) and the engine unit in C(/etc/systemd/system) - so a reboot in
    the middle of a deploy finds the last release that served (roles/engine_service).
  - Nothing changes when I(dest) already holds the content with the owner and mode asked for.
options:
  dest:
    description: The file to write or remove.
    type: path
    required: true
  content:
    description: What the file holds. One of I(content) and I(src) when I(state=present).
    type: str
  src:
    description: A file on the host whose bytes I(dest) gets.
    type: path
  state:
    description: Whether the file exists.
    type: str
    choices: [present, absent]
    default: present
  owner:
    description: Owner of I(dest).
    type: str
    default: root
  group:
    description: Group of I(dest).
    type: str
    default: root
  mode:
    description: Permissions of I(dest), octal.
    type: str
    default: "0644"
notes:
  - Supports check mode and diff mode. Standard library only.
author: the blackwell-llm-serving authors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Record the release as serving
  durable_file:
    dest: /var/lib/llm-serving/state.json
    content: "{{ state | to_nice_json }}\n"

- name: The unit the host boots into
  durable_file:
    src: /var/lib/llm-serving/releases/0123abcd/sglang.service
    dest: /etc/systemd/system/sglang.service
"""

RETURN = r"""
dest:
  description: The file.
  type: str
  returned: always
existed:
  description: Whether I(dest) existed before.
  type: bool
  returned: always
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.release.files import (
    ReleaseFilesError,
    Wanted,
    ensure_file,
    fsync_directory,
    parse_mode,
    read_bytes,
)


def remove_durably(dest: str) -> None:
    os.unlink(dest)
    fsync_directory(os.path.dirname(dest) or ".")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "content": {"type": "str", "no_log": False},
            "src": {"type": "path"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
            "mode": {"type": "str", "default": "0644"},
        },
        mutually_exclusive=[("content", "src")],
        required_if=[("state", "present", ("content", "src"), True)],
        supports_check_mode=True,
    )
    params = module.params
    dest = params["dest"]
    result = {"dest": dest, "existed": False, "changed": False}
    diff = None
    try:
        before = read_bytes(dest)
        result["existed"] = before is not None
        if params["state"] == "absent":
            result["changed"] = before is not None
            if result["changed"] and not module.check_mode:
                remove_durably(dest)
            diff = {"before_header": dest, "after_header": f"{dest} (absent)",
                    "before": (before or b"").decode(errors="replace"), "after": ""}
        else:
            content = params["content"].encode() if params["src"] is None else read_bytes(params["src"])
            if content is None:
                module.fail_json(msg=f"src {params['src']} does not exist on the host; {dest} was left as it was",
                                 **result)
            want = Wanted(dest, params["owner"], params["group"], parse_mode(params["mode"]), content=content)
            # ensure_file writes a synced temporary file and renames it; the directory is synced after the rename.
            result["changed"], diff = ensure_file(want, module.check_mode)
    except (ReleaseFilesError, OSError) as exc:
        module.fail_json(msg=f"{dest}: {exc}", **result)
    if module._diff and diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
