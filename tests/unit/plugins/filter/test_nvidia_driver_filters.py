"""The nvidia_driver role's parsers (plugins/filter/nvidia_driver.py), each against the Jinja
expression it replaced in roles/nvidia_driver/tasks/, rendered by Ansible's own templar on the same inputs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

REPO = Path(__file__).resolve().parents[4]
_SPEC = importlib.util.spec_from_file_location("nvidia_driver_filters",
                                               REPO / "plugins/filter/nvidia_driver.py")
filters = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(filters)

# The expressions as they were in roles/nvidia_driver/tasks/repository.yml and activate.yml.
OLD_FINGERPRINTS = """
{%- set ns = namespace(prev='', out=[]) -%}
{%- for line in lines -%}
{%-   set field = line.split(':') -%}
{%-   if field[0] == 'fpr' and ns.prev == 'pub' -%}{%- set ns.out = ns.out + [field[9]] -%}{%- endif -%}
{%-   set ns.prev = field[0] -%}
{%- endfor -%}
{{ ns.out }}"""
OLD_LOADED = ("{{ text | regex_search('Kernel Module(?: for \\S+)?\\s+([0-9]+\\.[0-9]+(?:\\.[0-9]+)?)', '\\1')"
              " | default([''], true) | first }}")
OLD_OPEN = "{{ 'Open Kernel Module' in text }}"
OLD_PACKAGE = "{{ (version | regex_search('^[0-9]+\\.[0-9]+(\\.[0-9]+)?')) | default('', true) }}"
OLD_ROWS = "{{ lines | map('split', ', ') | list }}"

# gpg --batch --with-colons --show-keys of a key with a signing subkey (constructed: the shape gpg 2.2 prints).
KEY_WITH_SUBKEY = [
    "pub:-:4096:1:A4B469963BF863CC:1649365624:::-:::scSC::::::23::0:",
    "fpr:::::::::EB693B3035CD5710E231E123A4B469963BF863CC:",
    "uid:-::::1649365624::5D9C7F8BCE5E3AB7B0E7E2E4A0F2D5A6C3B1E0F9::cudatools <cudatools@nvidia.com>::::::::::0:",
    "sub:-:4096:1:0A4F2C1B9E8D7C6B:1649365624::::::s::::::23:",
    "fpr:::::::::1111222233334444555566660A4F2C1B9E8D7C6B:",
]
TWO_PRIMARY_KEYS = [*KEY_WITH_SUBKEY, "pub:-:255:22:FFFFEEEEDDDDCCCC:1700000000:::-:::scSC::::::ed25519:::0:",
                    "fpr:::::::::AAAABBBBCCCCDDDDEEEEFFFFFFFFEEEEDDDDCCCC:"]
LOADED_TEXTS = [
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16-I3-B03-4-3)"
    "  Tue Sep 23 09:52:31 UTC 2025\nGCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n",
    "NVRM version: NVIDIA UNIX aarch64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025\n",
    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  590.44  Release Build\n",
    "",
    "garbage without a version\n",
]
PACKAGE_VERSIONS = ["580.95.05-0ubuntu1", "580.95.05-1", "590.44-1", "1:580.82.07-1", "", "n/a"]
SMI_LINES = ["00000000:03:00.0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 580.95.05, Enabled",
             "00000000:04:00.0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 580.95.05, Disabled"]


def render(expression: str, **variables):
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))


@pytest.mark.parametrize("lines", [KEY_WITH_SUBKEY, TWO_PRIMARY_KEYS, [], ["tru::1:1700000000:0:3:1:5"]])
def test_primary_fingerprints_as_the_namespace_loop_found_them(lines):
    assert filters.gpg_primary_fingerprints(lines) == render(OLD_FINGERPRINTS, lines=lines)


def test_a_subkey_fingerprint_is_not_a_primary_one():
    assert filters.gpg_primary_fingerprints(KEY_WITH_SUBKEY) == ["EB693B3035CD5710E231E123A4B469963BF863CC"]


@pytest.mark.parametrize("text", LOADED_TEXTS)
def test_loaded_module_version_and_flavour_as_the_regex_found_them(text):
    assert filters.nvidia_loaded_version(text) == render(OLD_LOADED, text=text)
    assert filters.nvidia_loaded_open(text) == render(OLD_OPEN, text=text)


@pytest.mark.parametrize("version", PACKAGE_VERSIONS)
def test_package_version_as_the_regex_found_it(version):
    assert filters.nvidia_package_version(version) == render(OLD_PACKAGE, version=version)


def test_nvidia_smi_rows_as_the_split_made_them():
    assert filters.nvidia_smi_rows(SMI_LINES) == render(OLD_ROWS, lines=SMI_LINES)
