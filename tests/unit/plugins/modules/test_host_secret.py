"""plugins/modules/host_secret.py: a secret the host makes once (SGLang's admin key) and keeps where only root reads
it."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from tests.module_utils_loader import run_library_module_file


def run_module(tmp_path: Path, check_mode: bool = False, **args) -> dict:
    return run_library_module_file("host_secret", tmp_path, args, check_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="the file must be root's; the test writes it as the running user")
def test_made_once_kept_root_only_and_read_back_the_same(tmp_path: Path) -> None:
    path = tmp_path / "state" / "sglang-admin-api-key"
    planned = run_module(tmp_path, check_mode=True, path=str(path))
    assert planned["changed"] is True and planned["created"] is True and not path.exists()
    first = run_module(tmp_path, path=str(path))
    assert first["changed"] is True and len(first["secret"]) == 43
    assert base64.urlsafe_b64decode(first["secret"] + "=") == path.read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == 0
    again = run_module(tmp_path, path=str(path))
    assert (again["secret"], again["changed"], again["created"]) == (first["secret"], False, False)
    assert planned["secret"] != first["secret"], "check mode returns a secret it does not keep"


@pytest.mark.parametrize(("mode", "content", "message"), [
    (0o640, b"x" * 32, "must be a regular file of root's that no one else can read"),
    (0o600, b"short", "holds 5 bytes, not 32"),
])
def test_a_file_that_cannot_be_trusted_is_refused_and_left_as_it_is(tmp_path: Path, mode: int, content: bytes,
                                                                     message: str) -> None:
    path = tmp_path / "admin-key"
    path.write_bytes(content)
    path.chmod(mode)
    if os.geteuid() != 0 and "root's" not in message:
        pytest.skip("ownership is checked first: the file is not root's")
    result = run_module(tmp_path, path=str(path))
    assert result["failed"] and message in result["msg"] and path.read_bytes() == content
