"""The sglang role's unit environment, as its task computes it: the role's switches put SGLang's variables into it.

The task "The SGLang unit's environment, before what the release adds to it" (roles/sglang/tasks/main.yml) is
templated here by Ansible's own templar with the role's defaults, so the test reads the expression the role runs.
The unit and the host-side argument check both get that environment (engine_service_environment; the check runs
with it in roles/engine_service/tasks/release.yml), so the check sees the variables the engine will.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROLE = Path(__file__).resolve().parents[2] / "roles" / "sglang"
TASKS = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text(encoding="utf-8"))
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text(encoding="utf-8"))
SPECS = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))
OPT_IN = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


def task(prefix: str) -> dict[str, Any]:
    return next(t for t in TASKS if t["name"].startswith(prefix))


def unit_environment(**variables: Any) -> dict[str, str]:
    expression = task("The SGLang unit's environment")["ansible.builtin.set_fact"]["__sglang_environment"]
    values = {"sglang_environment": {"HOME": "/var/lib/sglang"},
              "sglang_extra_environment": DEFAULTS["sglang_extra_environment"],
              "sglang_allow_longer_draft_context": DEFAULTS["sglang_allow_longer_draft_context"],
              "__sglang_pcie_ipc_allreduce": False, **variables}
    return Templar(loader=DataLoader(), variables=values).template(trust_as_template(expression))


def test_the_longer_draft_context_opt_in_is_off_by_default_and_declared():
    assert DEFAULTS["sglang_allow_longer_draft_context"] is False
    spec = SPECS["argument_specs"]["main"]["options"]["sglang_allow_longer_draft_context"]
    assert spec["type"] == "bool" and spec["default"] is False
    assert OPT_IN not in unit_environment()


@pytest.mark.parametrize("value", [True, "true", "yes"])
def test_the_opt_in_puts_sglangs_variable_into_the_unit(value):
    assert unit_environment(sglang_allow_longer_draft_context=value) == {"HOME": "/var/lib/sglang", OPT_IN: "1"}


def test_the_opt_in_and_the_pcie_switch_are_independent_and_extra_environment_wins():
    both = unit_environment(sglang_allow_longer_draft_context=True, __sglang_pcie_ipc_allreduce=True)
    assert both[OPT_IN] == "1" and both["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    overridden = unit_environment(sglang_allow_longer_draft_context=True, sglang_extra_environment={OPT_IN: "0"})
    assert overridden[OPT_IN] == "0"


def test_the_unit_and_the_argument_check_get_that_environment():
    release = task("Release, start and gate SGLang")["vars"]
    assert release["engine_service_environment"].startswith("{{ __sglang_environment | combine(")
