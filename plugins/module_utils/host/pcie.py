# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""PCIe ACS and IOMMU facts that decide whether GPU peer-to-peer traffic can hang NCCL (stdlib only).

One parser, used by the pcie_facts module (host preflight) and by the interconnect proof script, which is
shipped beside it to the host.

ACS (Access Control Services) on a PCIe switch or root port: the harmful bits are the redirections in the
*control* register, ``ReqRedir+`` (P2P request redirect) and ``CmpltRedir+`` (P2P completion redirect),
which force peer-to-peer traffic up to the root complex and through the IOMMU: the cause of NCCL hangs
after init on PCIe Blackwell hosts (NVIDIA/nccl issues 1999 and 2079, vllm issue 33041). ``SrcValid+``
(source validation) and the other bits do not redirect P2P traffic; ``ACSCap`` lists what a port could do,
not what it does.

IOMMU mode: ``/sys/kernel/iommu_groups/<n>/type`` (Linux >= 5.11) says per group whether DMA is
translated (``DMA``, ``DMA-FQ``) or passed through (``identity``); without that file the kernel command
line decides (``iommu=pt``/``iommu.passthrough=1`` pass-through; ``iommu=off``, ``intel_iommu=off``,
``amd_iommu=off`` off). No IOMMU groups at all means no IOMMU is active.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

HARMFUL_ACS_BITS = ("ReqRedir", "CmpltRedir")
PASSTHROUGH_TYPES = ("identity",)
TRANSLATED_TYPES = ("DMA", "DMA-FQ")
# lspci -vvv device header: "0000:00:01.1 PCI bridge: ..." (-D) or "00:01.1 PCI bridge: ..." (domain 0).
_DEVICE_HEADER = re.compile(r"^(?P<bdf>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(?P<desc>.*)$")
_ACS_BIT = re.compile(r"([A-Za-z]+)([+-])")
FIX_HINT = ("docs/provisioning.md, section 'Interconnect: IOMMU and ACS': disable ACS (BIOS, pci=noacs, or "
            "setpci -s <port> ECAP_ACS+6.w=0000) and put the IOMMU in pass-through (iommu=pt) or off")


def normalize_bdf(bdf: str) -> str:
    """``00:01.1`` -> ``0000:00:01.1``; lower case."""
    bdf = bdf.strip().lower()
    return bdf if bdf.count(":") == 2 else f"0000:{bdf}"


def parse_acs(lspci_vvv: str) -> list[dict[str, Any]]:
    """Every device of ``lspci -vvv`` output that has an ``ACSCtl:`` line, with its control bits.

    Returns ``[{bdf, description, acs_ctl: {bit: bool}, redirecting: [harmful bits that are on]}]``.
    """
    devices: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in lspci_vvv.splitlines():
        header = _DEVICE_HEADER.match(line)
        if header and not line[:1].isspace():
            current = {"bdf": normalize_bdf(header["bdf"]), "description": header["desc"].strip()}
            continue
        stripped = line.strip()
        if current is None or not stripped.startswith("ACSCtl:"):
            continue
        bits = {name: sign == "+" for name, sign in _ACS_BIT.findall(stripped[len("ACSCtl:"):])}
        devices.append({**current, "acs_ctl": bits,
                        "redirecting": [bit for bit in HARMFUL_ACS_BITS if bits.get(bit)]})
    return devices


def redirecting_ports(lspci_vvv: str) -> list[dict[str, Any]]:
    """The devices whose ACS control has ``ReqRedir+`` or ``CmpltRedir+``."""
    return [device for device in parse_acs(lspci_vvv) if device["redirecting"]]


def cmdline_iommu_flags(cmdline: str) -> dict[str, str]:
    """The IOMMU-related parameters of a kernel command line, by name."""
    names = ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict", "pci")
    flags: dict[str, str] = {}
    for word in cmdline.split():
        name, _, value = word.partition("=")
        if name in names:
            flags[name] = value
    return flags


def read_iommu_groups(groups_dir: str) -> list[dict[str, Any]]:
    """``[{group, type (None when the kernel has no type file), devices: [bdf]}]`` from sysfs."""
    try:
        names = sorted(os.listdir(groups_dir), key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n))
    except OSError:
        return []
    groups = []
    for name in names:
        path = os.path.join(groups_dir, name)
        try:
            with open(os.path.join(path, "type"), encoding="utf-8") as handle:
                kind: str | None = handle.read().strip()
        except OSError:
            kind = None
        try:
            devices = sorted(normalize_bdf(d) for d in os.listdir(os.path.join(path, "devices")))
        except OSError:
            devices = []
        groups.append({"group": name, "type": kind, "devices": devices})
    return groups


def iommu_mode(cmdline: str, groups: list[dict[str, Any]], devices: list[str] | None = None) -> dict[str, Any]:
    """IOMMU mode for ``devices`` (bus ids; all groups when empty): off, passthrough or translated.

    Returns ``{mode, source, translated_devices, flags}``; ``source`` says what decided it.
    """
    flags = cmdline_iommu_flags(cmdline)
    wanted = {normalize_bdf(d) for d in devices or []}
    relevant = [g for g in groups if not wanted or wanted & set(g["devices"])]
    typed = [g for g in relevant if g["type"]]
    if not groups:
        return {"mode": "off", "source": "no IOMMU groups in sysfs", "translated_devices": [], "flags": flags}
    if typed:
        translated = [g for g in typed if g["type"] in TRANSLATED_TYPES]
        devices_out = sorted(d for g in translated for d in g["devices"] if not wanted or d in wanted)
        mode = "translated" if translated else "passthrough"
        return {"mode": mode, "source": "iommu_groups/*/type", "translated_devices": devices_out, "flags": flags}
    if flags.get("iommu") == "off" or "off" in (flags.get("intel_iommu"), flags.get("amd_iommu")):
        mode = "off"
    elif flags.get("iommu") == "pt" or flags.get("iommu.passthrough") in ("1", "y", "on"):
        mode = "passthrough"
    else:
        mode = "translated"
    return {"mode": mode, "source": "kernel command line", "translated_devices": [], "flags": flags}


def findings(iommu: dict[str, Any], redirecting: list[dict[str, Any]], acs_disabled_by_cmdline: bool) -> list[str]:
    """Human messages for what can hang NCCL peer-to-peer traffic, each with its fix."""
    messages = []
    if iommu["mode"] == "translated":
        messages.append(
            f"IOMMU translates DMA ({iommu['source']}): NCCL peer-to-peer traffic between GPUs goes through the "
            "IOMMU and is known to hang after NCCL init on PCIe Blackwell hosts. Fix: add iommu=pt to "
            "GRUB_CMDLINE_LINUX in /etc/default/grub, run update-grub and reboot (or disable VT-d/AMD-Vi in the BIOS).")
    if redirecting and not acs_disabled_by_cmdline:
        ports = ", ".join(f"{d['bdf']} ({'+ '.join(d['redirecting'])}+)" for d in redirecting)
        messages.append(
            f"ACS redirection is on for PCIe port(s) {ports}: GPU peer-to-peer traffic is forced up to the root "
            "complex and NCCL can hang. Fix: disable ACS in the BIOS, or boot with pci=noacs where the kernel "
            "supports it, or at runtime `setpci -s <port> ECAP_ACS+6.w=0000` for each port (lost at reboot); "
            "NCCL_P2P_DISABLE=1 is the slow workaround.")
    return messages


def gather(lspci_text: str | None, cmdline: str, groups_dir: str,
           devices: list[str] | None = None) -> dict[str, Any]:
    """Everything above in one JSON-able dict; ``lspci_text`` None when lspci could not run."""
    iommu = iommu_mode(cmdline, read_iommu_groups(groups_dir), devices)
    acs = parse_acs(lspci_text) if lspci_text is not None else []
    redirecting = [d for d in acs if d["redirecting"]]
    noacs = "noacs" in cmdline_iommu_flags(cmdline).get("pci", "").split(",")
    return {
        "iommu": iommu,
        "acs": {"checked": lspci_text is not None, "ports_with_acs": len(acs),
                "redirecting": [{k: d[k] for k in ("bdf", "description", "redirecting")} for d in redirecting],
                "disabled_by_cmdline": noacs},
        "findings": findings(iommu, redirecting, noacs),
        "fix": FIX_HINT,
    }


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


FABRIC_SOURCES = {"cmdline": "/proc/cmdline", "boot_id": "/proc/sys/kernel/random/boot_id",
                  "iommu_groups": "/sys/kernel/iommu_groups", "lspci": "lspci"}


def lspci_text(program: str) -> str | None:
    try:
        listing = subprocess.run([program, "-vvv"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return listing.stdout if listing.returncode == 0 else None


def fabric_facts(sources: dict[str, str]) -> dict[str, Any]:
    """What the proof's result depends on beside the GPUs and the environment, as read now."""
    where = {**FABRIC_SOURCES, **{k: v for k, v in sources.items() if v}}
    cmdline = _read(where["cmdline"]).strip()
    pcie = gather(lspci_text(where["lspci"]), cmdline, where["iommu_groups"])
    acs = pcie["acs"]
    return {"boot_id": _read(where["boot_id"]).strip(), "cmdline": cmdline,
            "iommu_mode": pcie["iommu"]["mode"],
            "acs_redirecting": sorted(f"{p['bdf']} {'+'.join(p['redirecting'])}+" for p in acs["redirecting"])
            if acs["checked"] else "not checked (lspci -vvv did not run)"}
