#!/usr/bin/python
# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: whether a deploy would change nothing on this host (one round trip), and the stamp that says so."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_noop
short_description: Prove in one call that a re-run deploy has nothing to do, or record what a finished deploy left
description:
  - With O(action=check) (the deploy's first call on the host, after the input checks), compares the host with the
    stamp the last finished deploy left (C(deployed.json) in O(state_dir)) - the digest of the deploy's inputs
    (O(fingerprint), lookup C(blackwell.serving.deploy_fingerprint)), the release it left serving and the SHA-256 of
    every file that release serves from - and reads what runs - the unit is active, no copy of it runs on trial,
    only O(boot_unit) is enabled of O(units) and it, and the release's C(/health) answers 200. RV(noop) is true only
    when all of that holds; RV(drift) says what does not.
  - With O(action=record) (the deploy's last step, once its release serves), writes the stamp for the release
    C(state.json) names; it changes nothing when the stamp already says the same.
  - A file changed inside the release's venv without its C(python-env.json) stamp changing is not seen.
options:
  action:
    description: Compare with the stamp, or write it.
    type: str
    choices: [check, record]
    default: check
  state_dir:
    description: Where C(state.json), the releases and the stamp live.
    type: path
    default: /var/lib/llm-serving
  fingerprint:
    description: The digest of the deploy's inputs, made on the controller.
    type: str
    required: true
  units:
    description: Every engine unit; none of them may be enabled.
    type: list
    elements: str
    required: true
  boot_unit:
    description: The unit that starts the release C(state.json) names at boot; it must be enabled.
    type: str
    default: llm-serving-boot.service
  unit_dir:
    description: Where the committed unit files live.
    type: path
    default: /etc/systemd/system
  trial_unit_dir:
    description: Where a release on trial runs its unit from.
    type: path
    default: /run/systemd/system.control
  boot_files:
    description: The boot unit's files (its unit file and program), stamped with the release (O(action=record)).
    type: list
    elements: path
    default: []
  paths:
    description: Further files the release depends on, stamped with it (O(action=record)).
    type: list
    elements: path
    default: []
  health_timeout_s:
    description: Seconds the C(/health) request may take (O(action=check)).
    type: float
    default: 3
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - blackwell.serving.attributes
notes:
  - Standard library only. Run it as root (become); the stamp is root's, 0600 (the digest covers the inventory's keys).
author: the blackwell-llm-serving authors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Whether this deploy has anything to do
  blackwell.serving.engine_noop:
    fingerprint: "{{ __sglang_fingerprint }}"
    units: [sglang.service, vllm.service]
  register: noop

- name: Record what the deploy left serving
  blackwell.serving.engine_noop:
    action: record
    fingerprint: "{{ __sglang_fingerprint }}"
    units: [sglang.service, vllm.service]
    boot_files: [/etc/systemd/system/llm-serving-boot.service, /usr/local/libexec/llm-serving/engine_boot.py]
    paths: [/var/lib/sglang/admin-api-key]
"""

RETURN = r"""
noop:
  description: Whether the host serves exactly what this deploy would make, healthy (O(action=check)).
  type: bool
  returned: always
drift:
  description: What differs, each as a sentence (O(action=check)); empty when RV(noop) is true.
  type: list
  elements: str
  returned: always
release_id:
  description: The release the stamp names, or null.
  type: str
  returned: always
health_ms:
  description: How long C(/health) took to answer, when it was asked.
  type: int
  returned: always
"""

import os
import threading

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import (
    ENABLED_STATES,
    SystemdError,
    show_units,
    systemctl_here,
)
from ansible_collections.blackwell.serving.plugins.module_utils.release.files import (
    Wanted,
    ensure_file,
)
from ansible_collections.blackwell.serving.plugins.module_utils.release.noop import (
    STAMP_FILE,
    make_stamp,
    stamp_drift,
    stamp_text,
)
from ansible_collections.blackwell.serving.plugins.module_utils.release.status import probe_health


def runtime_drift(module: AnsibleModule, stamp: dict) -> list[str]:
    """What runs: the unit active and not on trial, only the boot unit enabled."""
    params, unit = module.params, stamp.get("unit")
    drift: list[str] = []
    if os.path.exists(os.path.join(params["trial_unit_dir"], str(unit))):
        drift.append(f"{unit} runs on trial ({params['trial_unit_dir']})")
    systemctl = systemctl_here()
    if systemctl is None:
        return [*drift, "systemd does not run here"]
    names = list(dict.fromkeys([*params["units"], str(unit), params["boot_unit"]]))
    try:
        shown = show_units(names, ("ActiveState", "UnitFileState"), systemctl=systemctl, run=module.run_command)
    except SystemdError as exc:
        return [*drift, f"systemd could not be read: {exc}"]
    if shown.get(unit, {}).get("ActiveState") != "active":
        drift.append(f"{unit} is {shown.get(unit, {}).get('ActiveState') or 'unknown'}, not active")
    if shown.get(params["boot_unit"], {}).get("UnitFileState") not in ENABLED_STATES:
        drift.append(f"{params['boot_unit']} is not enabled")
    return drift + [f"{name} is enabled" for name in params["units"]
                    if shown.get(name, {}).get("UnitFileState") in ENABLED_STATES]


def check(module: AnsibleModule) -> dict:
    stamp, drift = stamp_drift(module.params["state_dir"], module.params["fingerprint"])
    if stamp is None or drift:
        return {"changed": False, "noop": False, "drift": drift, "release_id": stamp.get("release") if stamp else None,
                "health_ms": None}
    # SGLang's /health runs a generation and looks for it after a second: asked first, beside the other reads.
    health: dict = {}
    asking = threading.Thread(target=lambda: health.update(
        probe_health(stamp.get("health_url"), module.params["health_timeout_s"])), daemon=True)
    asking.start()
    drift = runtime_drift(module, stamp)
    asking.join()
    if health.get("status") != 200:
        answer = f"answered {health['status']}" if health.get("status") else health.get("error") or "no answer"
        drift.append(f"the release's health URL ({health.get('url')}) {answer}")
    return {"changed": False, "noop": not drift, "drift": drift, "release_id": stamp.get("release"),
            "health_ms": health.get("latency_ms")}


def record(module: AnsibleModule) -> dict:
    params = module.params
    try:
        stamp = make_stamp(params["state_dir"], params["fingerprint"], params["unit_dir"], params["boot_files"],
                           params["paths"])
    except ValueError as exc:
        module.fail_json(msg=f"cannot record the deploy: {exc}")
    path = os.path.join(params["state_dir"], STAMP_FILE)
    want = Wanted(path=path, owner="root", group="root", mode=0o600, content=stamp_text(stamp).encode(), secret=True)
    changed, _ = ensure_file(want, check_mode=module.check_mode)
    return {"changed": changed, "noop": False, "drift": [], "release_id": stamp["release"], "health_ms": None}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "choices": ["check", "record"], "default": "check"},
            "state_dir": {"type": "path", "default": "/var/lib/llm-serving"},
            "fingerprint": {"type": "str", "required": True, "no_log": True},
            "units": {"type": "list", "elements": "str", "required": True},
            "boot_unit": {"type": "str", "default": "llm-serving-boot.service"},
            "unit_dir": {"type": "path", "default": "/etc/systemd/system"},
            "trial_unit_dir": {"type": "path", "default": "/run/systemd/system.control"},
            "boot_files": {"type": "list", "elements": "path", "default": []},
            "paths": {"type": "list", "elements": "path", "default": []},
            "health_timeout_s": {"type": "float", "default": 3},
        },
        supports_check_mode=True,
    )
    module.exit_json(**(check(module) if module.params["action"] == "check" else record(module)))


if __name__ == "__main__":
    main()
