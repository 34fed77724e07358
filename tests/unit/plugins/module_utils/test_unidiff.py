"""plugins/module_utils/patch/unidiff.py: exact-context unified diffs (no fuzz, no offsets)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
from tests.module_utils_loader import use_repository_module_utils  # noqa: E402

use_repository_module_utils()

from ansible_collections.blackwell.serving.plugins.module_utils.patch.unidiff import (  # noqa: E402
    HunkMismatchError,
    PatchFormatError,
    apply,
    apply_file_patch,
    parse,
    render,
)

ORIGINAL = "".join(f"line {n}\n" for n in range(1, 21))

TWO_HUNKS = """\
Some description the parser must skip.

--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -2,3 +2,4 @@
 line 2
 line 3
+inserted after 3
 line 4
@@ -15,3 +16,3 @@
 line 15
-line 16
+line sixteen
 line 17
"""


def test_parse_reads_headers_hunks_and_strips_one_component():
    [patch] = parse(TWO_HUNKS)
    assert patch.path == "pkg/mod.py"
    headers = [(h.old_start, h.old_len, h.new_start, h.new_len) for h in patch.hunks]
    assert headers == [(2, 3, 2, 4), (15, 3, 16, 3)]
    assert patch.hunks[1].old_lines() == ["line 15", "line 16", "line 17"]
    assert patch.hunks[1].new_lines() == ["line 15", "line sixteen", "line 17"]


def test_apply_exact_changes_only_what_the_hunks_say():
    [patch] = parse(TWO_HUNKS)
    result = apply_file_patch(ORIGINAL, patch)
    expected = ORIGINAL.replace("line 3\n", "line 3\ninserted after 3\n")
    expected = expected.replace("line 16\n", "line sixteen\n")
    assert result == expected


def test_reverse_apply_restores_the_original_exactly():
    patches = parse(TWO_HUNKS)
    patched = apply({"pkg/mod.py": ORIGINAL}, patches)
    assert apply(patched, patches, reverse=True) == {"pkg/mod.py": ORIGINAL}


def test_context_mismatch_names_file_hunk_and_shows_expected_and_found():
    [patch] = parse(TWO_HUNKS)
    changed = ORIGINAL.replace("line 17\n", "line 17 (edited)\n")
    with pytest.raises(HunkMismatchError) as caught:
        apply_file_patch(changed, patch)
    err = caught.value
    assert (err.path, err.hunk_number, err.line) == ("pkg/mod.py", 2, 15)
    assert err.expected == ["line 15", "line 16", "line 17"]
    assert err.found == ["line 15", "line 16", "line 17 (edited)"]
    text = str(err)
    assert "hunk #2" in text and "first difference at line 17" in text
    assert "|line 17 (edited)" in text


def test_hunk_is_not_applied_at_an_offset_even_when_the_context_exists_elsewhere():
    [patch] = parse(TWO_HUNKS)
    shifted = "a new first line\n" + ORIGINAL
    with pytest.raises(HunkMismatchError) as caught:
        apply_file_patch(shifted, patch)
    assert caught.value.hunk_number == 1
    assert caught.value.found == ["line 1", "line 2", "line 3"]


def test_already_applied_patch_does_not_apply_again():
    patches = parse(TWO_HUNKS)
    patched = apply({"pkg/mod.py": ORIGINAL}, patches)
    with pytest.raises(HunkMismatchError):
        apply(patched, patches)


def test_missing_file_is_a_mismatch_not_a_crash():
    with pytest.raises(HunkMismatchError, match="file does not exist"):
        apply({}, parse(TWO_HUNKS))


def test_new_file_from_dev_null_and_no_newline_at_end():
    text = "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+a = 1\n+b = 2\n\\ No newline at end of file\n"
    [patch] = parse(text)
    assert patch.creates
    assert apply_file_patch(None, patch) == "a = 1\nb = 2"
    with pytest.raises(HunkMismatchError, match="already exists"):
        apply_file_patch("x\n", patch)


def test_final_newline_is_part_of_the_context():
    patch_text = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
    [patch] = parse(patch_text)
    assert apply_file_patch("a\nb\n", patch) == "a\nc\n"
    with pytest.raises(HunkMismatchError, match="final newline"):
        apply_file_patch("a\nb", patch)


def test_render_round_trips_through_parse_and_apply():
    before = ORIGINAL
    after = ORIGINAL.replace("line 10\n", "line ten\nline ten and a half\n").replace("line 20\n", "line 20")
    text = render("pkg/mod.py", before, after)
    assert text.startswith("--- a/pkg/mod.py\n+++ b/pkg/mod.py\n")
    assert "\\ No newline at end of file" in text
    assert apply({"pkg/mod.py": before}, parse(text)) == {"pkg/mod.py": after}


def test_series_touching_one_file_twice_applies_in_order_and_reverses_in_reverse_order():
    first = "--- a/f\n+++ b/f\n@@ -1,1 +1,1 @@\n-x = 1\n+x = 2\n"
    second = "--- a/f\n+++ b/f\n@@ -1,1 +1,1 @@\n-x = 2\n+x = 3\n"
    series = parse(first) + parse(second)
    assert apply({"f": "x = 1\n"}, series) == {"f": "x = 3\n"}
    assert apply({"f": "x = 3\n"}, series, reverse=True) == {"f": "x = 1\n"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("just text\n", "no file headers"),
        ("--- a/f\n@@ -1 +1 @@\n", "without a '\\+\\+\\+' header"),
        ("--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n", "truncated"),
        ("--- a/f\n+++ b/f\n@@ bogus @@\n", "bad hunk header"),
        ("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "outside the tree"),
        ("--- a/f\n+++ b/f\n", "without hunks"),
    ],
)
def test_malformed_patches_are_rejected_with_a_reason(text, message):
    with pytest.raises(PatchFormatError, match=message):
        parse(text)


def test_module_is_standard_library_only():
    source = (REPO / "plugins" / "module_utils" / "patch" / "unidiff.py").read_text()
    imports = {line.split()[1].split(".")[0] for line in source.splitlines()
               if line.startswith(("import ", "from "))}
    assert imports <= set(sys.stdlib_module_names) | {"__future__"}
