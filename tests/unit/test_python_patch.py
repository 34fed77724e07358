"""plugins/modules/python_patch.py and plugins/module_utils/patch/patchset.py on a small synthetic engine in a temp
venv.

The "engine" is a package installed in a throw-away venv (no pip, created with this interpreter), so
version discovery, compiling, importing and asserting all run in a real separate interpreter.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
from tests.module_utils_loader import use_repository_module_utils  # noqa: E402
from tests.playbook_run import run_module  # noqa: E402

use_repository_module_utils()

from ansible_collections.blackwell.serving.plugins.module_utils.patch import patchset as bp  # noqa: E402
from ansible_collections.blackwell.serving.plugins.module_utils.patch.unidiff import render  # noqa: E402

CONFIG_BEFORE = '''"""Engine config."""

SUPPORTED = [
    "llama",
    "qwen",
]


def supported(model_type):
    return model_type in SUPPORTED
'''
CONFIG_AFTER = CONFIG_BEFORE.replace('    "qwen",\n', '    "qwen",\n    "kimi_k2",\n')

MODEL_BEFORE = '''class Base:
    pass


class DeepModel(Base):
    name = "deep"
'''
MODEL_AFTER = MODEL_BEFORE.replace("class DeepModel(Base):", "class DeepModel(Base, SupportsDraft):").replace(
    "class Base:\n    pass\n", "class Base:\n    pass\n\n\nclass SupportsDraft:\n    pass\n")


@dataclass
class Engine:
    root: Path
    python: str
    site: Path
    state_dir: Path
    set_dir: Path

    def write(self, rel: str, text: str) -> None:
        path = self.site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def snapshot(self) -> dict[str, str]:
        """sha256 of every file under the engine package, __pycache__ included."""
        result = {}
        for path in sorted((self.site / "demo_engine").rglob("*")):
            if path.is_file():
                result[str(path.relative_to(self.site))] = hashlib.sha256(path.read_bytes()).hexdigest()
        return result

    def patchset(self, changes: dict[str, tuple[str, str, str]], **overrides) -> bp.PatchSet:
        """changes: file name -> (path, before, after). Writes the .patch files and returns the loaded set."""
        entries = []
        for name, (rel, before, after) in changes.items():
            (self.set_dir / name).write_text(f"Description of {name}.\n\n" + render(rel, before, after))
            entries.append({"file": name, "touches": [rel],
                            "upstream_fixed_if": [{"path": rel, "contains": "UPSTREAM_FIX_MARKER"}]})
        manifest = {
            "name": "demo-set", "engine": "demo", "distribution": "demo-engine",
            "applies_to": ">=1.5.0,<1.6", "not_needed_from": "1.6.0", "patches": entries,
            "verify": {"imports": ["demo_engine.config", "demo_engine.models.model"],
                       "names": {"supported": "demo_engine.config:supported"},
                       "assertions": [{"that": "supported('kimi_k2')", "msg": "kimi_k2 not supported"}]},
        }
        manifest.update(overrides)
        (self.set_dir / "manifest.json").write_text(json.dumps(manifest))
        return bp.load_patchset(str(self.set_dir), manifest)

    def run(self, patchset: bp.PatchSet, version: str = "1.5.0", **kwargs) -> dict:
        return bp.execute(patchset, str(self.site), self.python, version, str(self.state_dir), **kwargs)


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    root = tmp_path / "venv"
    venv.create(root, with_pip=False)
    python = str(root / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    eng = Engine(root, python, Path(purelib), tmp_path / "state", tmp_path / "set")
    eng.set_dir.mkdir()
    eng.write("demo_engine/__init__.py", "")
    eng.write("demo_engine/config.py", CONFIG_BEFORE)
    eng.write("demo_engine/models/__init__.py", "")
    eng.write("demo_engine/models/model.py", MODEL_BEFORE)
    eng.write("demo_engine-1.5.0.dist-info/METADATA",
              "Metadata-Version: 2.1\nName: demo-engine\nVersion: 1.5.0\n")
    return eng


def standard_set(engine: Engine) -> bp.PatchSet:
    return engine.patchset({
        "0001-config.patch": ("demo_engine/config.py", CONFIG_BEFORE, CONFIG_AFTER),
        "0002-model.patch": ("demo_engine/models/model.py", MODEL_BEFORE, MODEL_AFTER),
    })


def test_applies_exactly_verifies_and_records(engine: Engine):
    result = engine.run(standard_set(engine))
    assert (result["state"], result["changed"], result["verified"]) == ("applied", True, True)
    assert (engine.site / "demo_engine/config.py").read_text() == CONFIG_AFTER
    assert (engine.site / "demo_engine/models/model.py").read_text() == MODEL_AFTER
    assert [a["ok"] for a in result["verification"]["assertions"]] == [True]
    backup = Path(result["backup_dir"])
    assert (backup / "demo_engine/config.py").read_text() == CONFIG_BEFORE
    record = json.loads((engine.state_dir / "demo-set.json").read_text())
    want = hashlib.sha256(CONFIG_AFTER.encode()).hexdigest()
    assert record["after_sha256"]["demo_engine/config.py"] == want
    assert not list(engine.site.rglob("*.bws-tmp")), "temp files left behind"


def test_second_run_is_already_applied_and_changes_nothing(engine: Engine):
    patchset = standard_set(engine)
    engine.run(patchset)
    before = engine.snapshot()
    again = engine.run(patchset)
    assert (again["state"], again["changed"], again["verified"]) == ("already-applied", False, True)
    assert engine.snapshot() == before


def test_already_applied_without_a_record_is_verified_again(engine: Engine):
    patchset = standard_set(engine)
    engine.run(patchset)
    (engine.state_dir / "demo-set.json").unlink()
    again = engine.run(patchset)
    assert again["state"] == "already-applied" and not again["changed"]
    assert again["verification"]["ok"] is True


def test_context_mismatch_is_refused_with_hunk_and_lines_and_nothing_written(engine: Engine):
    patchset = standard_set(engine)
    engine.write("demo_engine/config.py", CONFIG_BEFORE.replace('"llama"', '"llama3"'))
    before = engine.snapshot()
    with pytest.raises(bp.PatchSetError) as caught:
        engine.run(patchset)
    err = caught.value
    assert err.details["state"] == "refused"
    assert "demo_engine/config.py: hunk #1" in err.msg
    assert '|    "llama3",' in err.msg and '|    "llama",' in err.msg
    assert err.details["failed_hunk"]["found"][1] == '    "llama3",'
    assert engine.snapshot() == before
    assert not engine.state_dir.exists()


def test_partially_applied_tree_is_refused(engine: Engine):
    patchset = standard_set(engine)
    engine.write("demo_engine/models/model.py", MODEL_AFTER)  # second file patched by hand, first not
    before = engine.snapshot()
    with pytest.raises(bp.PatchSetError, match="hunk #1"):
        engine.run(patchset)
    assert engine.snapshot() == before


def test_compile_failure_writes_nothing(engine: Engine):
    broken = CONFIG_BEFORE.replace("def supported(model_type):", "def supported(model_type)")
    patchset = engine.patchset({"0001-broken.patch": ("demo_engine/config.py", CONFIG_BEFORE, broken)})
    before = engine.snapshot()
    with pytest.raises(bp.PatchSetError, match="do not compile") as caught:
        engine.run(patchset)
    assert "SyntaxError" in caught.value.details["compile"][0]["error"]
    assert engine.snapshot() == before


def test_import_failure_rolls_back_byte_identical(engine: Engine):
    importing = "import demo_engine.does_not_exist_yet\n" + CONFIG_AFTER
    patchset = engine.patchset({
        "0001-config.patch": ("demo_engine/config.py", CONFIG_BEFORE, importing),
        "0002-model.patch": ("demo_engine/models/model.py", MODEL_BEFORE, MODEL_AFTER),
    })
    before = engine.snapshot()
    with pytest.raises(bp.PatchSetError) as caught:
        engine.run(patchset)
    err = caught.value
    assert "ModuleNotFoundError" in err.msg and "rolled back" in err.msg
    assert err.details["rolled_back"] is True
    assert engine.snapshot() == before
    # the originals are still in the backup, for the record
    assert (Path(err.details["backup_dir"]) / "demo_engine/config.py").read_text() == CONFIG_BEFORE


def test_false_assertion_rolls_back(engine: Engine):
    patchset = engine.patchset({
        "0002-model.patch": ("demo_engine/models/model.py", MODEL_BEFORE, MODEL_AFTER)})
    before = engine.snapshot()
    with pytest.raises(bp.PatchSetError, match="kimi_k2 not supported"):
        engine.run(patchset)
    assert engine.snapshot() == before


def test_check_mode_touches_nothing_and_returns_the_diff(engine: Engine):
    patchset = standard_set(engine)
    before = engine.snapshot()
    result = engine.run(patchset, check_mode=True)
    assert (result["state"], result["changed"], result["verified"]) == ("applied", True, False)
    assert engine.snapshot() == before
    assert not engine.state_dir.exists()
    assert '+    "kimi_k2",' in result["unified_diff"]
    assert "--- a/demo_engine/models/model.py" in result["unified_diff"]
    assert [d["before_header"] for d in result["diff"]] == ["demo_engine/config.py",
                                                           "demo_engine/models/model.py"]
    assert all(entry["ok"] for entry in result["compile"])


def test_pycache_of_touched_packages_is_cleared(engine: Engine):
    # A stale unchecked-hash .pyc is what hid patches before: Python trusts it whatever the source says.
    subprocess.run([engine.python, "-c", "import py_compile, sys; py_compile.compile(sys.argv[1], "
                    "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)",
                    str(engine.site / "demo_engine/config.py")], check=True)
    pycache = engine.site / "demo_engine/__pycache__"
    assert list(pycache.glob("config.*.pyc"))
    result = engine.run(standard_set(engine))
    assert str(pycache) in result["pycache_cleared"]
    assert not pycache.exists()
    assert result["verified"]  # the assertion saw the patched source, not the stale bytecode


def test_revert_restores_and_is_idempotent(engine: Engine):
    patchset = standard_set(engine)
    pristine = engine.snapshot()
    engine.run(patchset)
    reverted = engine.run(patchset, revert=True)
    assert (reverted["state"], reverted["changed"]) == ("reverted", True)
    assert engine.snapshot() == pristine
    again = engine.run(patchset, revert=True)
    assert (again["state"], again["changed"]) == ("not-applied", False)


def test_version_below_range_is_refused_with_a_clear_message(engine: Engine):
    with pytest.raises(bp.PatchSetError) as caught:
        engine.run(standard_set(engine), version="1.4.2")
    assert "outside the range" in caught.value.msg and ">=1.5.0,<1.6" in caught.value.msg
    assert ">= 1.6.0, which has the fix upstream" in caught.value.msg


def test_newer_version_with_the_fix_upstream_is_not_needed(engine: Engine):
    engine.write("demo_engine/config.py", CONFIG_AFTER + "# UPSTREAM_FIX_MARKER\n")
    engine.write("demo_engine/models/model.py", MODEL_AFTER + "# UPSTREAM_FIX_MARKER\n")
    before = engine.snapshot()
    result = engine.run(standard_set(engine), version="1.7.0")
    assert (result["state"], result["changed"]) == ("not-needed", False)
    assert all(item["upstream_has_fix"] for item in result["upstream"])
    assert engine.snapshot() == before


def test_newer_version_whose_files_lack_the_fix_is_refused(engine: Engine):
    with pytest.raises(bp.PatchSetError, match="do not show it"):
        engine.run(standard_set(engine), version="1.6.0")


def test_in_range_version_with_a_backport_is_not_needed(engine: Engine):
    # a vendor backport: same fix, other shape, so the patch neither applies nor reverse-applies
    engine.write("demo_engine/config.py",
                 CONFIG_BEFORE.replace('    "llama",', '    "kimi_k2",  # UPSTREAM_FIX_MARKER\n    "llama",'))
    engine.write("demo_engine/models/model.py",
                 MODEL_AFTER.replace('name = "deep"', 'name = "deep"  # UPSTREAM_FIX_MARKER'))
    assert engine.run(standard_set(engine))["state"] == "not-needed"


@pytest.mark.parametrize(
    ("version", "spec", "inside"),
    [("0.17.1", ">=0.17.0,<0.18", True), ("0.18.0", ">=0.17.0,<0.18", False),
     ("0.17.0rc1", ">=0.17.0,<0.18", False), ("0.17.2.dev5+g1234", ">=0.17.0,<0.18", True),
     ("0.17.1+cu130", ">=0.17.0,<0.18", True), ("0.16.0", ">=0.17.0,<0.18", False),
     ("0.33.0", ">=0.18.0", True), ("0.9.0", ">=0.18.0", False),
     # PEP 440's exclusive comparisons: no post-release of V is > V, no pre-release of V is < V
     ("1.0.0.post1", ">1.0.0", False), ("1.0.1", ">1.0.0", True), ("0.18.0rc1", ">=0.17.0,<0.18", False),
     ("0.18.0rc1", "<0.18.0rc2", True), ("1.0.0.post2", ">1.0.0.post1", True), ("0.17", "==0.17.0", True)],
)
def test_version_ranges(version, spec, inside):
    assert bp.version_in(version, spec) is inside
    # the standard-library fallback (a target Python without `packaging`) agrees with packaging
    assert bp.version_in_subset(version, spec) is inside


def test_version_ranges_use_packaging_where_it_is_installed():
    assert bp.SpecifierSet is not None, "the controller's venv has packaging: the maintained implementation is used"
    with pytest.raises(bp.PatchSetError, match="unsupported version clause"):
        bp.version_in("1.0.0", "~=1.0")  # valid PEP 440, but outside the grammar every target reads


def test_discovers_version_and_site_from_the_engine_interpreter(engine: Engine):
    version, site = bp.discover(engine.python, "demo-engine")
    assert version == "1.5.0"
    assert Path(site).resolve() == engine.site.resolve()


@pytest.mark.parametrize(
    ("override", "message"),
    [({"bogus": 1}, "unknown key"), ({"applies_to": "~=1.5"}, "unsupported version clause"),
     ({"patches": []}, "'patches' is empty")],
)
def test_bad_manifest_is_rejected(engine: Engine, override, message):
    with pytest.raises(bp.PatchSetError, match=message):
        engine.patchset({"0001-config.patch": ("demo_engine/config.py", CONFIG_BEFORE, CONFIG_AFTER)},
                        **override)


def test_touches_must_match_the_patch(engine: Engine):
    engine.patchset({"0001-config.patch": ("demo_engine/config.py", CONFIG_BEFORE, CONFIG_AFTER)})
    manifest = json.loads((engine.set_dir / "manifest.json").read_text())
    manifest["patches"][0]["touches"] = ["demo_engine/other.py"]
    with pytest.raises(bp.PatchSetError, match="'touches' says"):
        bp.load_patchset(str(engine.set_dir), manifest)


def _ansible(engine: Engine, args: dict, *, check: bool = False) -> dict:
    """Run the real module through ansible (ad hoc, local, tests/playbook_run.py); its result for localhost."""
    return run_module("blackwell.serving.python_patch", json.dumps(args), check=check, diff=check,
                      workdir=engine.root)


@pytest.mark.integration
def test_module_through_ansible_check_diff_then_apply(engine: Engine):
    standard_set(engine)
    manifest = json.loads((engine.set_dir / "manifest.json").read_text())
    args = {"patchset": str(engine.set_dir), "manifest": manifest, "python": engine.python,
            "state_dir": str(engine.state_dir), "engine": "demo"}
    before = engine.snapshot()
    checked = _ansible(engine, args, check=True)
    assert checked["changed"] is True and checked["state"] == "applied"
    assert '+    "kimi_k2",' in checked["unified_diff"]
    assert engine.snapshot() == before
    applied = _ansible(engine, args)
    assert (applied["changed"], applied["state"], applied["verified"]) == (True, "applied", True)
    assert (engine.site / "demo_engine/config.py").read_text() == CONFIG_AFTER


def _run_module_file(tmp_path: Path, module_args: dict) -> tuple[int, dict]:
    """Run plugins/modules/python_patch.py directly, as Ansible does, with the collection importable."""
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": module_args}))
    runner = ("import runpy, sys; sys.path.insert(0, sys.argv[2]); "
              "sys.argv = [sys.argv[1], sys.argv[3]]; runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", runner, str(REPO / "plugins/modules/python_patch.py"),
                           str(REPO / "collections"), str(args_file)], capture_output=True, text=True,
                          check=False)
    return proc.returncode, json.loads(proc.stdout)


def test_module_refuses_a_set_for_another_engine(engine: Engine, tmp_path: Path):
    standard_set(engine)
    manifest = json.loads((engine.set_dir / "manifest.json").read_text())
    rc, result = _run_module_file(tmp_path, {"patchset": str(engine.set_dir), "manifest": manifest,
                                             "python": engine.python, "state_dir": str(engine.state_dir),
                                             "engine": "vllm"})
    assert rc == 1 and result["failed"]
    assert "is for demo, not vllm" in result["msg"] and result["state"] == "refused"


def test_module_in_check_mode_before_the_engine_is_installed_skips(engine: Engine, tmp_path: Path):
    standard_set(engine)
    manifest = json.loads((engine.set_dir / "manifest.json").read_text())
    rc, result = _run_module_file(tmp_path, {"patchset": str(engine.set_dir), "manifest": manifest,
                                             "venv": str(tmp_path / "not-yet"), "_ansible_check_mode": True})
    assert rc == 0 and result["skipped"] and not result["changed"]
    assert result["state"] == "not-installed"


def test_failed_rename_midway_restores_the_files_already_replaced(engine: Engine, monkeypatch):
    patchset = standard_set(engine)
    before = engine.snapshot()
    real_replace, calls = os.replace, []

    def replace_failing_on_the_second_file(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(bp.os, "replace", replace_failing_on_the_second_file)
    with pytest.raises(bp.PatchSetError, match=r"cannot write the patched files.*No space left"):
        engine.run(patchset)
    monkeypatch.undo()
    assert engine.snapshot() == before
    assert not list(engine.site.rglob("*.bws-tmp")), "temp files left behind"


def test_module_refuses_when_the_installed_version_is_not_the_expected_one(engine: Engine, tmp_path: Path):
    standard_set(engine)
    manifest = json.loads((engine.set_dir / "manifest.json").read_text())
    before = engine.snapshot()
    rc, result = _run_module_file(tmp_path, {"patchset": str(engine.set_dir), "manifest": manifest,
                                             "python": engine.python, "state_dir": str(engine.state_dir),
                                             "engine_version": "1.5.1"})
    assert rc == 1 and result["failed"]
    assert "demo-engine 1.5.0 installed, not 1.5.1" in result["msg"]
    assert engine.snapshot() == before
