#!/usr/bin/python
# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_release
short_description: Stop inference-engine processes and free the NVIDIA GPUs and /dev/shm of one host
description:
  - Selects B(targets) = members of the cgroups of O(units) (from the unit's C(cgroup.procs), cgroup v1
    and v2, and from every C(/proc/<pid>/cgroup)), processes whose process title or program matches
    O(patterns) B(and) that are in scope (O(scope)), and their descendants in scope.
  - "Scope is judged from the module's own view, so that it behaves the same on a bare host and inside a
    container that runs systemd: its own PID namespace (C(/proc/self/ns/pid)) and its own cgroup root (its
    path in C(/proc/self/cgroup) up to its deepest container component, else C(/)). With O(scope=default) an
    engine-pattern process is a target only when it runs as one of O(service_users), in this PID namespace,
    and below the root outside user sessions (C(user.slice), C(user-*.slice), C(session-*.scope),
    C(user@*.service)) and container or pod cgroups (C(libpod-*), C(docker-*), C(kubepods*),
    C(machine.slice), C(crio-*), C(cri-containerd-*), C(lxc.payload*) ...). A unit's cgroup is recognised
    only outside sessions and containers, so a user's own C(user@1000.service/app.slice/sglang.service) is
    not the unit C(sglang.service)."
  - O(scope=host) is an explicit opt-in for engines started by hand over ssh (in a session, as any user) -
    any engine-pattern process of this PID namespace outside containers is a target, which is what the old
    teardown one-liner did, minus protected daemons and minus other containers.
  - Every other process that matches a pattern, or that uses a GPU for compute, is B(foreign) - named in
    RV(foreign) and the summary with the reason, never signalled.
  - Never targets the module itself, its ancestors (the Ansible process chain), PID 1, kernel threads, or a
    protected daemon (O(protected) + O(extra_protected), such as C(nvidia-persistenced), C(nv-hostengine),
    C(Xorg) ...).
    Other processes holding GPU device files are B(foreign holders), named in the result, never signalled.
  - Sends SIGTERM, polls every O(poll_interval_ms) (no fixed sleeps), sends SIGKILL to what is left after
    O(grace_s), then polls C(nvidia-smi --query-compute-apps) until no GPU lists a target any more, and
    verifies every selected GPU. Fails naming PIDs, process titles, users and GPUs when targets still hold a GPU
    after O(timeout_s).
  - "A process is named in the result and the summary by pid, user and process title only, never by its arguments,
    so that a secret another process was given on its command line (C(serve.py --api-key KEY)) stays on the host.
    The title is argv[0] as written up to its first whitespace (a title such as C(sglang::scheduler_TP0) is
    argv[0]; one set with setproctitle that holds a whole command line is cut there), the basename where argv[0]
    is a Python interpreter, C([comm]) for a kernel thread. nvidia-smi's process names are cut the same way.
    Only what is reported is cut: patterns are matched as described below."
  - GPU holders are found by reading C(/proc/*/fd) links to C(<dev_dir>/nvidia*). A holder is a compute
    user when nvidia-smi lists it as a compute app; other holders are NVML-only clients (monitors). An
    NVML client opens C(nvidia-uvm) too (seen with driver 580), so only where nvidia-smi is missing or
    names PIDs of another PID namespace is an open C(nvidia-uvm) taken as compute use.
  - The device minor of C(/dev/nvidiaN) is mapped to a GPU through
    C(/proc/driver/nvidia/gpus/*/information), not assumed to equal nvidia-smi's index.
  - Removes from O(shm_dir) only entries that match O(shm_patterns), are regular files, belong to one of
    O(shm_owner) (by default the O(service_users)), and that no live process has open (C(/proc/*/fd)) or
    mapped (C(/proc/*/maps)). Other users' entries are never removed by default.
  - With O(stop_units), it first stops and disables the loaded O(units) with systemctl (where systemd runs),
    clears a failed state, and after the release fails when a unit still runs, is enabled or has processes
    left in its cgroup; one module call does the whole teardown.
  - With O(report_only), it only looks - no unit is stopped, nothing signalled or removed, C(changed) is
    false - and reports targets, foreign processes and GPU holders; with O(fail_on_foreign_holders) this is
    the check a deploy runs before it stops anything.
  - "Pattern matching, precisely: a single-word pattern matches, with shell wildcards and case-sensitive,
    either argv[0] as written (the process title, for example C(sglang::scheduler_TP0) or C(VLLM::EngineCore))
    or the program; a C(PROG ARG) pattern matches the program and the argument right after it. The program is
    the basename of argv[0], except when argv[0] is a Python interpreter: then interpreter options are
    skipped and the program is the module of C(-m MODULE) or the basename of the script. So
    C(python3 -m sglang.launch_server) is program C(sglang.launch_server); C(/opt/sglang/bin/sglang serve) and
    C(/opt/sglang/bin/python3 /opt/sglang/bin/sglang serve) are program C(sglang) with argument C(serve).
    Nothing after that argument is looked at, so C(journalctl -u sglang) or C(grep sglang::) never match."
  - Without an NVIDIA driver or C(nvidia-smi) (CI, containers) it still releases engine processes and
    /dev/shm and returns RV(gpu_verification=skipped) with the reason.
  - "A selected GPU on which nvidia-smi lists no compute process at all, but which shows utilisation above 0 %
    or more than O(idle_memory_mib) used, is B(wedged) (what killed processes can leave behind after a hang):
    one such reading is only suspicious and is read again at growing intervals (0.1, 0.2, 0.4 ... s); a GPU
    still busy with no process over O(wedged_window_s) fails the module, also with O(report_only) (a deploy's
    preflight), naming it and saying it needs C(nvidia-smi -r) or a reboot. A healthy host pays no extra reading."
  - Every nvidia-smi call ends after O(nvidia_smi_timeout_s) (its process group is killed) and the module says
    so. When the first call times out, engine processes and /dev/shm are still released, then the module fails.
  - With O(state_dir) (engine_service's state directory) the module does the host's record keeping of a
    teardown in the same call - the unit of the release C(state.json) names as current is added to O(units),
    and after a successful release C(state.json) records that release as stopped (check mode says it would;
    --diff shows the change). RV(release) says which release it was.
version_added: "0.1.0"
author: the blackwell-llm-serving authors (!UNKNOWN)
options:
  units:
    description: systemd units whose cgroup members are targets (stop them before calling this module, or set
      O(stop_units)). The gpu_release role passes every engine's unit from the engine roster
      (C(query('blackwell.serving.engine_roster', 'unit'))).
    type: list
    elements: str
    required: true
  patterns:
    description: Engine patterns (see the description for the matching rules). The gpu_release role passes every
      engine's C(process_patterns) from the engine roster.
    type: list
    elements: str
    required: true
  protected:
    description: Names (shell wildcards) of processes never signalled, matched against comm, argv[0],
      its basename and the program.
    type: list
    elements: str
    default: [nvidia-persistenced, nv-hostengine, nvidia-dcgm, dcgm-exporter, dcgmi, nv-fabricmanager,
              nvidia-fabricmanager, Xorg, X, Xwayland, gnome-shell, gdm*, sddm, nvidia-smi, systemd, init,
              sshd]
  extra_protected:
    description: More protected names, added to O(protected).
    type: list
    elements: str
    default: []
  grace_s:
    description:
      - Seconds between the SIGTERM and the SIGKILL sent to targets still alive once O(units) stopped (processes
        outside a unit, or left in a unit's cgroup).
      - Applied last - each unit's own stop (O(stop_units)) is bounded first by its C(TimeoutStopSec=), at whose end
        systemd kills the unit's cgroup.
    type: float
    default: 10
  timeout_s:
    description: Seconds after SIGTERM after which targets still alive or listed on a GPU fail the module.
    type: float
    default: 60
  settle_s:
    description: After all targets exited, seconds to wait for compute apps whose PID is not visible here
      (another PID namespace) to disappear from nvidia-smi; those left are reported, not failed on.
    type: float
    default: 3
  poll_interval_ms:
    description: Polling interval in milliseconds.
    type: int
    default: 25
  gpus:
    description: GPUs (index, uuid or bus id) to verify and report; default all.
    type: list
    elements: str
    default: []
  nvidia_smi:
    description: nvidia-smi to run (a name looked up in PATH, or a path).
    type: str
    default: nvidia-smi
  driver_proc_dir:
    description: The NVIDIA driver's /proc directory (device minor per bus id).
    type: path
    default: /proc/driver/nvidia
  dev_dir:
    description: Directory that holds the C(nvidia*) device files.
    type: path
    default: /dev
  cgroup_root:
    description: Mount point of the cgroup file system.
    type: path
    default: /sys/fs/cgroup
  shm_dir:
    description: Shared-memory directory to clean.
    type: path
    default: /dev/shm
  shm_patterns:
    description: Names (shell wildcards) of engine shared-memory entries that may be removed.
    type: list
    elements: str
    default: ['nccl-*', 'psm_*', 'sem.mp-*', 'torch_*', 'multi_tokenizer_*']
  shm_owner:
    description: Remove only entries owned by these users (names or uids); empty means the O(service_users).
    type: list
    elements: str
    default: []
  clean_shm:
    description: Whether to clean O(shm_dir) at all.
    type: bool
    default: true
  fail_on_foreign_holders:
    description: Fail when a process that is not a target uses a selected GPU for compute (also one whose
      PID is not visible here).
    type: bool
    default: false
  scope:
    description: C(default) (engine processes of O(service_users) outside user sessions and containers) or
      C(host) (engine processes of any user in this PID namespace, still never in a container); see above.
    type: str
    choices: [default, host]
    default: default
  service_users:
    description: The engines' service users (names or uids); names that are no user on this host are skipped. The
      gpu_release role passes every engine's C(service_user) from the engine roster.
    type: list
    elements: str
    required: true
  stop_units:
    description: Stop and disable O(units) first (systemd only) and check afterwards that they are down.
    type: bool
    default: false
  disable_units:
    description:
      - With O(stop_units), whether the units are disabled too. A deploy's switch keeps them enabled, so a reboot
        before the new release has passed its gate starts the release that served before it.
    type: bool
    default: true
  report_only:
    description: Only report targets, foreign processes and GPU holders; change nothing.
    type: bool
    default: false
  nvidia_smi_timeout_s:
    description: Seconds after which one nvidia-smi call (or calls started together) is killed and reported.
    type: float
    default: 10
  idle_memory_mib:
    description: Memory (MiB) an idle GPU with no process may show; more, with no compute process listed, is
      suspicious (raise it for a GPU that drives a display).
    type: int
    default: 256
  wedged_window_s:
    description: Seconds over which a suspicious GPU is read again before it is called wedged.
    type: float
    default: 1.5
  state_dir:
    description: engine_service's state directory (C(state.json), C(releases/)); see the description. Unset - no
      record keeping.
    type: path
  lock_file:
    description:
      - An exclusive lock on this file is held while the module stops and signals (not in check mode, nor with
        O(report_only)), so two teardowns of one host, or a teardown beside a deploy's switch, never run at once.
        Opened without following a link; refused when another user made it.
    type: path
    default: /run/lock/llm-serving-release.lock
  lock_timeout_s:
    description:
      - Seconds to wait for the lock before failing, naming it and its holder, with nothing changed (0 - one try).
    type: float
    default: 120.0
notes:
  - Check mode reports what would be signalled and removed and touches nothing.
  - Processes in other PID namespaces are invisible to C(/proc) here; their compute apps are reported as
    unattributed.
  - Signals go through a pidfd opened after checking the PID's start time, so a reused PID is never signalled.
seealso:
  - module: blackwell.serving.gpu_facts
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: partial
    details: With O(state_dir), the change of C(state.json).
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Release the GPUs held by the engine units and stray engine processes
  blackwell.serving.gpu_release:
    units: "{{ query('blackwell.serving.engine_roster', 'unit') }}"
    patterns: "{{ query('blackwell.serving.engine_roster', 'process_patterns') }}"
    service_users: "{{ query('blackwell.serving.engine_roster', 'service_user') }}"
    grace_s: 10

- name: Before a switch, fail naming any foreign process on the GPUs the engine needs
  blackwell.serving.gpu_release:
    units: [sglang.service, vllm.service]
    patterns: ["sglang::*", "sglang serve", "VLLM::*", "vllm serve"]
    service_users: [sglang, vllm]
    gpus: ["0", "1"]
    report_only: true
    fail_on_foreign_holders: true

- name: Engines started by hand over ssh (any user, in a login session)
  blackwell.serving.gpu_release:
    units: []
    patterns: "{{ query('blackwell.serving.engine_roster', 'process_patterns') }}"
    service_users: []
    scope: host

- name: Teardown - stop and disable the units, release, record in state.json that nothing serves
  blackwell.serving.gpu_release:
    units: "{{ query('blackwell.serving.engine_roster', 'unit') }}"
    patterns: "{{ query('blackwell.serving.engine_roster', 'process_patterns') }}"
    service_users: "{{ query('blackwell.serving.engine_roster', 'service_user') }}"
    stop_units: true
    state_dir: /var/lib/llm-serving

- name: Tests point it at a GPU simulator and stand-in device files
  blackwell.serving.gpu_release:
    units: [engine.service]
    patterns: ["engine::*"]
    service_users: [engine]
    nvidia_smi: /tmp/sim/nvidia-smi
    driver_proc_dir: /tmp/sim/proc-driver-nvidia
    dev_dir: /tmp/sim/dev
    shm_dir: /tmp/sim/shm
    grace_s: 1
"""

RETURN = r"""
gpu_verification:
  description: C(done) when GPUs were checked with nvidia-smi, else C(skipped).
  returned: always
  type: str
gpu_verification_reason:
  description: Why verification was skipped (which of nvidia-smi and the driver is missing).
  returned: always
  type: str
driver_loaded:
  description: Whether the NVIDIA kernel driver is loaded.
  returned: always
  type: bool
gpus:
  description: Per GPU - index, uuid, bus_id, minor, memory_used_before_mib, memory_used_after_mib, freed_mib,
    holders (pid, ppid, user, title, role target/spared/foreign/monitor/peer, compute, used_mib), apps_after
    (compute apps nvidia-smi lists after the release - pid, name as a title, used_mib), clean.
  returned: always
  type: list
  elements: dict
targets:
  description: Selected processes - pid, ppid, user, title (see the description; never the arguments), reason,
    gpus, signals sent, exited (bool), exit_s after SIGTERM.
  returned: always
  type: list
  elements: dict
signalled:
  description: PIDs sent SIGTERM (TERM) and SIGKILL (KILL); in check mode what would be sent.
  returned: always
  type: dict
scope:
  description: The scope used (default or host).
  returned: always
  type: str
scope_description:
  description: One line saying what the scope takes as targets.
  returned: always
  type: str
service_users:
  description: O(service_users) found on this host (present) and not (absent).
  returned: always
  type: dict
units:
  description:
    - With O(stop_units) - service_manager, disable (O(disable_units)), per unit its state after the stop, stopped,
      disabled, reset_failed.
  returned: always
  type: dict
units_left:
  description: Units still running, enabled (with O(disable_units)) or with processes in their cgroups, after it.
  returned: always
  type: list
  elements: str
driver_version:
  description: The NVIDIA driver version nvidia-smi reports (null without one).
  returned: always
  type: str
gpu_count:
  description: GPUs nvidia-smi lists.
  returned: always
  type: int
foreign:
  description: Processes that match an engine pattern or use a GPU for compute but are not ours - pid, ppid,
    user, title, reason (why out of scope), gpus; never signalled.
  returned: always
  type: list
  elements: dict
spared:
  description: Processes that matched or hold a GPU but were not signalled - pid, ppid, user, title, reason.
  returned: always
  type: list
  elements: dict
foreign_holders:
  description: Processes that are not targets and use a GPU for compute - pid, ppid, user, title, gpus, holds_uvm,
    reason; never signalled.
  returned: always
  type: list
  elements: dict
unattributed_apps:
  description: Compute apps nvidia-smi lists whose PID is not visible here (left after O(settle_s)) - pid, name
    (nvidia-smi's process name, cut as a title is), used_mib, gpu_uuid, bus_id, gpu_index.
  returned: always
  type: list
  elements: dict
shm:
  description: removed, would_remove (check mode) and kept (path, reason) entries of O(shm_dir).
  returned: always
  type: dict
elapsed_s:
  description: Seconds the module took.
  returned: always
  type: float
release_s:
  description: Seconds from SIGTERM until no target was alive or listed on a GPU (null when none signalled).
  returned: always
  type: float
wedged:
  description: GPUs busy with no compute process over O(wedged_window_s) - index, uuid, bus_id, readings
    (utilization_pct, memory_used_mib), seconds, text.
  returned: always
  type: list
  elements: dict
nvidia_smi_error:
  description: Why nvidia-smi gave no answer (a timeout), empty when it answered.
  returned: always
  type: str
release:
  description: With O(state_dir) - id, engine, profile, unit of the release state.json names as current (or
    none), state.json before and after, and whether it changed.
  returned: when O(state_dir) is set
  type: dict
summary:
  description: Human-readable lines, one screen.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release.release import (
    ARGUMENT_SPEC,
    ReleaseError,
    release,
)
from ansible_collections.blackwell.serving.plugins.module_utils.host.lock import HostLockError, host_lock
from ansible_collections.blackwell.serving.plugins.module_utils.nvidia.smi import NvidiaError


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    if p["grace_s"] < 0 or p["timeout_s"] <= 0 or p["timeout_s"] < p["grace_s"]:
        module.fail_json(
            msg=f"need 0 <= grace_s <= timeout_s and timeout_s > 0 (grace_s={p['grace_s']}, timeout_s={p['timeout_s']})"
        )
    if p["poll_interval_ms"] < 1:
        module.fail_json(msg="poll_interval_ms must be >= 1")
    try:
        if module.check_mode or p["report_only"]:
            result = release(module)
        else:
            with host_lock(p["lock_file"], p["lock_timeout_s"], "gpu_release"):
                result = release(module)
    except (ReleaseError, NvidiaError, HostLockError) as exc:
        module.fail_json(msg=str(exc))
    if "msg" in result:
        msg = result.pop("msg")
        module.fail_json(msg=msg, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
