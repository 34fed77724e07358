"""The verify role's argument spec documents every default and only prefixed, typed options."""

from __future__ import annotations

from pathlib import Path

import yaml

ROLE = Path(__file__).resolve().parents[2] / "roles" / "verify"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def options() -> dict:
    return load(ROLE / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]


def test_every_default_is_a_documented_option():
    assert set(load(ROLE / "defaults" / "main.yml")) - set(options()) == set()


def test_every_option_is_prefixed_typed_and_described():
    for name, spec in options().items():
        assert name.startswith("verify_"), name
        assert spec.get("type"), name
        assert spec.get("description"), name


def test_the_api_key_is_no_log():
    assert options()["verify_api_key"]["no_log"] is True


def test_internal_variables_are_double_underscored():
    assert all(name.startswith("__verify_") for name in load(ROLE / "vars" / "main.yml"))
