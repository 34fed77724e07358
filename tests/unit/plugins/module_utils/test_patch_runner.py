"""plugins/module_utils/patch/runner.py, the patch-set verification runner, run the way bws_patchset runs it: its
source
given to an interpreter with ``-c``, a spec file in, a JSON report out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.module_utils_loader import load_module_util

patchset = load_module_util("patch.patchset")


def run(tmp_path: Path, spec: dict) -> dict:
    spec_path, out_path = tmp_path / "spec.json", tmp_path / "out.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, "-c", patchset.runner_source(), str(spec_path), str(out_path)],
                          capture_output=True, text=True, cwd=tmp_path, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out_path.read_text())


def test_a_file_that_does_not_compile_is_named_and_nothing_is_imported(tmp_path):
    report = run(tmp_path, {"compile": {"a.py": "x = 1\n", "b.py": "def broken(:\n"}, "imports": ["json"]})
    assert report["ok"] is False
    assert [e["ok"] for e in report["compiled"]] == [True, False]
    assert "SyntaxError" in report["compiled"][1]["error"]
    assert report["imports"] == []


def test_imports_names_and_assertions_pass_on_a_good_tree(tmp_path):
    (tmp_path / "demo_pkg").mkdir()
    (tmp_path / "demo_pkg" / "__init__.py").write_text("SUPPORTED = ['deepseek_v3', 'kimi_k2']\n")
    report = run(tmp_path, {
        "compile": {"demo_pkg/__init__.py": (tmp_path / "demo_pkg" / "__init__.py").read_text()},
        "preamble": f"import sys; sys.path.insert(0, {str(tmp_path)!r})",
        "imports": ["demo_pkg"],
        "expected_files": {"demo_pkg": str(tmp_path / "demo_pkg" / "__init__.py")},
        "names": {"supported": "demo_pkg:SUPPORTED"},
        "assertions": [{"that": "'kimi_k2' in supported"}, {"that": "len(supported) == 3", "msg": "three models"}],
    })
    assert report["ok"] is False, "the second assertion is false"
    assert [a["ok"] for a in report["assertions"]] == [True, False]
    assert report["assertions"][1]["error"] == "three models"
    assert report["imports"][0]["file"].endswith("demo_pkg/__init__.py")
    assert not list(tmp_path.glob("demo_pkg/__pycache__")), "the check writes no bytecode into the tree"


def test_a_module_imported_from_elsewhere_than_the_patched_file_fails(tmp_path):
    report = run(tmp_path, {"imports": ["json"], "expected_files": {"json": "/patched/site/json/__init__.py"}})
    assert report["ok"] is False
    assert "not from the patched /patched/site/json/__init__.py" in report["imports"][0]["error"]


def test_a_missing_module_and_a_missing_name_are_reported(tmp_path):
    missing = run(tmp_path, {"imports": ["no_such_engine_module"]})
    assert missing["ok"] is False and "ModuleNotFoundError" in missing["imports"][0]["error"]
    no_name = run(tmp_path, {"imports": ["json"], "names": {"x": "json:no_such_attribute"}})
    assert no_name["ok"] is False and "AttributeError" in no_name["assertions"][0]["error"]
