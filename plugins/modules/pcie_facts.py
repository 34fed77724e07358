#!/usr/bin/python
"""Ansible module: PCIe ACS redirection and IOMMU mode, the settings that hang NCCL over PCIe (stdlib only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pcie_facts
short_description: Report PCIe ports with ACS redirection and the IOMMU mode
description:
  - Runs C(lspci -D -vvv) (under a timeout) and reports every PCIe port whose ACS control register has
    C(ReqRedir+) or C(CmpltRedir+), the bits that force GPU peer-to-peer traffic through the root complex
    and IOMMU. C(SrcValid+) and the other ACS bits are harmless for peer-to-peer and are not reported.
  - Reads C(/sys/kernel/iommu_groups) (group C(type) files, Linux 5.11 and later) and the kernel command line
    to tell whether the IOMMU is off, in pass-through or translating DMA.
  - lspci shows the ACS capability only to root; run it with become. Without lspci the ACS part is reported
    as not checked, not as clean.
  - Read-only; safe in check mode. The parsing lives in plugins/module_utils/host/pcie.py, which the interconnect proof
    script uses too.
options:
  lspci:
    description: lspci to run (a name in PATH or a path).
    type: str
    default: lspci
  timeout_s:
    description: Seconds lspci may take; past it the module fails, saying so.
    type: int
    default: 30
  cmdline_file:
    description: Kernel command line file.
    type: path
    default: /proc/cmdline
  iommu_groups_dir:
    description: IOMMU groups directory in sysfs.
    type: path
    default: /sys/kernel/iommu_groups
  devices:
    description: PCI bus ids (for example the GPUs) whose IOMMU groups decide the mode; empty means all groups.
    type: list
    elements: str
    default: []
author: the blackwell-llm-serving authors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Find ACS redirection and the IOMMU mode
  pcie_facts:
    devices: "{{ host_preflight_gpus }}"
  become: true
  register: pcie
"""

RETURN = r"""
iommu:
  description: IOMMU mode (off, passthrough, translated), what decided it, translated devices, command-line flags.
  returned: always
  type: dict
acs:
  description: Whether lspci ran (checked), how many ports have ACS, the redirecting ones (bdf, description, bits).
  returned: always
  type: dict
findings:
  description: One message per setting that can hang NCCL, each with its fix; empty when none.
  returned: always
  type: list
  elements: str
fix:
  description: Where the documentation describes the fix (docs/provisioning.md).
  returned: always
  type: str
"""

import os
import shutil
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.host.pcie import gather


def run_lspci(module: AnsibleModule, lspci: str, timeout_s: int) -> str | None:
    path = lspci if "/" in lspci else shutil.which(lspci, path="/usr/bin:/usr/sbin:/bin:/sbin")
    if not path or not os.access(path, os.X_OK):
        return None
    try:
        proc = subprocess.run([path, "-D", "-vvv"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        module.fail_json(msg=f"lspci -D -vvv did not finish within {timeout_s} s (timeout_s); a PCIe device or "
                             "its config space may be hung. Nothing was changed.")
    if proc.returncode != 0:
        module.fail_json(msg=f"lspci -D -vvv failed (rc {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return proc.stdout


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "lspci": {"type": "str", "default": "lspci"},
            "timeout_s": {"type": "int", "default": 30},
            "cmdline_file": {"type": "path", "default": "/proc/cmdline"},
            "iommu_groups_dir": {"type": "path", "default": "/sys/kernel/iommu_groups"},
            "devices": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        with open(params["cmdline_file"], encoding="utf-8") as handle:
            cmdline = handle.read().strip()
    except OSError as exc:
        module.fail_json(msg=f"cannot read {params['cmdline_file']}: {exc.strerror}")
    facts = gather(run_lspci(module, params["lspci"], params["timeout_s"]), cmdline,
                   params["iommu_groups_dir"], params["devices"])
    module.exit_json(changed=False, **facts)


if __name__ == "__main__":
    main()
