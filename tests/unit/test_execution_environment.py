"""execution-environment.yml pins what the controller toolchain pins (requirements/controller.txt)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def pins(path: Path) -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return {name.lower(): version for name, _, version in (line.partition("==") for line in lines if line)}


def test_the_execution_environment_pins_the_controller_versions():
    ee = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    controller = pins(REPO / "requirements" / "controller.txt")
    assert ee["version"] == 3
    for key in ("ansible_core", "ansible_runner"):
        name, _, version = ee["dependencies"][key]["package_pip"].partition("==")
        assert controller[name] == version, f"{key}: {name}=={version}, the controller has {controller[name]}"
    python = pins(REPO / ee["dependencies"]["python"])
    assert python, "the execution environment's Python requirements are empty"
    assert {name: controller.get(name) for name in python} == python
    assert ee["dependencies"]["galaxy"] == "requirements.yml"
