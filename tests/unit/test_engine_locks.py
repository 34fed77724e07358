"""The engine lock files (roles/<engine>/locks/*.yml) and their reader, tests/engine_locks.py."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine_locks
from engine_locks import ENGINES, LockError, load_lock, lock_paths, lock_problems, pinned_version

ALL_LOCKS = [path for engine in ENGINES for path in lock_paths(engine)]


def test_every_engine_has_locks() -> None:
    assert {p.parent.parent.name for p in ALL_LOCKS} == set(ENGINES)


@pytest.mark.parametrize("path", ALL_LOCKS, ids=lambda p: p.name)
def test_lock_file_is_complete_and_exact(path: Path) -> None:
    lock = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert lock_problems(lock, path) == []
    assert set(engine_locks.REQUIRED_KEYS) <= set(lock)
    assert load_lock(lock["engine"], lock["version"])["version"] == lock["version"]


@pytest.mark.parametrize("path", ALL_LOCKS, ids=lambda p: p.name)
def test_requirements_are_exact_unique_pins(path: Path) -> None:
    requirements = yaml.safe_load(path.read_text(encoding="utf-8"))["requirements"]
    assert all("==" in r and not any(op in r for op in (">", "<", "~", "!", ",", ";")) for r in requirements)
    names = [engine_locks.normalize_name(r.split("==")[0]) for r in requirements]
    assert len(names) == len(set(names)), "a distribution is pinned twice"


@pytest.mark.parametrize("engine", ENGINES)
def test_exactly_one_pinned_lock_per_engine(engine: str) -> None:
    locks = {p: yaml.safe_load(p.read_text(encoding="utf-8")) for p in lock_paths(engine)}
    pinned = [p for p, lock in locks.items() if lock["pinned"] is True]
    assert len(pinned) == 1, pinned
    assert pinned_version(engine) == yaml.safe_load(pinned[0].read_text(encoding="utf-8"))["version"]


def test_pinned_versions_are_the_expected_ones() -> None:
    """The versions the design is built on; change this test together with a bump."""
    assert pinned_version("sglang") == "0.5.23"
    assert pinned_version("vllm") == "0.33.0"
    assert load_lock("vllm", "0.17.1")["pinned"] is False


@pytest.mark.parametrize("engine", ENGINES)
def test_role_default_version_matches_the_pinned_lock(engine: str) -> None:
    defaults_file = engine_locks.ROLES_DIR / engine / "defaults" / "main.yml"
    if not defaults_file.is_file():
        pytest.skip(f"{defaults_file.relative_to(engine_locks.REPO_ROOT)} is not written yet")
    defaults = yaml.safe_load(defaults_file.read_text(encoding="utf-8")) or {}
    key = f"{engine}_version"
    assert key in defaults, f"{defaults_file}: no {key}"
    assert str(defaults[key]) == pinned_version(engine)
    assert engine_locks.lock_path(engine, str(defaults[key])).is_file()


# --- the reader refuses bad locks -------------------------------------------------------------------------

@pytest.fixture()
def good_lock() -> dict[str, Any]:
    return copy.deepcopy(load_lock("sglang", "0.5.23"))


PATH = Path("sglang-0.5.23.yml")


def test_reader_accepts_the_real_lock(good_lock: dict[str, Any]) -> None:
    assert lock_problems(good_lock, PATH) == []


@pytest.mark.parametrize(("change", "message"), [
    (lambda lock: lock.pop("torch"), "missing key 'torch'"),
    (lambda lock: lock.update(version=0.5), "version must be an exact release as a string"),
    (lambda lock: lock.update(version=">=0.5.23"), "version must be an exact release"),
    (lambda lock: lock["requirements"].append("numpy>=1.26"), "'numpy>=1.26' is not an exact pin"),
    (lambda lock: lock["requirements"].remove("sglang==0.5.23"), "requirements must pin sglang==0.5.23"),
    (lambda lock: lock.update(torch="2.14.0"), "requirements pin torch==2.14.1, lock says 2.14.0"),
    (lambda lock: lock["contract"].update(torch="torch==2.13.0"), "must name a CPU build"),
    (lambda lock: lock["contract"].update(engine="sglang"), "contract.engine must be 'sglang==0.5.23'"),
    (lambda lock: lock["contract"].pop("packages"), "contract lacks 'packages'"),
    (lambda lock: lock.update(pinned="yes"), "pinned must be true or false"),
    (lambda lock: lock.update(bench={"argv": []}), "bench must be a mapping with 'module' and 'argv'"),
    (lambda lock: lock["bench"]["workloads"].pop("sharegpt"), "bench needs 'workloads' (sharegpt and random)"),
    (lambda lock: lock["bench"]["endpoints"].pop("sharegpt"), "bench needs 'endpoints', the route each workload"),
    (lambda lock: lock["bench"]["options"].pop("request_body"), "bench needs a flag for each sampling parameter"),
    (lambda lock: lock["hashes"].pop("torch"), "requirement torch has no sha256 in hashes"),
    (lambda lock: lock["hashes"].update(numpy=["abc"]), "hashes of numpy hold 'abc', not a sha256"),
    (lambda lock: lock["hashes"].update(left_over=["0" * 64]), "hashes name left_over, which requirements do not"),
    (lambda lock: lock.pop("hashes"), "missing key 'hashes'"),
], ids=["no-torch", "float-version", "range-version", "range-requirement", "engine-unpinned",
        "torch-mismatch", "cuda-contract-torch", "contract-engine", "contract-packages", "pinned-string",
        "bench-module", "bench-workloads", "bench-endpoints", "bench-sampling", "no-torch-hash", "short-hash",
        "stray-hash", "no-hashes"])
def test_reader_reports_what_is_wrong(good_lock: dict[str, Any], change: Any, message: str) -> None:
    change(good_lock)
    problems = lock_problems(good_lock, PATH)
    assert any(message in p for p in problems), problems


def test_file_name_must_match_the_version(good_lock: dict[str, Any]) -> None:
    problems = lock_problems(good_lock, Path("sglang-0.5.22.yml"))
    assert any("file name does not match" in p for p in problems)


def _fake_roles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, locks: dict[str, dict[str, Any]]) -> None:
    (tmp_path / "sglang" / "locks").mkdir(parents=True)
    for name, lock in locks.items():
        (tmp_path / "sglang" / "locks" / name).write_text(yaml.safe_dump(lock), encoding="utf-8")
    monkeypatch.setattr(engine_locks, "ROLES_DIR", tmp_path)


def test_two_pinned_locks_are_refused(good_lock: dict[str, Any], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    other = copy.deepcopy(good_lock) | {"version": "0.5.24"}
    _fake_roles(tmp_path, monkeypatch, {"sglang-0.5.23.yml": good_lock, "sglang-0.5.24.yml": other})
    with pytest.raises(LockError, match=r"exactly one lock with 'pinned: true'.*found 2"):
        pinned_version("sglang")


def test_no_pinned_lock_is_refused(good_lock: dict[str, Any], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_roles(tmp_path, monkeypatch, {"sglang-0.5.23.yml": good_lock | {"pinned": False}})
    with pytest.raises(LockError, match="found 0"):
        load_lock("sglang")


def test_unknown_version_names_the_locked_ones() -> None:
    with pytest.raises(LockError, match=r"no lock file for sglang 9\.9\.9.*'0\.5\.23'"):
        load_lock("sglang", "9.9.9")
    with pytest.raises(LockError, match="unknown engine"):
        load_lock("tgi")


# --- command line and pip report conversion ------------------------------------------------------------

def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(Path(engine_locks.__file__)), *args], capture_output=True,
                          text=True, timeout=60, check=False)


def test_cli_prints_values_for_the_scripts() -> None:
    assert run_cli("pinned", "sglang").stdout.strip() == "0.5.23"
    packages = run_cli("get", "sglang", "0.5.23", "contract.packages").stdout.split()
    assert packages == load_lock("sglang")["contract"]["packages"]
    assert run_cli("get", "vllm", "0.17.1", "pinned").stdout.strip() == "false"
    missing = run_cli("get", "sglang", "0.5.23", "contract.nope")
    assert missing.returncode == 1
    assert "no key 'contract.nope'" in missing.stderr


def test_requirements_from_a_pip_report(tmp_path: Path) -> None:
    report = {"install": [{"metadata": {"name": "Torch", "version": "2.14.1"}},
                          {"metadata": {"name": "aiohttp", "version": "3.14.5"}}]}
    assert engine_locks.requirements_from_pip_report(report) == ["aiohttp==3.14.5", "Torch==2.14.1"]
    report_file = tmp_path / "report.json"
    report_file.write_text(json.dumps(report), encoding="utf-8")
    text = run_cli("from-pip-report", str(report_file)).stdout
    assert yaml.safe_load(text) == {"requirements": ["aiohttp==3.14.5", "Torch==2.14.1"]}
