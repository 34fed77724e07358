"""The engine roles' flag lists and guarded inputs against the real code of the pinned versions.

roles/<engine>/files/flags-<version>.txt is what the input check (plugins/action/input_check.py) takes as the
engine's flag names: it must be exactly what tests/contract/engine_flag_names.py prints from the real parser in the
contract venv of the pinned version (a new pin needs its list). roles/<engine>/files/guarded_inputs.yml cites, for
each refused option and environment variable, the upstream files where the engine does what the refusal says:
each cited file is in the pinned package, and holds the names cited with it.
"""

from __future__ import annotations

import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.contract

REPO = Path(__file__).resolve().parents[2]
GENERATOR = Path(__file__).with_name("engine_flag_names.py")
ENGINES = ("sglang", "vllm")
# "pkg/a/b.py (name, other name), pkg/c.py": each file with the names it must hold.
CITED = re.compile(r"(?P<file>[\w./-]+\.py)(?:\s*\((?P<names>[^)]*)\))?")


def _venv(engine: str) -> tuple[Path, str]:
    """The contract venv's python and the pinned version (skips, or fails under CI, when it cannot be built)."""
    if engine == "sglang":
        from sglang_helpers import contract_python, pinned_sglang_lock

        return contract_python(), str(pinned_sglang_lock()["version"])
    from vllm_helpers import contract_venv, pinned_vllm_version

    version = pinned_vllm_version()
    return contract_venv(version) / "bin" / "python", version


def _run(python: Path, *args: str) -> str:
    proc = subprocess.run([str(python), *args], cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"{args} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.parametrize("engine", ENGINES)
def test_the_flag_list_is_the_pinned_parsers(engine: str) -> None:
    python, version = _venv(engine)
    listed = REPO / "roles" / engine / "files" / f"flags-{version}.txt"
    regenerate = (f"regenerate it: <{engine} {version} contract venv>/bin/python tests/contract/engine_flag_names.py "
                  f"{engine} > {listed.relative_to(REPO)}")
    assert listed.is_file(), f"the pinned {engine} {version} has no flag list: {regenerate}"
    generated = _run(python, str(GENERATOR), engine)
    names = [line for line in generated.splitlines() if line and not line.startswith("#")]
    assert len(names) > 100 and "port" in names and "host" in names, names[:20]
    committed = listed.read_text(encoding="utf-8")
    diff = "\n".join(difflib.unified_diff(committed.splitlines(), generated.splitlines(), "committed", "parser",
                                          lineterm="", n=0))
    assert committed == generated, f"{listed.relative_to(REPO)} differs from the real parser:\n{diff}\n{regenerate}"


def test_the_keys_sglangs_config_reader_refuses_are_the_pinned_readers() -> None:
    """The input check refuses what SGLang's --config reader would refuse at start-up (the role serves from that
    file), naming the replacement: the list must be what the real reader of the pinned version refuses."""
    python, version = _venv("sglang")
    listed = REPO / "roles" / "sglang" / "files" / f"refused-flags-{version}.yml"
    generated = _run(python, str(GENERATOR), "sglang", "--refused")
    refused = yaml.safe_load(generated)["flags"]
    assert refused["enable-dp-attention"] == "--attn-dp-size <dp-size>"
    assert refused["disable-cuda-graph"].startswith("--cuda-graph-backend-")
    assert listed.is_file() and listed.read_text(encoding="utf-8") == generated, (
        f"{listed.relative_to(REPO)} differs from the real reader: regenerate it with <sglang {version} contract "
        f"venv>/bin/python tests/contract/engine_flag_names.py sglang --refused > {listed.relative_to(REPO)}")


@pytest.mark.parametrize("engine", ENGINES)
def test_each_guard_cites_files_of_the_pinned_package_that_hold_the_names_cited(engine: str) -> None:
    python, version = _venv(engine)
    located = _run(python, "-c", "import importlib.util, sys; "
                   "print(importlib.util.find_spec(sys.argv[1]).submodule_search_locations[0])", engine)
    site_packages = Path(located.strip()).parent
    guards = yaml.safe_load((REPO / "roles" / engine / "files" / "guarded_inputs.yml").read_text())
    entries = [entry for kind in ("options", "environment") for entry in guards[kind] or []]
    assert entries or engine != "sglang"
    problems = []
    for entry in entries:
        citations = list(CITED.finditer(" ".join(entry["upstream"].split())))
        if not citations:
            problems.append(f"{entry['name']}: no file cited")
        for cited in citations:
            path = site_packages / cited["file"]
            if not cited["file"].startswith(f"{engine}/") or not path.is_file():
                problems.append(f"{entry['name']}: {cited['file']} is not a file of {engine} {version}")
                continue
            text = path.read_text(encoding="utf-8")
            names = [name.strip() for name in (cited["names"] or "").split(",") if name.strip()]
            problems += [f"{entry['name']}: {cited['file']} does not hold {name!r}"
                         for name in names if name not in text]
    assert problems == [], problems


def test_the_generator_refuses_an_unknown_engine() -> None:
    proc = subprocess.run([sys.executable, str(GENERATOR), "tgi"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "usage: engine_flag_names.py" in proc.stderr
