"""Parsers of the nvidia_driver role: GPG key listings, the loaded kernel module's version, package versions and
nvidia-smi CSV rows. Unit-tested in tests/unit/plugins/filter/test_nvidia_driver_filters.py, each against the Jinja
expression it replaced."""

from __future__ import annotations

import re
from typing import Any

_LOADED = re.compile(r"Kernel Module(?: for \S+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)")
_PACKAGE = re.compile(r"^[0-9]+\.[0-9]+(\.[0-9]+)?")


def gpg_primary_fingerprints(colon_lines: list[str]) -> list[str]:
    """Fingerprints of the primary keys in `gpg --with-colons --show-keys` output: the `fpr` record right after
    each `pub` record (a subkey's `fpr` follows its `sub`)."""
    found, previous = [], ""
    for line in colon_lines:
        fields = line.split(":")
        if fields[0] == "fpr" and previous == "pub":
            found.append(fields[9])
        previous = fields[0]
    return found


def nvidia_loaded_version(version_text: str) -> str:
    """The version in /proc/driver/nvidia/version ('NVRM version: NVIDIA UNIX Open Kernel Module for x86_64
    580.95.05 ...'); '' when no module is loaded."""
    match = _LOADED.search(version_text or "")
    return match.group(1) if match else ""


def nvidia_loaded_open(version_text: str) -> bool:
    """Whether the loaded module is the open one (Blackwell supports only these)."""
    return "Open Kernel Module" in (version_text or "")


def nvidia_package_version(package_version: Any) -> str:
    """The driver version of a package version ('580.95.05-0ubuntu1' -> '580.95.05'); '' when there is none."""
    match = _PACKAGE.search(str(package_version or ""))
    return match.group(0) if match else ""


def nvidia_smi_rows(lines: list[str]) -> list[list[str]]:
    """`nvidia-smi --format=csv,noheader` lines as lists of fields."""
    return [line.split(", ") for line in lines]


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpg_primary_fingerprints": gpg_primary_fingerprints,
            "nvidia_loaded_version": nvidia_loaded_version,
            "nvidia_loaded_open": nvidia_loaded_open,
            "nvidia_package_version": nvidia_package_version,
            "nvidia_smi_rows": nvidia_smi_rows,
        }
