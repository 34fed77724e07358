"""plugins/modules/release_id.py: release ids keyed by a salt only root on the host can read."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from tests.module_utils_loader import load_library_module, load_module_util, run_library_module_file

release_id = load_library_module("release_id")
host_secret = load_module_util("secrets.host_secret")

DIGEST = hashlib.sha256(b"unit text + files, API key included").hexdigest()


def run_module(tmp_path: Path, check_mode: bool = False, **args) -> dict:
    return run_library_module_file("release_id", tmp_path, args, check_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="the salt must be root's; the test writes it as the running user")
def test_first_run_creates_the_salt_and_the_id_stays_the_same(tmp_path: Path) -> None:
    salt_file = tmp_path / "state" / "release-salt"
    planned = run_module(tmp_path, check_mode=True, name="sglang", digest=DIGEST, salt_file=str(salt_file))
    assert planned["changed"] is True and planned["salt_created"] is True and not salt_file.exists()
    first = run_module(tmp_path, name="sglang", digest=DIGEST, salt_file=str(salt_file))
    assert first["changed"] is True and first["release_id"].startswith("sglang-") and len(first["release_id"]) == 19
    assert stat.S_IMODE(salt_file.stat().st_mode) == 0o600 and salt_file.stat().st_size == 32
    assert stat.S_IMODE(salt_file.parent.stat().st_mode) == 0o755
    again = run_module(tmp_path, check_mode=True, name="sglang", digest=DIGEST, salt_file=str(salt_file))
    assert (again["release_id"], again["changed"], again["salt_created"]) == (first["release_id"], False, False)
    # The unsalted hash of the same content names nothing: the id is not a prefix of it.
    assert first["release_id"] != f"sglang-{DIGEST[:12]}"
    assert DIGEST not in json.dumps([planned, first, again]), "a no_log parameter: no result holds the digest"


def test_the_id_depends_on_the_salt_and_the_content() -> None:
    one, two = b"\1" * 32, b"\2" * 32
    assert release_id.release_id("vllm", one, DIGEST) == release_id.release_id("vllm", one, DIGEST)
    assert release_id.release_id("vllm", one, DIGEST) != release_id.release_id("vllm", two, DIGEST)
    assert release_id.release_id("vllm", one, DIGEST) != release_id.release_id("vllm", one, "0" * 64)


@pytest.mark.parametrize(("mode", "content", "message"), [
    (0o644, b"x" * 32, "must be a regular file of root's that no one else can read"),
    (0o600, b"x" * 31, "holds 31 bytes, not 32"),
])
def test_a_salt_that_cannot_be_trusted_is_refused(tmp_path: Path, mode: int, content: bytes, message: str) -> None:
    salt_file = tmp_path / "release-salt"
    salt_file.write_bytes(content)
    salt_file.chmod(mode)
    if os.geteuid() != 0 and "root's" not in message:
        pytest.skip("ownership is checked first: the file is not root's")
    with pytest.raises(host_secret.HostSecretError, match=message):
        host_secret.read_host_secret(str(salt_file), 32)
    result = run_module(tmp_path, name="sglang", digest=DIGEST, salt_file=str(salt_file))
    assert result["failed"] and message in result["msg"] and salt_file.read_bytes() == content


def test_a_digest_that_is_not_sha256_is_refused(tmp_path: Path) -> None:
    result = run_module(tmp_path, name="sglang", digest="abc", salt_file=str(tmp_path / "salt"))
    assert result["failed"] and "digest must be a sha256 hex digest" in result["msg"]
    assert not (tmp_path / "salt").exists()
