"""The provisioning roles' argument specs and defaults agree, so a typo check can rely on the specs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
PROVISION_ROLES = ["nvidia_driver", "cuda_toolkit", "python_env", "host_preflight"]


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("role", PROVISION_ROLES)
def test_every_default_is_a_documented_option(role: str) -> None:
    defaults = set(load(ROLES / role / "defaults" / "main.yml"))
    options = set(load(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"])
    assert defaults <= options, f"undocumented defaults: {sorted(defaults - options)}"
    required = {
        name
        for name, spec in load(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]["main"][
            "options"
        ].items()
        if spec.get("required")
    }
    assert options - defaults == required, f"options without a default: {sorted(options - defaults - required)}"


@pytest.mark.parametrize("role", PROVISION_ROLES)
def test_every_option_is_prefixed_and_typed(role: str) -> None:
    specs = load(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]
    for entry_point, spec in specs.items():
        for name, option in spec.get("options", {}).items():
            assert name.startswith(f"{role}_") or name.startswith("nvidia_driver_"), (entry_point, name)
            assert option.get("type"), (entry_point, name)
            assert option.get("description"), (entry_point, name)
            if option["type"] == "list":
                assert option.get("elements"), (entry_point, name)


def test_entry_point_options_are_subsets_of_main() -> None:
    for role in PROVISION_ROLES:
        specs = load(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]
        main = specs["main"]["options"]
        for entry_point, spec in specs.items():
            for name, option in spec.get("options", {}).items():
                assert main.get(name, {}).get("type") == option["type"], (role, entry_point, name)
