"""The Kimi EAGLE-3 patch set against the real upstream vLLM files of several versions.

  0.17.x  applies with zero fuzz to the sdist files of 0.17.0 and 0.17.1 and compiles; in the 0.17.1
          contract venv the patched modules import, supports_eagle3() holds for DeepseekV2/V3 and
          Kimi-K2.5, and the real SpeculativeConfig._verify_args accepts kimi_k2 (unpatched: all fail)
  0.16.0  refused, with a message that names the supported range
  0.18.0, 0.33.0  not needed: by version and by the installed files' content; nothing written

Only 0.17.1 gets a venv; the others are judged on files extracted from their sdists.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import vllm_helpers  # first: it maps the repository's module_utils into ansible.module_utils
from ansible_collections.blackwell.serving.plugins.module_utils.patch import patchset as bp
from ansible_collections.blackwell.serving.plugins.module_utils.patch.unidiff import HunkMismatchError, apply

pytestmark = pytest.mark.contract

PATCHED_VERSION = "0.17.1"


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def kimi_set() -> bp.PatchSet:
    return vllm_helpers.load_kimi_set()[0]


def upstream(version: str, patchset: bp.PatchSet, tmp_path: Path) -> Path:
    return vllm_helpers.extract_upstream_files(version, vllm_helpers.files_the_set_reads(patchset),
                                              tmp_path / f"vllm-{version}")


def test_manifest_declares_the_set(kimi_set: bp.PatchSet):
    assert (kimi_set.engine, kimi_set.applies_to) == ("vllm", ">=0.17.0,<0.18")
    assert kimi_set.not_needed_from == "0.18.0"
    assert kimi_set.touched == ["vllm/config/speculative.py", "vllm/v1/spec_decode/eagle.py",
                                "vllm/model_executor/models/deepseek_v2.py",
                                "vllm/model_executor/models/kimi_k25.py"]


@pytest.mark.parametrize("version", ["0.17.0", PATCHED_VERSION])
def test_017_applies_with_zero_fuzz_and_compiles(kimi_set: bp.PatchSet, tmp_path: Path, version: str):
    site = upstream(version, kimi_set, tmp_path)
    plan = bp.plan(kimi_set, str(site), version)
    assert plan.state == bp.APPLIED, plan.msg
    # every hunk of every patch matched exactly where its header says (apply() has no fuzz and no offset)
    for rel, text in plan.after.items():
        compile(text, rel, "exec", dont_inherit=True)
    # and the series reverses exactly back to the pristine upstream files
    assert apply(plan.after, kimi_set.file_patches(), reverse=True) == plan.before


def test_017_whitelist_and_kimi_branch_match_what_upstream_did_in_018(kimi_set: bp.PatchSet, tmp_path: Path):
    """Patches 0001 and 0002 are backports: the lines they add are the lines 0.18.0 has."""
    site = upstream(PATCHED_VERSION, kimi_set, tmp_path)
    after = bp.plan(kimi_set, str(site), PATCHED_VERSION).after
    newer = upstream("0.18.0", kimi_set, tmp_path)
    for entry in kimi_set.patches[:2]:
        [file_patch] = entry.parsed
        added = [text for hunk in file_patch.hunks for tag, text in hunk.lines if tag == "+"]
        assert "\n".join(added) in (newer / file_patch.path).read_text()
        assert "\n".join(added) in after[file_patch.path]


@pytest.mark.parametrize("version", ["0.18.0", "0.33.0"])
def test_newer_versions_need_nothing_and_nothing_is_written(kimi_set: bp.PatchSet, tmp_path: Path,
                                                            version: str):
    site = upstream(version, kimi_set, tmp_path)
    before = tree_digest(site)
    never_run = "/nonexistent/python-never-run"
    result = bp.execute(kimi_set, str(site), never_run, version, str(tmp_path / "state"))
    assert (result["state"], result["changed"]) == ("not-needed", False)
    assert all(item["upstream_has_fix"] for item in result["upstream"]), result["upstream"]
    assert tree_digest(site) == before
    assert not (tmp_path / "state").exists()
    # and the content check stands on its own: had the version been misreported as 0.17.x, the patches
    # would still not be applied, because the files already contain the fix
    in_range = bp.plan(kimi_set, str(site), "0.17.1")
    assert in_range.state == bp.NOT_NEEDED, in_range.msg


@pytest.mark.parametrize("version", ["0.18.0", "0.33.0"])
def test_patches_do_not_land_anywhere_in_newer_files(kimi_set: bp.PatchSet, tmp_path: Path, version: str):
    """The fuzz trap: GNU patch -F3 pastes the whitelist into 0.33's DeepSeek-V4 MTP code. Exact matching
    refuses every patch of the set on these files."""
    site = upstream(version, kimi_set, tmp_path)
    files = bp.read_tree(str(site), kimi_set.touched)
    for entry in kimi_set.patches:
        with pytest.raises(HunkMismatchError):
            apply(files, entry.parsed)


def test_016_is_refused_with_a_clear_message(kimi_set: bp.PatchSet, tmp_path: Path):
    site = upstream("0.16.0", kimi_set, tmp_path)
    before = tree_digest(site)
    with pytest.raises(bp.PatchSetError) as caught:
        bp.execute(kimi_set, str(site), "/nonexistent/python-never-run", "0.16.0", str(tmp_path / "state"))
    assert caught.value.details["state"] == "refused"
    message = caught.value.msg
    assert "vllm 0.16.0 is outside the range of patch set 'kimi-eagle3-0.17' (>=0.17.0,<0.18)" in message
    assert ">= 0.18.0, which has the fix upstream" in message
    assert tree_digest(site) == before
    # not only the version: 0.16.0's files do not match the set exactly either
    with pytest.raises(HunkMismatchError):
        apply(bp.read_tree(str(site), kimi_set.touched), kimi_set.file_patches())


def test_017_patched_in_a_real_venv_imports_and_supports_eagle3(kimi_set: bp.PatchSet, tmp_path: Path):
    venv = vllm_helpers.contract_venv(PATCHED_VERSION)
    python = str(venv / "bin" / "python")
    version, site = bp.discover(python, "vllm")
    assert version == PATCHED_VERSION
    pristine = upstream(PATCHED_VERSION, kimi_set, tmp_path)
    # The cached venv must start pristine (a crashed earlier run may have left it patched).
    for rel in kimi_set.touched:
        shutil.copyfile(pristine / rel, Path(site) / rel)
    bp.clear_pycache(site, kimi_set.touched)
    # Upstream 0.17.1 fails every assertion of the set, so passing them after patching means something:
    # supports_eagle3() is False and the real SpeculativeConfig._verify_args rejects kimi_k2.
    unpatched = bp.run_in_engine(python, bp.verification_spec(kimi_set, site, True))
    assert [a["ok"] for a in unpatched["assertions"]] == [False] * len(kimi_set.verify.assertions), unpatched
    rejection = next(a["error"] for a in unpatched["assertions"] if "_verify_args" in a["that"])
    assert "eagle3 is only supported for" in rejection and "kimi_k2" not in rejection.split("Got")[0]
    try:
        result = bp.execute(kimi_set, site, python, version, str(tmp_path / "state"))
        assert (result["state"], result["changed"], result["verified"]) == ("applied", True, True)
        assertions = {a["that"]: a["ok"] for a in result["verification"]["assertions"]}
        assert assertions["supports_eagle3(DeepseekV2ForCausalLM)"] is True
        assert assertions["supports_eagle3(DeepseekV3ForCausalLM)"] is True
        assert assertions["supports_eagle3(KimiK25ForConditionalGeneration)"] is True
        assert all(assertions.values()), assertions  # incl. _verify_args accepting kimi_k2/kimi_k25/deepseek
        imported = {i["module"]: i["file"] for i in result["verification"]["imports"]}
        assert imported["vllm.model_executor.models.deepseek_v2"] == str(
            Path(site) / "vllm/model_executor/models/deepseek_v2.py")
        again = bp.execute(kimi_set, site, python, version, str(tmp_path / "state"))
        assert (again["state"], again["changed"]) == ("already-applied", False)
    finally:
        for rel in kimi_set.touched:
            shutil.copyfile(pristine / rel, Path(site) / rel)
        bp.clear_pycache(site, kimi_set.touched)
