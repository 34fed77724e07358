"""plugins/module_utils/host/systemd.py, the one reader of unit state: one `systemctl show` for all units, by unit
name."""

from __future__ import annotations

import pytest

from tests.module_utils_loader import use_repository_module_utils

use_repository_module_utils()
from ansible_collections.blackwell.serving.plugins.module_utils.host import systemd as bws_systemd  # noqa: E402

SHOWN = "Id=sglang.service\nLoadState=loaded\nActiveState=active\n\nId=vllm.service\nLoadState=not-found\n"


def test_one_call_for_all_units_keyed_by_the_names_asked_for():
    calls = []
    shown = bws_systemd.show_units(["sglang.service", "vllm.service"], ("LoadState", "ActiveState"),
                                   systemctl="/bin/systemctl", run=lambda argv: calls.append(argv) or (0, SHOWN, ""))
    assert calls == [["/bin/systemctl", "show", "--property=Id,LoadState,ActiveState", "sglang.service",
                      "vllm.service"]]
    assert shown["sglang.service"]["ActiveState"] == "active"
    assert shown["vllm.service"] == {"Id": "vllm.service", "LoadState": "not-found"}


def test_a_failing_systemctl_is_an_error_that_names_it():
    with pytest.raises(bws_systemd.SystemdError, match=r"systemctl show sglang.service failed \(rc=1\): boom"):
        bws_systemd.show_units(["sglang.service"], systemctl="/bin/systemctl", run=lambda argv: (1, "", "boom\n"))


def test_a_systemctl_that_does_not_answer_in_time_is_an_error(tmp_path):
    slow = tmp_path / "systemctl"
    slow.write_text("#!/bin/sh\nsleep 5\n")
    slow.chmod(0o755)
    with pytest.raises(bws_systemd.SystemdError, match=r"did not answer within 0\.2 s"):
        bws_systemd.show_units(["sglang.service"], timeout=0.2, systemctl=str(slow))


def test_unit_properties_is_empty_where_systemd_does_not_run_or_answer(monkeypatch, tmp_path):
    monkeypatch.setattr(bws_systemd, "systemctl_here", lambda: None)
    assert bws_systemd.unit_properties("sglang.service", ("ActiveState",)) == {}
    failing = tmp_path / "systemctl"
    failing.write_text("#!/bin/sh\necho 'Failed to connect to bus' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setattr(bws_systemd, "systemctl_here", lambda: str(failing))
    assert bws_systemd.unit_properties("sglang.service", ("ActiveState",)) == {}
