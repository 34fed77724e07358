#!/usr/bin/python
"""Ansible module: is a model directory complete? Read-only, no network."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_check
short_description: Check that a model directory is complete, without the network
description:
  - Checks that C(config.json) and every shard named in C(model.safetensors.index.json) are present with the
    right size, and that no file is only partly downloaded.
  - Expected sizes come from C(.model_store/manifest.json) when the model store fetched the directory (every
    file it listed is then checked), else from each safetensors shard's own header (8 + header length + end of
    the last tensor's data), so a truncated shard is found in any directory.
  - Never changes anything. Usable by any preflight.
options:
  path:
    description: Model directory.
    type: path
    required: true
  require_index:
    description: Fail the check when C(model.safetensors.index.json) is absent (sharded models have one).
    type: bool
    default: false
  fail_on_incomplete:
    description:
      - Fail the task when the directory is incomplete; C(msg) names the first problem and what to do.
    type: bool
    default: false
notes:
  - Supports check mode. Standard library only.
author: the blackwell-llm-serving authors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Preflight - the model must be complete before the running engine is touched
  model_check:
    path: /srv/models/moonshotai/Kimi-K2.5
    require_index: true
    fail_on_incomplete: true

- name: Look, decide later
  model_check:
    path: /srv/models/AQ-MedAI/Kimi-K25-eagle3
  register: drafter_check
"""

RETURN = r"""
complete:
  description: True when nothing is missing, short, partial or unreadable.
  type: bool
  returned: always
problems:
  description: >-
    One entry per problem, first one first: file (relative path), reason (missing, partial, short,
    too_long, unreadable, incomplete), expected_bytes and actual_bytes (null when unknown or absent).
  type: list
  elements: dict
  returned: always
total_bytes:
  description: Bytes of the files found complete.
  type: int
  returned: always
files_checked:
  description: Number of files checked.
  type: int
  returned: always
msg:
  description: The first missing or short file and what to do, or a one-line summary when complete.
  type: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.model.store import check_model_dir


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "require_index": {"type": "bool", "default": False},
            "fail_on_incomplete": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    result = check_model_dir(module.params["path"], require_index=module.params["require_index"])
    if module.params["fail_on_incomplete"] and not result["complete"]:
        module.fail_json(changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
