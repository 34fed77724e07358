"""plugins/modules/durable_file.py (what a host boots from, written so a power cut leaves the old or the new file) and
plugins/modules/engine_envs_prune.py (an engine's venvs that no kept release names go; nothing else does)."""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
from pathlib import Path

import pytest

from tests.module_utils_loader import run_library_module_file

OWNER = {"owner": pwd.getpwuid(os.geteuid()).pw_name, "group": grp.getgrgid(os.getegid()).gr_name}


def durable(tmp_path: Path, check_mode: bool = False, **args) -> dict:
    return run_library_module_file("durable_file", tmp_path, {**OWNER, **args}, check_mode)


def prune(tmp_path: Path, check_mode: bool = False, **args) -> dict:
    return run_library_module_file("engine_envs_prune", tmp_path, args, check_mode)


def test_durable_file_writes_once_then_changes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "state.json"
    planned = durable(tmp_path, check_mode=True, dest=str(dest), content="{}\n")
    assert planned["changed"] is True and not dest.exists()
    written = durable(tmp_path, dest=str(dest), content="{}\n", mode="0640")
    assert written["changed"] is True and dest.read_text() == "{}\n"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o640
    assert durable(tmp_path, dest=str(dest), content="{}\n", mode="0640")["changed"] is False
    # A mode alone differing is a change; no temporary file is left beside it.
    assert durable(tmp_path, dest=str(dest), content="{}\n", mode="0644")["changed"] is True
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_durable_file_copies_a_host_file_and_removes_one(tmp_path: Path) -> None:
    src = tmp_path / "release.service"
    src.write_text("[Service]\nExecStart=/bin/true\n")
    dest = tmp_path / "unit.service"
    diff = run_library_module_file("durable_file", tmp_path,
                                   {**OWNER, "src": str(src), "dest": str(dest), "_ansible_diff": True})
    assert diff["changed"] and dest.read_bytes() == src.read_bytes()
    assert diff["diff"]["after"] == src.read_text() and diff["diff"]["before"] == ""
    assert diff["diff"]["before_header"].endswith("(absent)")
    assert durable(tmp_path, src=str(src), dest=str(dest))["changed"] is False
    assert durable(tmp_path, check_mode=True, dest=str(dest), state="absent")["changed"] is True and dest.exists()
    assert durable(tmp_path, dest=str(dest), state="absent")["changed"] is True and not dest.exists()
    assert durable(tmp_path, dest=str(dest), state="absent")["changed"] is False


def test_durable_file_refuses_a_missing_source_and_leaves_the_file(tmp_path: Path) -> None:
    dest = tmp_path / "unit.service"
    dest.write_text("old\n")
    result = durable(tmp_path, src=str(tmp_path / "missing"), dest=str(dest))
    assert result["failed"] and "does not exist on the host" in result["msg"] and dest.read_text() == "old\n"


def make_venv(envs: Path, directory: str, name: str | None) -> Path:
    venv = envs / directory
    (venv / "bin").mkdir(parents=True)
    if name is not None:
        (venv / "python-env.json").write_text(json.dumps({"name": name, "id": directory}))
    return venv


def make_release(state: Path, release_id: str, venv: Path | str | None) -> Path:
    release = state / "releases" / release_id
    release.mkdir(parents=True)
    (release / "release.json").write_text(json.dumps({"id": release_id, **({"venv": str(venv)} if venv else {})}))
    return release


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    envs, state = tmp_path / "envs", tmp_path / "state"
    venvs = {
        "current": make_venv(envs, "sglang-aaaa", "sglang"),
        "previous": make_venv(envs, "sglang-bbbb", "sglang"),
        "old": make_venv(envs, "sglang-cccc", "sglang"),
        "pruned": make_venv(envs, "sglang-dddd", "sglang"),
        "build": make_venv(envs, ".build-sglang-eeee", None),
        "other engine": make_venv(envs, "vllm-ffff", "vllm"),
        "unstamped": make_venv(envs, "sglang-gggg", None),
        "foreign stamp": make_venv(envs, "sglang-hhhh", "vllm"),
    }
    make_release(state, "sglang-1", venvs["current"])
    make_release(state, "sglang-2", venvs["previous"])
    make_release(state, "vllm-1", "/opt/vllm/venv")
    gone = make_release(state, "sglang-0", venvs["pruned"])
    return {"envs": envs, "state": state, "gone": gone, **venvs}


def test_prune_removes_only_this_engines_venvs_no_kept_release_names(tmp_path: Path, layout: dict) -> None:
    args = {"envs_dir": str(layout["envs"]), "name": "sglang", "state_dir": str(layout["state"]),
            "ignore_releases": [str(layout["gone"])]}
    planned = prune(tmp_path, check_mode=True, **args)
    expected = sorted(str(layout[k]) for k in ("old", "pruned", "build"))
    assert planned["changed"] and sorted(planned["removed"]) == expected
    assert all(Path(p).exists() for p in expected)
    done = prune(tmp_path, **args)
    assert sorted(done["removed"]) == expected and not any(Path(p).exists() for p in expected)
    assert sorted(done["kept"]) == sorted(str(layout[k]) for k in ("current", "previous"))
    for kept in ("current", "previous", "other engine", "unstamped", "foreign stamp"):
        assert layout[kept].exists(), kept
    assert prune(tmp_path, **args)["changed"] is False


def test_prune_removes_nothing_while_a_release_cannot_be_read(tmp_path: Path, layout: dict) -> None:
    (layout["state"] / "releases" / "sglang-2" / "release.json").write_text("{not json")
    result = prune(tmp_path, envs_dir=str(layout["envs"]), name="sglang", state_dir=str(layout["state"]))
    assert result["failed"] and "sglang-2/release.json cannot be read" in result["msg"]
    assert layout["old"].exists() and layout["build"].exists()
