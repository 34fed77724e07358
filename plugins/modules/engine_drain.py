#!/usr/bin/python
# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: bound an engine unit's drain before it is stopped (SGLang drains without a limit of its own)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_drain
short_description: Let a serving SGLang unit drain its requests for a bounded time, then abort what is left
description:
  - SGLang 0.5.23 drains in-flight requests on SIGTERM without a limit (managers/tokenizer_manager.py
    C(sigterm_watchdog)), so one long request turns every C(systemctl stop) into a wait for C(TimeoutStopSec=) and
    a SIGKILL. This module sends SIGTERM to the unit's main process (SGLang answers C(/health) with 503 from then on
    and finishes what is in flight), waits up to O(timeout_s) for the unit to end, and then aborts every request
    still in flight through SGLang's own C(POST /abort_request) with C(abort_all=true) (and the admin key of the
    unit's config, or its API key where it has no admin key), after which SGLang's drain ends and it shuts its
    schedulers down itself. The caller then stops the unit as usual; C(TimeoutStopSec=) stays the last resort.
  - Only units that run C(sglang serve --config FILE) are drained here (multi-node rank 0 or a single node; ranks > 0
    stop on rank 0's broadcast). vLLM 0.33.0 aborts in-flight requests on SIGTERM itself (C(--shutdown-timeout) 0);
    other units are left alone.
  - A unit that is not running is left alone.
version_added: "0.1.0"
author: the blackwell-llm-serving authors (!UNKNOWN)
options:
  unit:
    description: The engine unit.
    type: str
    required: true
  programs:
    description:
      - Programs (the basename of the unit's C(ExecStart) program) whose C(PROGRAM serve --config FILE) units drain
        this way; a unit running anything else is left to its own stop. engine_service passes the engine roster's
        C(drain_program) of every engine that has one.
    type: list
    elements: str
    required: true
  timeout_s:
    description: How long in-flight requests may run on after SIGTERM before they are aborted.
    type: int
    default: 30
  unit_dir:
    description:
      - Where the unit file is. Unset - the file systemd loaded the unit from (its C(FragmentPath)), which is the
        trial copy under C(/run/systemd/system.control) while a release is on trial.
    type: path
notes:
  - Check mode says what it would do and does nothing.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - blackwell.serving.attributes
"""

EXAMPLES = r"""
- name: Drain SGLang for at most 30 s before it is stopped
  blackwell.serving.engine_drain:
    unit: sglang.service
    programs: [sglang]
    timeout_s: 30
"""

RETURN = r"""
drained:
  description: Whether the unit ended by itself within O(timeout_s).
  returned: always
  type: bool
aborted:
  description: Whether requests still in flight at the bound were aborted.
  returned: always
  type: bool
elapsed_s:
  description: Seconds from SIGTERM until the unit ended or the abort was sent.
  returned: always
  type: float
message:
  description: What happened, in one line.
  returned: always
  type: str
"""

import json
import os
import shlex
import subprocess
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import unit_properties


def exec_start_argv(unit_text: str) -> list[str]:
    """The argv of the unit's ExecStart= (systemd quoting as roles/engine_service writes it: %% and $$ escaped)."""
    for raw in unit_text.splitlines():
        line = raw.strip()
        if line.startswith("ExecStart="):
            words = shlex.split(line[len("ExecStart="):].lstrip("-@:+!"))
            return [w.replace("%%", "%").replace("$$", "$") for w in words]
    return []


def serve_config_path(argv: list[str], programs: list[str]) -> str | None:
    """The --config file of `PROGRAM serve --config FILE` for one of `programs`; None for anything else."""
    if len(argv) < 4 or os.path.basename(argv[0]) not in programs or argv[1] != "serve" or "--config" not in argv:
        return None
    index = argv.index("--config")
    return argv[index + 1] if index + 1 < len(argv) else None


def flat_config(text: str) -> dict:
    """The flat `key: <JSON value>` YAML that the sglang role renders (roles/sglang/templates/sglang-config.yaml.j2)."""
    config = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "---")) or ":" not in line:
            continue
        key, _, value = line.partition(":")
        try:
            config[key.strip()] = json.loads(value.strip())
        except ValueError:
            config[key.strip()] = value.strip()
    return config


def abort_url(config: dict) -> str:
    host = str(config.get("host") or "127.0.0.1")
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{host}:{int(config.get('port') or 30000)}/abort_request"


def post_abort_all(url: str, api_key: str | None, timeout_s: float = 10.0) -> str:
    request = urllib.request.Request(url, data=b'{"abort_all": true}', method="POST",
                                     headers={"Content-Type": "application/json"})
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"not answered ({exc})"


def unit_file(unit: str, unit_dir: str | None) -> str:
    if unit_dir:
        return os.path.join(unit_dir, unit)
    return unit_properties(unit, ("FragmentPath",)).get("FragmentPath") or os.path.join("/etc/systemd/system", unit)


def is_active(unit: str) -> bool:
    """As `systemctl is-active`: the unit is active or reloading."""
    return unit_properties(unit, ("ActiveState",)).get("ActiveState") in ("active", "reloading")


def main() -> None:
    module = AnsibleModule(
        argument_spec={"unit": {"type": "str", "required": True}, "timeout_s": {"type": "int", "default": 30},
                       "programs": {"type": "list", "elements": "str", "required": True}, "unit_dir": {"type": "path"}},
        supports_check_mode=True,
    )
    unit, bound = module.params["unit"], module.params["timeout_s"]
    result = {"changed": False, "drained": False, "aborted": False, "elapsed_s": 0.0}
    if not is_active(unit):
        module.exit_json(**result, message=f"{unit} is not running")
    try:
        with open(unit_file(unit, module.params["unit_dir"]), encoding="utf-8") as handle:
            config_path = serve_config_path(exec_start_argv(handle.read()), module.params["programs"])
    except OSError:
        config_path = None
    if config_path is None:
        module.exit_json(**result, message=f"{unit} does not run `<{'|'.join(module.params['programs'])}> serve "
                         "--config`: its own stop applies")
    if module.check_mode:
        module.exit_json(**{**result, "changed": True},
                         message=f"would send SIGTERM to {unit} and abort what is in flight after {bound} s")
    try:
        with open(config_path, encoding="utf-8") as handle:
            config = flat_config(handle.read())
    except OSError as exc:
        module.fail_json(msg=f"cannot read {unit}'s config {config_path}: {exc}")
    subprocess.run(["systemctl", "kill", "--kill-whom=main", "--signal=SIGTERM", unit], check=False,
                   capture_output=True)
    started = time.monotonic()
    while time.monotonic() - started < bound:
        if not is_active(unit):
            elapsed = round(time.monotonic() - started, 2)
            module.exit_json(changed=True, drained=True, aborted=False, elapsed_s=elapsed,
                             message=f"{unit} drained and ended {elapsed} s after SIGTERM")
        time.sleep(0.2)
    elapsed = round(time.monotonic() - started, 2)
    if not is_active(unit):
        module.exit_json(changed=True, drained=True, aborted=False, elapsed_s=elapsed,
                         message=f"{unit} drained and ended {elapsed} s after SIGTERM")
    # /abort_request is an admin route (SGLang 0.5.23 srt/utils/auth.py): with an admin key set, only it is accepted.
    answer = post_abort_all(abort_url(config), config.get("admin-api-key") or config.get("api-key"))
    module.exit_json(changed=True, drained=False, aborted=True, elapsed_s=elapsed,
                     message=f"{unit} still had requests in flight {bound} s after SIGTERM "
                             f"(engine_service_drain_timeout_s): "
                             f"aborted them (POST /abort_request abort_all: {answer}); the stop follows")


if __name__ == "__main__":
    main()
