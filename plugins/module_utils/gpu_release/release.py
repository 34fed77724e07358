"""Release engine processes, GPUs and /dev/shm: the gpu_release module's orchestration.

Stdlib only; runs on the target. The module (plugins/modules/gpu_release.py) is argument handling and output; this file
runs the steps in order, each decided in a file of its own concern in this package: which processes are ours
(scope.py), the systemd units (units.py), signalling and the waits (signals.py), /dev/shm (shm.py), what the GPUs
show (gpus.py), and the summary and failure message (report.py). The record of a teardown in state.json is written
by release/state.py, which owns that file. The deploy's preflight and teardown share all of it.
"""

from __future__ import annotations

import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release.gpus import (
    Gpu,
    attribute_apps,
    classify_holders,
    find_wedged,
    gpu_table,
    verify_gpus,
    wedged_list,
)
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release.report import failure, summarize
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release.scope import Scope, select
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release.shm import clean_shm, shm_owners
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release.signals import (
    Clock,
    terminate,
    wait_for_gpu_release,
    wait_for_memory_to_settle,
)
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release.units import (
    ReleaseError,
    stop_units,
    units_left,
    with_recorded_unit,
)
from ansible_collections.blackwell.serving.plugins.module_utils.host.procfs import Proc, snapshot
from ansible_collections.blackwell.serving.plugins.module_utils.release.state import read_serving, record_teardown

__all__ = ["ARGUMENT_SPEC", "ReleaseError", "release"]

ARGUMENT_SPEC: dict[str, Any] = {
    # The engines' units, patterns and service users come from the engine roster (meta/engines.yml) through the
    # gpu_release role; the module has no engine list of its own to drift from it.
    "units": {"type": "list", "elements": "str", "required": True},
    "patterns": {"type": "list", "elements": "str", "required": True},
    "protected": {
        "type": "list",
        "elements": "str",
        "default": [
            "nvidia-persistenced",
            "nv-hostengine",
            "nvidia-dcgm",
            "dcgm-exporter",
            "dcgmi",
            "nv-fabricmanager",
            "nvidia-fabricmanager",
            "Xorg",
            "X",
            "Xwayland",
            "gnome-shell",
            "gdm*",
            "sddm",
            "nvidia-smi",
            "systemd",
            "init",
            "sshd",
        ],
    },
    "extra_protected": {"type": "list", "elements": "str", "default": []},
    "grace_s": {"type": "float", "default": 10.0},
    "timeout_s": {"type": "float", "default": 60.0},
    "settle_s": {"type": "float", "default": 3.0},
    "poll_interval_ms": {"type": "int", "default": 25},
    "gpus": {"type": "list", "elements": "str", "default": []},
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
    "driver_proc_dir": {"type": "path", "default": "/proc/driver/nvidia"},
    "dev_dir": {"type": "path", "default": "/dev"},
    "cgroup_root": {"type": "path", "default": "/sys/fs/cgroup"},
    "shm_dir": {"type": "path", "default": "/dev/shm"},
    "shm_patterns": {
        "type": "list",
        "elements": "str",
        "default": ["nccl-*", "psm_*", "sem.mp-*", "torch_*", "multi_tokenizer_*"],
    },
    "shm_owner": {"type": "list", "elements": "str", "default": []},
    "clean_shm": {"type": "bool", "default": True},
    "fail_on_foreign_holders": {"type": "bool", "default": False},
    "scope": {"type": "str", "default": "default", "choices": ["default", "host"]},
    "service_users": {"type": "list", "elements": "str", "required": True},
    "stop_units": {"type": "bool", "default": False},
    "disable_units": {"type": "bool", "default": True},
    "report_only": {"type": "bool", "default": False},
    "nvidia_smi_timeout_s": {"type": "float", "default": 10.0},
    "idle_memory_mib": {"type": "int", "default": 256},
    "wedged_window_s": {"type": "float", "default": 1.5},
    "state_dir": {"type": "path"},
    "lock_file": {"type": "path", "default": "/run/lock/llm-serving-release.lock"},
    "lock_timeout_s": {"type": "float", "default": 120.0},
}


def target_entries(reasons: dict[int, str], procs: dict[int, Proc]) -> dict[int, dict[str, Any]]:
    return {
        pid: {
            **procs[pid].brief(),
            "reason": reason,
            "gpus": [],
            "signals": [],
            "exited": False,
            "exit_s": None,
        }
        for pid, reason in reasons.items()
    }


def release(module: AnsibleModule) -> dict[str, Any]:
    params = module.params
    clock = Clock()
    check_mode = module.check_mode
    report_only = params["report_only"]
    serving = read_serving(params["state_dir"]) if params["state_dir"] else None
    params["units"] = with_recorded_unit(params["units"], (serving or {}).get("release", {}).get("unit"))
    units = stop_units(module, params["units"] if params["stop_units"] else [], check_mode or report_only,
                       params["disable_units"])
    gpu = Gpu(module, params["nvidia_smi"], params["driver_proc_dir"])
    procs = snapshot()
    scope = Scope(params, procs)
    gpus_before, apps_before = gpu.first_look()
    targets_reason, spared, foreign_by_pid = select(params, module, procs, scope, units["units"])
    table = gpu_table(gpus_before, procs, params["dev_dir"], params["gpus"])
    app_mem, unmapped = attribute_apps(apps_before, table, procs)
    targets = target_entries(targets_reason, procs)
    foreign = classify_holders(
        procs=procs,
        table=table,
        app_mem=app_mem,
        targets=targets,
        spared=spared,
        dev_dir=params["dev_dir"],
        protected=params["protected"] + params["extra_protected"],
        apps_authoritative=gpu.available and not unmapped,
        foreign_by_pid=foreign_by_pid,
    )

    signalled: dict[str, list[int]] = {"TERM": [], "KILL": []}
    release_s = None
    left_on_gpu: set[int] = set()
    if check_mode and not report_only:
        signalled["TERM"] = sorted(targets)
    elif targets and not report_only:
        exited, t_term = terminate({pid: procs[pid] for pid in targets}, params, signalled)
        if gpu.available:
            left_on_gpu = wait_for_gpu_release(
                gpu,
                watch_target=set(targets),
                watch_unmapped={a["pid"] for a in unmapped},
                explained=sum(1 for f in foreign if f["pid"] not in app_mem and f["holds_uvm"]),
                params=params,
                t_term=t_term,
            )
            if any(t["gpus"] for t in targets.values()) and not set(app_mem) & set(targets):
                wait_for_memory_to_settle(gpu, params)
        release_s = round(time.monotonic() - t_term, 3)
        for pid, t in targets.items():
            t["signals"] = [s for s in ("TERM", "KILL") if pid in signalled[s]]
            t["exited"] = pid in exited
            t["exit_s"] = exited.get(pid)

    quiet = check_mode or report_only or not targets
    procs_after = procs if quiet else snapshot()
    shm = clean_shm(params, procs_after, check_mode, set(targets), shm_owners(params, scope))
    gpus_after, apps_after = gpu.query_both() if gpu.available and not quiet else (gpus_before, apps_before)
    wedged, gpus_after, apps_after = find_wedged(gpu, table, gpus_after, apps_after, params)
    verify_gpus(
        gpu=gpu,
        table=table,
        targets=targets,
        gpus_after=gpus_after,
        apps_after=apps_after,
        check_mode=check_mode or report_only,
    )
    listed_after = {a["pid"] for a in apps_after}

    changed = (
        signalled["TERM"]
        or signalled["KILL"]
        or shm["removed"]
        or (check_mode and shm["would_remove"])
        or units["stopped"]
        or units["disabled"]
    )
    result: dict[str, Any] = {
        "changed": bool(changed) and not report_only,
        "check_mode": check_mode,
        "report_only": report_only,
        "scope": scope.name,
        "scope_description": scope.describe(params["units"]),
        "service_users": {"present": scope.users.present, "absent": scope.users.absent},
        "stop_units": params["stop_units"],
        "units": units,
        "units_left": [] if check_mode or report_only else units_left(units, procs_after, scope.roots),
        "driver_loaded": gpu.driver_loaded,
        "driver_version": next((g["driver_version"] for g in gpus_before if g.get("driver_version")), None),
        "gpu_count": len(gpus_before),
        "gpu_verification": "done" if gpu.available else "skipped",
        "gpu_verification_reason": "" if gpu.available else gpu.reason,
        "gpus": sorted(table.values(), key=lambda e: (e["index"] is None, e["index"] or 0, e["minor"])),
        "targets": [targets[p] for p in sorted(targets)],
        "signalled": signalled,
        "spared": spared,
        "foreign": [foreign_by_pid[p] for p in sorted(foreign_by_pid)],
        "foreign_holders": foreign,
        "unattributed_apps": [a for a in unmapped if a["pid"] in listed_after],
        "wedged": wedged_list(table, wedged),
        "nvidia_smi_error": gpu.error,
        "shm": shm,
        "release_s": release_s,
        "elapsed_s": clock.since(),
    }
    result["summary"] = summarize(result)
    msg = failure(result, targets, left_on_gpu, params)
    if msg and report_only:
        msg += ". Report only: nothing was stopped, signalled or removed."
    if serving is not None:
        record_teardown(result, serving, write=not (msg or check_mode or report_only), failed=bool(msg))
    if msg:
        result["msg"] = msg
        result["summary"].append("FAILED: " + msg)
    return result
