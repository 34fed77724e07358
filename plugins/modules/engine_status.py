#!/usr/bin/python
# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: one read-only look at what a host serves (status.yml)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_status
short_description: One read-only look at what an engine host serves, for a fleet status
description:
  - Reads, in one call, the host's release state (C(state.json) under O(state_dir)) and the current release's
    C(release.json) (engine, release id, engine version, profile, the time the release was created), the engine
    unit (its ActiveState, whether it is enabled, since when it is active), the release's C(/health) (HTTP status
    and latency, one request of at most O(health_timeout_s)), the GPUs where nvidia-smi is present (how many, the
    memory the engine unit's processes hold, and foreign compute holders by pid, user and process title), the
    releases kept on disk and the one a rollback would start (C(previous) in C(state.json)), what a reboot would
    start, and the last verdict of verify or the deploy's gate the host recorded (C(verdict.json)).
  - Says what is wrong in RV(problems) and in one line, RV(summary).
  - A C(state.json) that is not valid JSON (truncated, half-written) or that names a release whose C(release.json)
    is missing does not fail the task, since the fleet status goes on with the other hosts. The result then has
    RV(ok=false) and RV(reason) says why, for instance C(state.json is not valid JSON, Expecting value...).
  - Nothing is written and nothing is started or stopped; C(changed) is always false, in check mode too.
  - No secret is read into the result. No configuration or environment file of a release is opened (they hold the
    API keys); of C(release.json) only id, engine, engine_version, profile, unit, created and the health URL are
    read, and of a process only its pid, user and title, never its arguments. C(/health) is asked without a key
    (both engines answer it without one).
  - The time a release serves since is when systemd last made its unit active (ActiveEnterTimestamp), the engine's
    start; C(unknown) when the unit is not active or systemd does not run here.
version_added: "0.1.0"
author: the blackwell-llm-serving authors (!UNKNOWN)
options:
  state_dir:
    description: Directory of the host's release state (C(state.json), C(releases/)).
    type: path
    default: /var/lib/llm-serving
  units:
    description:
      - Every engine's unit (the engine roster's). The current release's unit is read whatever this says; another
        of these units that is active is a problem (one engine owns the GPUs).
    type: list
    elements: str
    required: true
  health_timeout_s:
    description: Seconds the C(/health) request may take.
    type: float
    default: 3
  nvidia_smi:
    description: nvidia-smi to run (a name in PATH or a path); where it is absent the GPUs are not read.
    type: str
    default: nvidia-smi
  nvidia_smi_timeout_s:
    description: Seconds the nvidia-smi queries may take together (a hung driver does not hang the status).
    type: int
    default: 10
  driver_proc_dir:
    description: The NVIDIA driver's /proc directory.
    type: path
    default: /proc/driver/nvidia
  cgroup_root:
    description: Where the cgroup file system is mounted (the engine unit's processes are found in its cgroup).
    type: path
    default: /sys/fs/cgroup
  boot_unit:
    description:
      - The unit that starts, at boot, the release C(state.json) names (the engine_service role's boot unit); no engine
        unit is enabled itself.
    type: str
    default: llm-serving-boot.service
notes:
  - Standard library only. Run it as root (become); the release directories are readable by root and the engine's
    group only.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - blackwell.serving.attributes
seealso:
  - module: blackwell.serving.engine_release
  - module: blackwell.serving.gpu_facts
"""

EXAMPLES = r"""
- name: What serves on this host
  blackwell.serving.engine_status:
    units: [sglang.service, vllm.service]
  become: true
  register: status

- name: Say it
  ansible.builtin.debug:
    msg: "{{ inventory_hostname }}: {{ status.summary }}"
"""

RETURN = r"""
ok:
  description: Whether the host's release state could be read; false for a C(state.json) that is not valid JSON, that
    names an unknown status, or whose current release has no C(release.json). RV(reason) then says why.
  type: bool
  returned: always
reason:
  description: Why RV(ok) is false; empty when it is true.
  type: str
  returned: always
  sample: "state.json is not valid JSON: Expecting ',' delimiter: line 3 column 1 (char 30) (half-written?)"
state:
  description: C(serving), C(switching) (a deploy did not finish), C(stopped) (teardown), C(none) (nothing was
    deployed, no C(state.json)) or C(unknown) (RV(ok=false)).
  type: str
  returned: always
release_id:
  description: The current release (C(state.json)), or null.
  type: str
  returned: always
engine:
  description: Engine of the current release, or null.
  type: str
  returned: always
engine_version:
  description: Engine version of the current release (its lock), or null.
  type: str
  returned: always
profile:
  description: Model profile of the current release, or null.
  type: str
  returned: always
created:
  description: When the current release was first written (UTC); C(unknown) for one written before this was recorded.
  type: str
  returned: always
  sample: "2026-12-04T18:31:07Z"
serving_since:
  description: When the current release's unit became active (UTC), while state.json says serving; else C(unknown).
  type: str
  returned: always
failed_release:
  description:
    - The release whose deploy failed last and was rolled back (C(failed) in C(state.json)), or null.
    - Not named C(failed), which Ansible reads as the task's own failure.
  type: str
  returned: always
rollback:
  description: The release a rollback would start (C(previous) in C(state.json)), or null.
  type: str
  returned: always
state_record:
  description: C(state.json) as the deploy reads it (current, previous, status, and failed where recorded), or null
    without one or when it cannot be read.
  type: dict
  returned: always
boot:
  description:
    - What a reboot would start - unit (the boot unit), enabled (null without systemd), release and engine_unit (the
      release C(state.json) names for boot and its unit, null for none).
  type: dict
  returned: always
verdict:
  description:
    - The last verdict the host recorded (C(verdict.json), written by verify and the deploy's gate) - release, kind
      (C(gate) or C(verify)), mode, passed, speedup (the lowest measured at the gated levels, or null), failures, and
      recorded (UTC, when it was written; a later run with the same outcome leaves it). Null without one.
    - A smoke check that fails stops verify before it records anything; the record says the last outcome reached.
  type: dict
  returned: always
unit:
  description: The current release's unit - name, load_state, active_state (C(unknown) without systemd), sub_state,
    unit_file_state, enabled (null without systemd), active_since (UTC, while active).
  type: dict
  returned: always
engine_units:
  description: Per engine unit of O(units) and the current one, active_state and enabled.
  type: dict
  returned: always
health:
  description: The release's C(/health) - url, status (HTTP status, null without an answer), latency_ms, error.
  type: dict
  returned: always
gpus:
  description:
    - available (whether nvidia-smi answered), reason (why not), count, engine_memory_mib (held by the processes of
      the current release's unit), per GPU index, name, memory_used_mib, memory_total_mib, engine_mib, and foreign
      (compute processes that are not the engine's - pid, user, title, gpus, used_mib).
  type: dict
  returned: always
releases:
  description: The release directories on disk, newest first - id, engine, engine_version, profile, created, current,
    previous, incomplete (why its release.json cannot be read, or empty).
  type: list
  elements: dict
  returned: always
baselines:
  description:
    - The throughput baselines verify recorded on the host (C(<state_dir>/verify-baselines/), written only by
      C(verify_mode=baseline) or C(verify_record_baseline)), newest first - key (the hash naming the file), recorded
      (UTC, when it was measured), profile, output_throughput (concurrency to tok/s), engine, engine_version, model
      (revision), gpu_model, tensor_parallel_size, layout (beyond tensor parallelism), and history (the baselines
      it replaced - file, recorded, output_throughput - newest first). A file that cannot be read has error instead.
  type: list
  elements: dict
  returned: always
problems:
  description: What is wrong (not enabled, /health not 200, a deploy that did not finish, a foreign GPU holder, ...).
  type: list
  elements: str
  returned: always
summary:
  description: One line for the host.
  type: str
  returned: always
  sample: "sglang sglang-7222bd6d61dd serving since 2026-12-04T18:40Z, /health 200 in 3 ms, 8 GPUs (86000 MiB held
    by the engine), rollback → sglang-0b1c2d3e4f5a"
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release.gpus import Gpu
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release.scope import unit_members
from ansible_collections.blackwell.serving.plugins.module_utils.host.procfs import (
    own_cgroup_roots,
    read_proc,
    title_of,
)
from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import (
    SystemdError,
    show_units,
    systemctl_here,
)
from ansible_collections.blackwell.serving.plugins.module_utils.nvidia.smi import NvidiaError
from ansible_collections.blackwell.serving.plugins.module_utils.release.baselines import read_baselines
from ansible_collections.blackwell.serving.plugins.module_utils.release.status import (
    UNIT_PROPERTIES,
    UNKNOWN,
    StateError,
    boot_view,
    gpu_view,
    kept_releases,
    probe_health,
    problems_of,
    read_state,
    read_verdict,
    release_brief,
    summary_line,
    unit_view,
)

ARGUMENT_SPEC = {
    "state_dir": {"type": "path", "default": "/var/lib/llm-serving"},
    "units": {"type": "list", "elements": "str", "required": True},
    "health_timeout_s": {"type": "float", "default": 3},
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
    "nvidia_smi_timeout_s": {"type": "int", "default": 10},
    "driver_proc_dir": {"type": "path", "default": "/proc/driver/nvidia"},
    "cgroup_root": {"type": "path", "default": "/sys/fs/cgroup"},
    "boot_unit": {"type": "str", "default": "llm-serving-boot.service"},
}


def describe_process(pid: int, smi_name: str | None) -> dict:
    """pid, user and title of a GPU holder (procfs.Proc.brief, without its parent); nvidia-smi's name, cut as a
    title is, for a process not visible here (another PID namespace)."""
    proc = read_proc(pid, with_fds=False)
    if proc is None:
        return {"pid": pid, "user": UNKNOWN, "title": title_of(smi_name or "") or UNKNOWN}
    brief = proc.brief()
    return {"pid": pid, "user": brief["user"], "title": brief["title"]}


def read_gpus(module: AnsibleModule, unit: str | None, known_units: dict) -> dict:
    params = module.params
    gpu = Gpu(module, params["nvidia_smi"], params["driver_proc_dir"])
    try:
        gpus, apps = gpu.first_look()
    except NvidiaError as exc:
        return {"available": False, "reason": str(exc), "count": 0, "engine_memory_mib": 0, "gpus": [], "foreign": []}
    if not gpu.available:
        return {"available": False, "reason": gpu.reason, "count": 0, "engine_memory_mib": 0, "gpus": [],
                "foreign": []}
    procs = {}
    for app in apps:
        proc = read_proc(app["pid"], with_fds=False)
        if proc is not None:
            procs[app["pid"]] = proc
    me = read_proc(os.getpid(), with_fds=False)
    roots = own_cgroup_roots(me.cgroup_entries if me else [])
    members = unit_members(module, {"units": [unit], "cgroup_root": params["cgroup_root"]}, procs, roots,
                           known_units) if unit else {}
    return {"available": True, "reason": "", **gpu_view(gpus, apps, set(members), describe_process)}


def read_units(module: AnsibleModule, units: list[str]) -> tuple[bool, dict, str]:
    """(systemd runs here, properties by unit, why they could not be read)."""
    systemctl = systemctl_here()
    if systemctl is None:
        return False, {}, ""
    try:
        return True, show_units(units, UNIT_PROPERTIES, systemctl=systemctl, run=module.run_command), ""
    except SystemdError as exc:
        return True, {}, str(exc)


def broken(state_dir: str, reason: str) -> dict:
    """The result for a host whose state cannot be read: what is on disk, and why."""
    try:
        releases = kept_releases(state_dir, None)
    except OSError:
        releases = []
    status = {"ok": False, "reason": reason, "state": UNKNOWN, "release_id": None, "engine": None,
              "engine_version": None, "profile": None, "created": UNKNOWN, "serving_since": UNKNOWN,
              "failed_release": None, "rollback": None, "state_record": None, "boot": {}, "verdict": None, "unit": {},
              "engine_units": {},
              "health": {"url": None, "status": None, "latency_ms": None, "error": "not asked"},
              "gpus": {"available": False, "reason": "not read", "count": 0, "engine_memory_mib": 0, "gpus": [],
                       "foreign": []},
              "releases": releases, "baselines": read_baselines(state_dir), "problems": [reason]}
    return {**status, "summary": summary_line(status)}


def read_status(module: AnsibleModule) -> dict:
    params = module.params
    try:
        read = read_state(params["state_dir"])
        releases = kept_releases(params["state_dir"], read["state"])
    except StateError as exc:
        return broken(params["state_dir"], str(exc))
    except OSError as exc:
        return broken(params["state_dir"], f"{params['state_dir']} cannot be read: {exc}")
    state = read["state"]
    release = release_brief(read["release"], state["current"]) if read["release"] else release_brief({}, None)
    unit = release["unit"]
    names = list(dict.fromkeys([*params["units"], *([unit] if unit else [])]))
    systemd, shown, systemd_error = read_units(module, [*names, params["boot_unit"]])
    views = {name: unit_view(name, shown.get(name), systemd) for name in names}
    health = (probe_health(read["release"].get("health_url"), params["health_timeout_s"]) if read["release"]
              else {"url": None, "status": None, "latency_ms": None, "error": "no release"})
    status = {
        "ok": True,
        "reason": "",
        "state": state["status"] if state else "none",
        "release_id": state["current"] if state else None,
        "engine": release["engine"],
        "engine_version": release["engine_version"],
        "profile": release["profile"],
        "created": release["created"] if read["release"] else UNKNOWN,
        "serving_since": UNKNOWN,
        "failed_release": state.get("failed") if state else None,
        "rollback": state["previous"] if state else None,
        "state_record": state,
        "boot": boot_view(params["boot_unit"], shown.get(params["boot_unit"]), systemd, state, params["state_dir"]),
        "verdict": read_verdict(params["state_dir"]),
        "unit": views.get(unit) or unit_view(unit, None, systemd),
        "engine_units": {name: {"active_state": view["active_state"], "enabled": view["enabled"]}
                         for name, view in views.items()},
        "health": health,
        "gpus": read_gpus(module, unit, shown),
        "releases": releases,
        "baselines": read_baselines(params["state_dir"]),
    }
    if status["state"] == "serving" and status["unit"]["active_since"]:
        status["serving_since"] = status["unit"]["active_since"]
    status["problems"] = ([f"systemd could not be read: {systemd_error}"] if systemd_error else []) + problems_of(
        status, status["engine_units"])
    status["summary"] = summary_line(status)
    return status


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(changed=False, **read_status(module))


if __name__ == "__main__":
    main()
