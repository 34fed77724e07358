#!/usr/bin/python
# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: One fact per NVIDIA GPU and the compute processes on each
description:
  - Runs C(nvidia-smi --query-gpu=... --format=csv,noheader,nounits) and C(--query-compute-apps=...) and reads
    C(/proc/driver/nvidia/gpus/*/information) for the device minor (the N of C(/dev/nvidiaN)), which is not
    guaranteed to equal nvidia-smi's index.
  - When nvidia-smi is missing or the driver is not loaded it fails with a message that says which, unless
    O(fail_on_missing=false), in which case it returns RV(driver_loaded), an empty RV(gpus) and RV(reason).
version_added: "0.1.0"
author: the blackwell-llm-serving authors (!UNKNOWN)
options:
  nvidia_smi:
    description: nvidia-smi to run (a name in PATH or a path, for example a GPU simulator in tests).
    type: str
    default: nvidia-smi
  driver_proc_dir:
    description: The NVIDIA driver's /proc directory.
    type: path
    default: /proc/driver/nvidia
  fail_on_missing:
    description: Fail when nvidia-smi or the driver is missing; when false, return RV(available=false).
    type: bool
    default: true
  mig:
    description:
      - Also read each GPU's current MIG mode (one more nvidia-smi query) into RV(gpus[].mig_mode).
    type: bool
    default: false
  pci_only:
    description:
      - Only list the NVIDIA GPUs of the PCI bus from sysfs (RV(pci_devices)), without nvidia-smi; for hosts
        whose driver is not installed yet (provisioning).
    type: bool
    default: false
  sysfs_pci_dir:
    description: Where the kernel lists PCI devices.
    type: path
    default: /sys/bus/pci/devices
  timeout_s:
    description:
      - Seconds each nvidia-smi call may take. Past it the call is killed and the module fails saying so (a hung
        nvidia-smi usually means a wedged GPU or driver), whatever O(fail_on_missing) says.
    type: int
    default: 30
notes:
  - Read-only; check mode returns the same facts.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - blackwell.serving.attributes
seealso:
  - module: blackwell.serving.gpu_release
"""

EXAMPLES = r"""
- name: Read GPU facts
  gpu_facts:
  register: gpu

- name: Every GPU is SM120 with persistence mode on
  ansible.builtin.assert:
    that:
      - gpu.gpus | map(attribute='compute_cap') | unique == ['12.0']
      - gpu.gpus | rejectattr('persistence_mode') | list == []

- name: On hosts that may have no driver
  gpu_facts:
    fail_on_missing: false
  register: gpu
"""

RETURN = r"""
pci_devices:
  description: NVIDIA display and 3D controllers in sysfs (vendor 0x10de, class 0x03xxxx) - bus_id, device.
  returned: always
  type: list
  elements: dict
available:
  description: Whether nvidia-smi answered.
  returned: always
  type: bool
driver_loaded:
  description: Whether the NVIDIA kernel driver is loaded (its /proc directory exists).
  returned: always
  type: bool
reason:
  description: Why facts are not available (empty when they are).
  returned: always
  type: str
nvidia_smi:
  description: Path of the nvidia-smi that was run.
  returned: when available
  type: str
driver_version:
  description: Driver version (when all GPUs agree).
  returned: when available
  type: str
gpu_count:
  description: Number of GPUs.
  returned: always
  type: int
gpus:
  description:
    - One entry per GPU - index, uuid, name, pci_bus_id (as nvidia-smi prints it), bus_id (normalized
      C(0000:00:06.0)), minor (device minor from the driver, null when unknown), minor_source, compute_cap,
      driver_version, memory_used_mib, memory_total_mib, utilization_gpu_pct, persistence_mode (bool), and
      processes (pid, name, used_mib).
    - With O(mig=true) also mig_mode - C(Enabled), C(Disabled), or null where the board has no MIG.
  returned: always
  type: list
  elements: dict
  contains:
    mig_mode:
      description: The GPU's current MIG mode - C(Enabled), C(Disabled), or null where the board has no MIG.
      returned: with O(mig=true)
      type: str
  sample:
    - index: 0
      uuid: GPU-ea82d19a-2c61-37a1-249d-ead4e4c1c48b
      name: NVIDIA H200
      bus_id: "0000:00:06.0"
      minor: 0
      compute_cap: "9.0"
      memory_used_mib: 13114
      memory_total_mib: 143771
      persistence_mode: true
      processes: [{pid: 428, name: /usr/bin/python3, used_mib: 4706}]
processes:
  description: All compute apps (pid, name, used_mib, gpu_uuid, bus_id).
  returned: always
  type: list
  elements: dict
"""

import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.nvidia.smi import (
    MIG_QUERY_ARGS,
    NvidiaError,
    add_mig_modes,
    driver_loaded,
    gather,
    pci_gpus,
)

ARGUMENT_SPEC = {
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
    "driver_proc_dir": {"type": "path", "default": "/proc/driver/nvidia"},
    "fail_on_missing": {"type": "bool", "default": True},
    "timeout_s": {"type": "int", "default": 30},
    "mig": {"type": "bool", "default": False},
    "pci_only": {"type": "bool", "default": False},
    "sysfs_pci_dir": {"type": "path", "default": "/sys/bus/pci/devices"},
}


def timed_runner(timeout_s: int):
    """Run nvidia-smi under a timeout; an expired one is an NvidiaError of kind ``timeout`` that says so."""

    def run(argv):
        try:
            proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise NvidiaError("timeout", f"{' '.join(argv)} did not finish within {timeout_s} s (timeout_s) and was "
                                         "killed: the driver or a GPU is hung; check dmesg for Xid errors, then "
                                         "nvidia-smi -r or a reboot") from exc
        return proc.returncode, proc.stdout, proc.stderr

    return run


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    pci = pci_gpus(params["sysfs_pci_dir"])
    if params["pci_only"]:
        module.exit_json(changed=False, available=False, pci_devices=pci, driver_loaded=driver_loaded(
            params["driver_proc_dir"]), reason="pci_only: nvidia-smi not run", gpu_count=0, gpus=[], processes=[])

    try:
        facts = gather(params["nvidia_smi"], params["driver_proc_dir"], timed_runner(params["timeout_s"]))
    except NvidiaError as exc:
        missing = exc.kind in ("missing_tool", "no_driver")
        if params["fail_on_missing"] or not missing:
            module.fail_json(msg=str(exc), kind=exc.kind, rc=exc.rc, output=exc.output, pci_devices=pci,
                             driver_loaded=driver_loaded(params["driver_proc_dir"]))
        module.exit_json(
            changed=False,
            available=False,
            driver_loaded=exc.kind != "no_driver" and driver_loaded(params["driver_proc_dir"]),
            reason=str(exc),
            gpu_count=0,
            gpus=[],
            processes=[],
            pci_devices=pci,
        )
    if params["mig"]:
        try:
            rc, out, err = timed_runner(params["timeout_s"])([facts["nvidia_smi"], *MIG_QUERY_ARGS])
        except NvidiaError as exc:
            module.fail_json(msg=str(exc), kind=exc.kind)
        if rc != 0:
            module.fail_json(msg=f"nvidia-smi could not report the MIG mode (exit {rc}): {(err or out).strip()}")
        add_mig_modes(facts["gpus"], out)
    module.exit_json(changed=False, available=True, reason="", pci_devices=pci, **facts)


if __name__ == "__main__":
    main()
