#!/usr/bin/python
"""Ansible module: wait for an engine to become ready by polling, never by sleeping blindly."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_wait
short_description: Wait until an inference engine answers its health endpoint, failing fast if its unit dies
description:
  - Polls I(url) until it answers I(status) or I(timeout_s) runs out. SGLang answers C(/health) with 503
    while it loads and then runs a real one-token generation; vLLM answers 200 once its engine is up.
  - With I(unit), each poll also reads the unit's state from systemd. If the unit fails, stops, or is
    restarted by C(Restart=on-failure) (its C(NRestarts) grows), the wait ends at once instead of at the
    timeout, and the result carries the tail of the unit's journal.
  - Not supported in check mode (it would report a readiness it did not observe), so check mode shows it skipped.
options:
  url:
    description: Health URL, for example C(http://127.0.0.1:30000/health).
    type: str
    required: true
  status:
    description: HTTP status that means ready.
    type: int
    default: 200
  timeout_s:
    description: How long to wait in total, in seconds.
    type: float
    default: 1800
  interval_s:
    description: Pause between polls, in seconds.
    type: float
    default: 1.0
  request_timeout_s:
    description: Timeout of one request. SGLang's health check may take up to its own 20 s generation timeout.
    type: float
    default: 30
  unit:
    description: Systemd unit whose state is watched while waiting, and whose journal is shown on failure.
    type: str
  journal_lines:
    description: Journal lines to return on failure.
    type: int
    default: 40
author:
  - LLM serving maintainers
"""

EXAMPLES = r"""
- name: Wait for SGLang to serve
  engine_wait:
    url: http://127.0.0.1:30000/health
    unit: sglang.service
    timeout_s: 1800
"""

RETURN = r"""
elapsed_s:
  description: Seconds from the first poll to the outcome.
  type: float
  returned: always
attempts:
  description: Number of health requests sent.
  type: int
  returned: always
last_status:
  description: Last HTTP status seen, or the connection error.
  type: str
  returned: always
unit_state:
  description: The unit's ActiveState/SubState/Result/NRestarts at the end, when I(unit) is set and systemd runs.
  type: dict
  returned: when unit is set
journal:
  description: Tail of the unit's journal, on failure.
  type: list
  elements: str
  returned: on failure with unit
"""

import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.bws_systemd import journal_tail, unit_properties

UNIT_PROPERTIES = ("ActiveState", "SubState", "Result", "NRestarts", "MainPID", "ExecMainStatus")


def probe(url: str, timeout: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.status)
    except urllib.error.HTTPError as error:
        return str(error.code)
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return f"no answer ({reason})"


def unit_died(state: dict[str, str], restarts_at_start: int) -> str | None:
    """Describe why the unit can no longer become ready, or None while it still can."""
    if not state:
        return None
    if state.get("ActiveState") in ("failed", "inactive", "deactivating") or state.get("SubState") == "auto-restart":
        return (f"unit is {state.get('ActiveState')}/{state.get('SubState')} (result {state.get('Result')}, "
                f"exit status {state.get('ExecMainStatus')})")
    # NRestarts only grows once RestartSec= has passed; auto-restart above catches the crash at once.
    restarts = int(state.get("NRestarts") or 0)
    if restarts > restarts_at_start:
        return f"unit crashed and was restarted {restarts - restarts_at_start} time(s) while starting"
    return None


def wait(module: AnsibleModule) -> None:
    params = module.params
    unit = params["unit"]
    start = time.monotonic()
    initial = unit_properties(unit, UNIT_PROPERTIES) if unit else {}
    restarts_at_start = int(initial.get("NRestarts") or 0)
    attempts, last_status, state = 0, "not polled", initial
    while True:
        attempts += 1
        last_status = probe(params["url"], params["request_timeout_s"])
        if last_status == str(params["status"]):
            module.exit_json(changed=False, elapsed_s=round(time.monotonic() - start, 3),
                             attempts=attempts, last_status=last_status, unit_state=state)
        state = unit_properties(unit, UNIT_PROPERTIES) if unit else {}
        reason = unit_died(state, restarts_at_start)
        elapsed = time.monotonic() - start
        if reason is None and elapsed >= params["timeout_s"]:
            reason = f"not ready after {params['timeout_s']:g} s (last answer: {last_status})"
        if reason:
            journal = journal_tail(unit, params["journal_lines"]) if unit else []
            module.fail_json(msg=f"{params['url']}: {reason}", elapsed_s=round(elapsed, 3), attempts=attempts,
                             last_status=last_status, unit_state=state, journal=journal)
        time.sleep(min(params["interval_s"], max(0.0, params["timeout_s"] - elapsed)))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "status": {"type": "int", "default": 200},
            "timeout_s": {"type": "float", "default": 1800},
            "interval_s": {"type": "float", "default": 1.0},
            "request_timeout_s": {"type": "float", "default": 30},
            "unit": {"type": "str"},
            "journal_lines": {"type": "int", "default": 40},
        },
        supports_check_mode=False,
    )
    wait(module)


if __name__ == "__main__":
    main()
