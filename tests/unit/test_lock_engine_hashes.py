"""scripts/lock-engine-hashes.py: which index files a GPU host may install, and how the lock's block is written."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "lock-engine-hashes.py"
_spec = importlib.util.spec_from_file_location("lock_engine_hashes", SCRIPT)
assert _spec and _spec.loader
hashes_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hashes_script)


@pytest.mark.parametrize(("filename", "installable"), [
    ("torch-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl", True),
    ("torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl", True),
    ("torch-2.14.1-cp310-cp310-manylinux_2_28_x86_64.whl", False),  # no host runs 3.10 (python_env_min_python)
    ("torch-2.14.1-cp314-cp314t-manylinux_2_28_x86_64.whl", False),  # free-threaded build
    ("torch-2.14.1-cp312-cp312-manylinux_2_28_aarch64.whl", False),
    ("torch-2.14.1-cp312-cp312-win_amd64.whl", False),
    ("torch-2.14.0-cp312-cp312-manylinux_2_28_x86_64.whl", False),  # another version
    ("six-1.17.0-py2.py3-none-any.whl", True),
    ("cryptography-50.0.2-cp38-abi3-manylinux_2_34_x86_64.whl", True),
    ("numpy-2.3.5-cp312-cp312-musllinux_1_2_x86_64.whl", True),
    ("Torch-2.14.1.tar.gz", True),
    ("torch-2.14.1.zip", True),  # an sdist of the older kind
])
def test_host_can_install(filename: str, installable: bool) -> None:
    name = filename.split("-", maxsplit=1)[0].lower()
    version = {"torch": "2.14.1", "six": "1.17.0", "cryptography": "50.0.2", "numpy": "2.3.5"}[name]
    assert hashes_script.host_can_install(filename, name, version) is installable


LISTING = {
    "six": [{"filename": "six-1.17.0-py2.py3-none-any.whl", "hashes": {"sha256": "a" * 64}},
            {"filename": "six-1.17.0.tar.gz", "hashes": {"sha256": "b" * 64}},
            {"filename": "six-1.16.0-py2.py3-none-any.whl", "hashes": {"sha256": "c" * 64}},
            {"filename": "six-1.17.0-py2.py3-none-any.whl", "hashes": {"sha256": "d" * 64}, "yanked": "bad"}],
    "pyyaml": [{"filename": "PyYAML-6.0.3-cp312-cp312-manylinux_2_17_x86_64.whl", "hashes": {"sha256": "e" * 64}}],
}

LOCK = """---
# a comment that stays
engine: x
requirements:
  - six==1.17.0
  - PyYAML==6.0.3
bench: {}
"""


def test_rewrite_writes_the_block_once_and_keeps_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashes_script, "index_files", lambda name: LISTING[name.lower()])
    lock = tmp_path / "x.yml"
    lock.write_text(LOCK)
    assert hashes_script.rewrite(lock) == 3
    first = lock.read_text()
    assert first.startswith(LOCK)
    assert yaml.safe_load(first)["hashes"] == {"PyYAML": ["e" * 64], "six": ["a" * 64, "b" * 64]}
    hashes_script.rewrite(lock)
    assert lock.read_text() == first, "a second run replaces the block, it does not add one"


def test_rewrite_refuses_what_it_cannot_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashes_script, "index_files", lambda name: LISTING[name.lower()])
    lock = tmp_path / "x.yml"
    lock.write_text(LOCK.replace("six==1.17.0", "six==9.9"))
    with pytest.raises(SystemExit, match=r"six==9.9: the index .* lists no file a Linux x86_64 host can install"):
        hashes_script.rewrite(lock)
    assert lock.read_text() == LOCK.replace("six==1.17.0", "six==9.9"), "nothing written"
    lock.write_text(LOCK + "hashes: {}\n")
    with pytest.raises(SystemExit, match="has a 'hashes:' key this script did not write"):
        hashes_script.rewrite(lock)


# --- the role side: plugins/filter/python_env.py -----------------------------------------------------

_fspec = importlib.util.spec_from_file_location(
    "python_env_filters", SCRIPT.parents[1] / "plugins" / "filter" / "python_env.py")
assert _fspec and _fspec.loader
python_env_filters = importlib.util.module_from_spec(_fspec)
_fspec.loader.exec_module(python_env_filters)


def test_each_requirement_line_gets_the_digests_of_its_name() -> None:
    a, b = "a" * 64, "b" * 64
    lines = ["six==1.17.0", "PyYAML[extra]==6.0.3", f"uv==0.13.9 --hash=sha256:{b}", "orphan==1", "short==2", "# v2"]
    hashes = {"six": [a, b], "PyYAML": [a], "uv": [a], "short": ["abc"]}
    assert python_env_filters.hashed_requirements(lines, hashes) == [
        f"six==1.17.0 --hash=sha256:{a} --hash=sha256:{b}",
        f"PyYAML[extra]==6.0.3 --hash=sha256:{a}",
        f"uv==0.13.9 --hash=sha256:{b}",  # its own options kept, the mapping's not added
        "orphan==1",  # left without: the role refuses it, naming it
        "short==2",  # a digest that is not sha256 is no hash
        "# v2",  # a comment stays one
    ]


def test_every_lock_requirement_gets_a_hash_as_the_role_builds_the_lines() -> None:
    for lock_file in sorted((SCRIPT.parents[1] / "roles").glob("*/locks/*.yml")):
        lock = yaml.safe_load(lock_file.read_text())
        lines = python_env_filters.hashed_requirements(lock["requirements"], lock["hashes"])
        assert all("--hash=sha256:" in line for line in lines), lock_file.name
