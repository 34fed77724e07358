"""gpu_release, GPU verification: nvidia-smi access, who holds which GPU (targets, monitors, peers, foreign
compute users), memory freed, and wedged GPUs.

Stdlib only; runs on the target.
"""

from __future__ import annotations

import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release.scope import (
    foreign_entry,
    protected_name,
)
from ansible_collections.blackwell.serving.plugins.module_utils.host.procfs import Proc, ancestors, title_of
from ansible_collections.blackwell.serving.plugins.module_utils.nvidia.health import gpu_key, wedged_gpus, wedged_text
from ansible_collections.blackwell.serving.plugins.module_utils.nvidia.smi import (
    QUERY_APPS_ARGS,
    QUERY_GPU_ARGS,
    NvidiaError,
    apps_from_csv,
    attach_minors,
    driver_loaded,
    gpus_from_csv,
    read_driver_gpus,
    resolve_nvidia_smi,
    run_queries_together,
    run_query,
    timed_runner,
)

SMI_TIMEOUT_SETTING = "nvidia_smi_timeout_s"
# What nvidia-smi lists as the process name of a PID it cannot resolve: kept as it is.
SMI_NAME_PLACEHOLDERS = {"[Not Found]"}


def titled(apps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Compute apps with nvidia-smi's process name cut as a process title is (procfs.title_of): nvidia-smi names a
    process by its command line's first string, which holds the arguments of a process that set its title to them."""
    return [{**app, "name": app["name"] if app["name"] in SMI_NAME_PLACEHOLDERS or app["name"] is None
             else title_of(app["name"])} for app in apps]


class Gpu:
    """nvidia-smi access; ``available`` is False (with ``reason``) where there is no driver or no tool."""

    def __init__(self, module: AnsibleModule, nvidia_smi: str, driver_proc_dir: str) -> None:
        self.module = module
        self.timeout_s = module.params["nvidia_smi_timeout_s"]
        self._run = timed_runner(self.timeout_s, SMI_TIMEOUT_SETTING)
        self.error = ""
        self.driver_loaded = driver_loaded(driver_proc_dir)
        self.tool = resolve_nvidia_smi(nvidia_smi)
        self.driver_gpus = read_driver_gpus(driver_proc_dir)
        self.reason = ""
        if self.tool is None:
            state = "loaded" if self.driver_loaded else f"not loaded ({driver_proc_dir} absent)"
            self.reason = f"nvidia-smi not found ({nvidia_smi}); NVIDIA kernel driver {state}"

    @property
    def available(self) -> bool:
        return self.tool is not None and not self.reason

    def query_gpus(self) -> list[dict[str, Any]]:
        gpus = gpus_from_csv(run_query(self.tool or "", QUERY_GPU_ARGS, self._run))
        attach_minors(gpus, self.driver_gpus)
        return gpus

    def query_apps(self) -> list[dict[str, Any]]:
        return titled(apps_from_csv(run_query(self.tool or "", QUERY_APPS_ARGS, self._run)))

    def query_both(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        gpu_csv, apps_csv = run_queries_together(
            self.tool or "", [QUERY_GPU_ARGS, QUERY_APPS_ARGS], self.timeout_s, SMI_TIMEOUT_SETTING
        )
        gpus = gpus_from_csv(gpu_csv)
        attach_minors(gpus, self.driver_gpus)
        return gpus, titled(apps_from_csv(apps_csv))

    def first_look(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if not self.available:
            return [], []
        try:
            return self.query_both()
        except NvidiaError as exc:
            if exc.kind in ("no_driver", "missing_tool", "timeout"):
                self.reason = str(exc)
                self.error = str(exc) if exc.kind == "timeout" else ""
                return [], []
            raise


def gpu_selected(gpu: dict[str, Any], wanted: list[str]) -> bool:
    if not wanted:
        return True
    keys = {str(gpu["index"]), gpu["uuid"] or "", gpu["bus_id"] or "", gpu.get("pci_bus_id") or ""}
    return any(w in keys or w.lower() in keys for w in wanted)


def device_files(proc: Proc, dev_dir: str) -> tuple[set[int], bool, bool]:
    """(GPU minors held, holds nvidia-uvm, holds any nvidia device file) from a process's open files."""
    prefix = dev_dir.rstrip("/") + "/nvidia"
    minors: set[int] = set()
    uvm = False
    anything = False
    for target in proc.fds:
        if not target.startswith(prefix):
            continue
        anything = True
        rest = target[len(prefix) :]
        if rest.isdigit():
            minors.add(int(rest))
        elif rest == "-uvm":
            uvm = True
    return minors, uvm, anything


def gpu_table(
    gpus: list[dict[str, Any]], procs: dict[int, Proc], dev_dir: str, wanted: list[str]
) -> dict[int, dict[str, Any]]:
    """minor -> GPU entry for the selected GPUs. Without nvidia-smi, the minors seen in device files."""
    table: dict[int, dict[str, Any]] = {}
    for gpu in gpus:
        if not gpu_selected(gpu, wanted):
            continue
        minor = gpu["minor"] if gpu["minor"] is not None else gpu["index"]
        table[minor] = {
            "index": gpu["index"],
            "uuid": gpu["uuid"],
            "name": gpu["name"],
            "bus_id": gpu["bus_id"],
            "minor": minor,
            "minor_source": gpu["minor_source"] if gpu["minor"] is not None else "assumed equal to index",
            "memory_total_mib": gpu["memory_total_mib"],
            "memory_used_before_mib": gpu["memory_used_mib"],
            "memory_used_after_mib": None,
            "freed_mib": None,
            "holders": [],
        }
    if not gpus:
        for proc in procs.values():
            for minor in device_files(proc, dev_dir)[0]:
                table.setdefault(minor, {"index": None, "uuid": None, "bus_id": None, "minor": minor, "holders": []})
    return table


def attribute_apps(
    apps: list[dict[str, Any]], table: dict[int, dict[str, Any]], procs: dict[int, Proc]
) -> tuple[dict[int, dict[int, int]], list[dict[str, Any]]]:
    """(pid -> {minor: MiB}, apps whose PID is not visible here) on selected GPUs, by uuid, else bus id."""
    by_uuid = {g["uuid"]: g for g in table.values() if g["uuid"]}
    by_bus = {g["bus_id"]: g for g in table.values() if g["bus_id"]}
    app_mem: dict[int, dict[int, int]] = {}
    unmapped: list[dict[str, Any]] = []
    for app in apps:
        entry = by_uuid.get(app["gpu_uuid"]) or by_bus.get(app["bus_id"])
        if entry is None:
            continue
        if app["pid"] not in procs:
            unmapped.append({**app, "gpu_index": entry["index"]})
        else:
            app_mem.setdefault(app["pid"], {})[entry["minor"]] = app["used_mib"] or 0
    return app_mem, unmapped


def classify_holders(
    *,
    procs: dict[int, Proc],
    table: dict[int, dict[str, Any]],
    app_mem: dict[int, dict[int, int]],
    targets: dict[int, dict[str, Any]],
    spared: list[dict[str, Any]],
    dev_dir: str,
    protected: list[str],
    apps_authoritative: bool,
    foreign_by_pid: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    """Add every GPU holder to its GPUs' ``holders`` with a role; returns the foreign compute holders.

    A compute user is a process nvidia-smi lists as a compute app. Only where that list cannot be used
    (no nvidia-smi, or it names PIDs of another PID namespace) an open ``nvidia-uvm`` stands in for it:
    on driver 580 an NVML-only client opens ``nvidia-uvm`` too, so that fallback over-reports.

    Where that list is used, a compute app holds the GPUs it has memory on. The device files of other GPUs that
    it has open are its peer-to-peer mappings (CUDA opens a peer GPU's device file for P2P access, as a
    tensor-parallel job on GPUs 4-7 of a PCIe box does): it is listed on those GPUs as a ``peer``, not as a
    holder of them. Our own engines (targets) stay holders of every GPU whose file they hold.
    """
    me_chain = {os.getpid()} | ancestors(os.getpid(), procs)
    spared_pids = {s["pid"] for s in spared}
    foreign: list[dict[str, Any]] = []
    for proc in procs.values():
        minors, uvm, any_dev = device_files(proc, dev_dir)
        if not any_dev and proc.pid not in app_mem:
            continue
        # Our engines keep every GPU whose file they hold: a GPU is not released until they let go of it.
        held, peers = held_and_peer_gpus(proc.pid, minors, app_mem, table,
                                         apps_authoritative and proc.pid not in targets)
        compute = proc.pid in app_mem if apps_authoritative else (uvm or proc.pid in app_mem)
        if proc.pid in targets:
            role = "target"
            targets[proc.pid]["gpus"] = sorted(table[m]["index"] for m in held)
        elif proc.pid in me_chain:
            role = "self"
        elif proc.pid in spared_pids:
            role = "spared"
        elif protected_name(proc, protected):
            role = "protected"
            spared.append({**proc.brief(), "reason": f"protected daemon ({protected_name(proc, protected)})"})
        elif not compute:
            role = "monitor"
            how = "not a compute app in nvidia-smi" if apps_authoritative else "no nvidia-uvm open"
            reason = f"NVML-only GPU holder ({how}): a monitor, not a compute user"
            spared.append({**proc.brief(), "reason": reason})
        else:
            role = "foreign"
            gpus = sorted(table[m]["index"] for m in held)
            known = foreign_by_pid.setdefault(
                proc.pid, foreign_entry(proc, "uses a GPU for compute; not an engine process of ours")
            )
            known["gpus"] = gpus
            foreign.append({**proc.brief(), "gpus": gpus, "holds_uvm": uvm, "reason": known["reason"]})
        for m in held:
            used = app_mem.get(proc.pid, {}).get(m)
            table[m]["holders"].append({**proc.brief(), "role": role, "compute": compute, "used_mib": used})
        for m in peers:
            table[m]["holders"].append({**proc.brief(), "role": "peer", "compute": False, "used_mib": None})
    return foreign


def held_and_peer_gpus(pid: int, minors: set[int], app_mem: dict[int, dict[int, int]],
                       table: dict[int, dict[str, Any]], apps_authoritative: bool) -> tuple[list[int], list[int]]:
    """(selected GPUs the process holds, selected GPUs whose device file it has open only as a peer). Without an
    authoritative compute-app list every open device file counts as held."""
    used = set(app_mem.get(pid, {}))
    if apps_authoritative and pid in app_mem:
        return sorted(m for m in used if m in table), sorted(m for m in minors - used if m in table)
    return sorted(m for m in minors | used if m in table), []


def verify_gpus(
    *,
    gpu: Gpu,
    table: dict[int, dict[str, Any]],
    targets: dict[int, dict[str, Any]],
    gpus_after: list[dict[str, Any]],
    apps_after: list[dict[str, Any]],
    check_mode: bool,
) -> None:
    """Memory after, freed, compute apps left and ``clean`` per selected GPU, in place."""
    after_by_minor = {(g["minor"] if g["minor"] is not None else g["index"]): g for g in gpus_after}
    for minor, entry in table.items():
        after = after_by_minor.get(minor)
        if after is not None and not check_mode:
            entry["memory_used_after_mib"] = after["memory_used_mib"]
            if entry.get("memory_used_before_mib") is not None and after["memory_used_mib"] is not None:
                entry["freed_mib"] = entry["memory_used_before_mib"] - after["memory_used_mib"]
        here = [a for a in apps_after if a["gpu_uuid"] == entry["uuid"] or a["bus_id"] == entry["bus_id"]]
        entry["apps_after"] = here if gpu.available else []
        alive = [h for h in entry["holders"] if h["role"] == "target" and not targets[h["pid"]].get("exited", False)]
        entry["clean"] = None if not gpu.available or check_mode else not here and not alive and not entry.get("wedged")


def find_wedged(
    gpu: Gpu, table: dict[int, dict[str, Any]], gpus: list[dict], apps: list[dict], params: dict[str, Any]
) -> tuple[dict[str, dict[str, Any]], list[dict], list[dict]]:
    """Wedged selected GPUs (marked in ``table``) and the last (gpus, apps) read; see nvidia/health.py."""
    if not gpu.available:
        return {}, gpus, apps
    wedged, gpus, apps = wedged_gpus(
        gpus,
        apps,
        sample=gpu.query_both,
        keys={gpu_key(e) for e in table.values() if e["uuid"] or e["bus_id"]},
        idle_memory_mib=params["idle_memory_mib"],
        window_s=params["wedged_window_s"],
    )
    for entry in table.values():
        found = wedged.get(gpu_key(entry))
        if found:
            entry["wedged"] = wedged_text(found["readings"], found["seconds"], params["idle_memory_mib"])
    return wedged, gpus, apps


def wedged_list(table: dict[int, dict[str, Any]], wedged: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for entry in sorted(table.values(), key=lambda e: (e["index"] is None, e["index"] or 0)):
        if entry.get("wedged"):
            readings = wedged[gpu_key(entry)]
            found.append({**{k: entry[k] for k in ("index", "uuid", "bus_id")}, **readings, "text": entry["wedged"]})
    return found
