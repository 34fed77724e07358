#!/usr/bin/python
# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: SIGTERM an engine unit's main process and wait a bounded time for it to end by itself."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_drain
short_description: Send SIGTERM to an engine unit's main process and wait a bounded time for it to end by itself
description:
  - The engine-neutral half of a drain. An engine that drains its in-flight requests on SIGTERM without a limit of its
    own (SGLang 0.5.23, C(tokenizer_manager.py sigterm_watchdog)) would turn every C(systemctl stop) into a wait for
    C(TimeoutStopSec=) and a SIGKILL. This module sends SIGTERM to the unit's main process and waits up to
    O(timeout_s) for the unit to end. When it has not, RV(still_active) says so and the engine's own drain entry
    point (its role's C(tasks/drain.yml), named by the engine roster's C(drain)) ends what is in flight its own way;
    the caller then stops the unit as usual, C(TimeoutStopSec=) staying the last resort.
  - A unit that is not running is left alone.
version_added: "0.1.0"
author: the blackwell-llm-serving authors (!UNKNOWN)
options:
  unit:
    description: The engine unit.
    type: str
    required: true
  timeout_s:
    description: How long in-flight requests may run on after SIGTERM.
    type: int
    default: 30
notes:
  - Check mode says what it would do and does nothing.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - blackwell.serving.attributes
"""

EXAMPLES = r"""
- name: SIGTERM and at most 30 s for the requests in flight
  blackwell.serving.engine_drain:
    unit: sglang.service
    timeout_s: 30
  register: drain

- name: The engine's own abort of what is left
  ansible.builtin.debug:
    msg: "{{ drain.message }}"
  when: drain.still_active
"""

RETURN = r"""
drained:
  description: Whether the unit ended by itself within O(timeout_s).
  returned: always
  type: bool
still_active:
  description: Whether the unit was still running O(timeout_s) after SIGTERM (its requests are to be ended).
  returned: always
  type: bool
exec_start:
  description:
    - The command line of the unit's C(ExecStart=), split as systemd splits it, from the file systemd runs the unit
      from (its C(FragmentPath); the trial copy under C(/run/systemd/system.control) while a release is on trial),
      for the engine's own abort; empty when the unit is not running or its file cannot be read.
  returned: always
  type: list
  elements: str
elapsed_s:
  description: Seconds from SIGTERM until the unit ended or the bound.
  returned: always
  type: float
message:
  description: What happened, in one line.
  returned: always
  type: str
"""

import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import unit_properties
from ansible_collections.blackwell.serving.plugins.module_utils.host.unit_file import (
    exec_start_argv,
    read_text,
    service_settings,
)


def is_active(unit: str) -> bool:
    """As `systemctl is-active`: the unit is active or reloading."""
    return unit_properties(unit, ("ActiveState",)).get("ActiveState") in ("active", "reloading")


def unit_command_line(unit: str) -> list[str]:
    """The unit's ExecStart= argv, from the file systemd loaded it from."""
    path = unit_properties(unit, ("FragmentPath",)).get("FragmentPath") or ""
    text = read_text(path) if path else None
    return exec_start_argv(service_settings(text)) if text else []


def wait_until_inactive(unit: str, bound_s: float) -> float | None:
    """Seconds until the unit ended, None when it still runs at the bound."""
    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        if not is_active(unit):
            return round(elapsed, 2)
        if elapsed >= bound_s:
            return None
        time.sleep(0.2)


def main() -> None:
    module = AnsibleModule(
        argument_spec={"unit": {"type": "str", "required": True}, "timeout_s": {"type": "int", "default": 30}},
        supports_check_mode=True,
    )
    unit, bound = module.params["unit"], module.params["timeout_s"]
    result = {"changed": False, "drained": False, "still_active": False, "elapsed_s": 0.0, "exec_start": []}
    if not is_active(unit):
        module.exit_json(**result, message=f"{unit} is not running")
    result["exec_start"] = unit_command_line(unit)
    if module.check_mode:
        module.exit_json(**{**result, "changed": True},
                         message=f"would send SIGTERM to {unit} and give its requests {bound} s")
    subprocess.run(["systemctl", "kill", "--kill-whom=main", "--signal=SIGTERM", unit], check=False,
                   capture_output=True)
    elapsed = wait_until_inactive(unit, bound)
    if elapsed is not None:
        module.exit_json(**{**result, "changed": True, "drained": True, "elapsed_s": elapsed},
                         message=f"{unit} drained and ended {elapsed} s after SIGTERM")
    module.exit_json(**{**result, "changed": True, "still_active": True, "elapsed_s": float(bound)},
                     message=f"{unit} still had requests in flight {bound} s after SIGTERM "
                             "(engine_service_drain_timeout_s)")


if __name__ == "__main__":
    main()
