"""plugins/module_utils/host/pcie.py and the pcie_facts module on constructed lspci -vvv and iommu_groups fixtures.

The harmful ACS bits are ReqRedir+ / CmpltRedir+ in ACSCtl; SrcValid+ (and what ACSCap merely offers) is
harmless and must not be reported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
from tests.module_utils_loader import use_repository_module_utils  # noqa: E402

use_repository_module_utils()
sys.path.insert(0, str(REPO / "plugins" / "modules"))

import pcie_facts  # noqa: E402
from ansible.module_utils.testing import patch_module_args  # noqa: E402
from ansible_collections.blackwell.serving.plugins.module_utils.host import pcie as bws_pcie  # noqa: E402

FIX = REPO / "tests" / "fixtures" / "pcie"
SWITCH = FIX / "lspci-vvv-switch-redirect-constructed.txt"
SRCVALID = FIX / "lspci-vvv-srcvalid-only-constructed.txt"
GROUPS_DMA = FIX / "iommu-groups-dma-fq-constructed"
GROUPS_IDENTITY = FIX / "iommu-groups-identity-constructed"
GROUPS_UNTYPED = FIX / "iommu-groups-untyped-constructed"
PLAIN_CMDLINE = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet"


def test_redirecting_switch_ports_are_found_and_srcvalid_is_not():
    devices = {d["bdf"]: d for d in bws_pcie.parse_acs(SWITCH.read_text())}
    assert sorted(devices) == ["0000:00:01.1", "0000:02:00.0", "0000:02:01.0"]
    assert devices["0000:00:01.1"]["acs_ctl"]["SrcValid"] is True
    assert devices["0000:00:01.1"]["redirecting"] == []
    assert devices["0000:02:00.0"]["redirecting"] == ["ReqRedir", "CmpltRedir"]
    assert devices["0000:02:01.0"]["redirecting"] == ["CmpltRedir"]
    assert "PEX890xx" in devices["0000:02:00.0"]["description"]
    assert [d["bdf"] for d in bws_pcie.redirecting_ports(SWITCH.read_text())] == ["0000:02:00.0", "0000:02:01.0"]


def test_harmless_bits_and_capabilities_only_are_not_redirection():
    devices = bws_pcie.parse_acs(SRCVALID.read_text())
    # Domain-less lspci output gets domain 0000; ACSCap offers ReqRedir+/CmpltRedir+ but ACSCtl has them off.
    assert [d["bdf"] for d in devices] == ["0000:00:01.1", "0000:00:01.2"]
    assert devices[0]["acs_ctl"] == {"SrcValid": True, "TransBlk": True, "ReqRedir": False, "CmpltRedir": False,
                                     "UpstreamFwd": True, "EgressCtrl": False, "DirectTrans": False}
    assert bws_pcie.redirecting_ports(SRCVALID.read_text()) == []


def test_typed_groups_decide_the_mode_per_gpu():
    groups = bws_pcie.read_iommu_groups(str(GROUPS_DMA))
    assert [g["group"] for g in groups] == ["7", "8", "12"]
    everything = bws_pcie.iommu_mode("iommu=pt", groups)  # the type files win over the command line
    assert everything["mode"] == "translated"
    assert everything["source"] == "iommu_groups/*/type"
    assert everything["translated_devices"] == ["0000:00:01.1", "0000:03:00.0"]
    gpu_in_identity_group = bws_pcie.iommu_mode(PLAIN_CMDLINE, groups, ["0000:04:00.0"])
    assert gpu_in_identity_group["mode"] == "passthrough"
    gpu_translated = bws_pcie.iommu_mode(PLAIN_CMDLINE, groups, ["04:00.0", "0000:03:00.0"])
    assert gpu_translated["mode"] == "translated"
    assert gpu_translated["translated_devices"] == ["0000:03:00.0"]
    identity = bws_pcie.iommu_mode(PLAIN_CMDLINE, bws_pcie.read_iommu_groups(str(GROUPS_IDENTITY)))
    assert identity["mode"] == "passthrough"


@pytest.mark.parametrize(("cmdline", "mode"), [
    (PLAIN_CMDLINE, "translated"),
    ("ro quiet iommu=pt", "passthrough"),
    ("ro intel_iommu=on iommu=pt", "passthrough"),
    ("ro iommu.passthrough=1", "passthrough"),
    ("ro amd_iommu=off", "off"),
    ("ro intel_iommu=off", "off"),
    ("ro iommu=off", "off"),
    ("ro myiommu=pt", "translated"),
])
def test_untyped_groups_fall_back_to_the_command_line(cmdline, mode):
    groups = bws_pcie.read_iommu_groups(str(GROUPS_UNTYPED))
    assert all(g["type"] is None for g in groups)
    result = bws_pcie.iommu_mode(cmdline, groups)
    assert result["mode"] == mode
    assert result["source"] == "kernel command line"


def test_no_groups_means_no_iommu(tmp_path):
    assert bws_pcie.iommu_mode(PLAIN_CMDLINE, bws_pcie.read_iommu_groups(str(tmp_path / "absent")))["mode"] == "off"


def test_findings_name_ports_bits_and_fix():
    facts = bws_pcie.gather(SWITCH.read_text(), PLAIN_CMDLINE, str(GROUPS_DMA))
    iommu_msg, acs_msg = facts["findings"]
    assert "add iommu=pt to GRUB_CMDLINE_LINUX" in iommu_msg
    assert "0000:02:00.0 (ReqRedir+ CmpltRedir+)" in acs_msg and "0000:02:01.0 (CmpltRedir+)" in acs_msg
    assert "0000:00:01.1" not in acs_msg
    assert "ECAP_ACS+6.w=0000" in acs_msg
    assert "docs/provisioning.md" in facts["fix"]
    clean = bws_pcie.gather(SRCVALID.read_text(), "ro iommu=pt", str(GROUPS_IDENTITY))
    assert clean["findings"] == [] and clean["acs"]["ports_with_acs"] == 2
    noacs = bws_pcie.gather(SWITCH.read_text(), "ro iommu=pt pci=noacs", str(GROUPS_IDENTITY))
    assert noacs["findings"] == [] and noacs["acs"]["disabled_by_cmdline"] is True


def write_lspci(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "lspci"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def run_main(args: dict, capsys) -> tuple[int, dict]:
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        pcie_facts.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


def test_module_reports_redirection_from_lspci(tmp_path, capsys):
    cmdline = tmp_path / "cmdline"
    cmdline.write_text(PLAIN_CMDLINE + "\n")
    lspci = write_lspci(tmp_path, f'[ "$1 $2" = "-D -vvv" ] || exit 3\ncat {SWITCH}')
    rc, result = run_main({"lspci": str(lspci), "cmdline_file": str(cmdline),
                           "iommu_groups_dir": str(GROUPS_DMA), "devices": ["0000:03:00.0"]}, capsys)
    assert rc == 0 and result["changed"] is False
    assert result["iommu"]["mode"] == "translated"
    assert [p["bdf"] for p in result["acs"]["redirecting"]] == ["0000:02:00.0", "0000:02:01.0"]
    assert len(result["findings"]) == 2


def test_module_without_lspci_says_not_checked(tmp_path, capsys):
    cmdline = tmp_path / "cmdline"
    cmdline.write_text("ro iommu=pt\n")
    rc, result = run_main({"lspci": str(tmp_path / "no-lspci"), "cmdline_file": str(cmdline),
                           "iommu_groups_dir": str(GROUPS_UNTYPED)}, capsys)
    assert rc == 0
    assert result["acs"]["checked"] is False and result["findings"] == []


def test_module_hung_lspci_ends_at_its_timeout(tmp_path, capsys):
    cmdline = tmp_path / "cmdline"
    cmdline.write_text(PLAIN_CMDLINE)
    lspci = write_lspci(tmp_path, "exec sleep 30")
    rc, result = run_main({"lspci": str(lspci), "cmdline_file": str(cmdline), "timeout_s": 1,
                           "iommu_groups_dir": str(GROUPS_UNTYPED)}, capsys)
    assert rc == 1 and result["failed"] is True
    assert "did not finish within 1 s" in result["msg"]
