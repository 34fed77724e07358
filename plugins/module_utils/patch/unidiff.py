# Exact-context unified diffs: parse, apply, reverse-apply, render. Standard library only.
#
# Unlike GNU patch (fuzz) and git apply (offsets), a hunk applies only where its header says and only when
# every context and removed line matches byte for byte. A patch that lands anywhere else is refused, with
# the hunk, the expected lines and the lines found.
"""Exact-context unified diff application (no fuzz, no offset)."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

NO_NEWLINE_MARKER = "\\ No newline at end of file"
DEV_NULL = "/dev/null"
_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchFormatError(ValueError):
    """The patch text is not a well-formed unified diff."""


class HunkMismatchError(ValueError):
    """A hunk's context or removed lines do not match the file exactly where the hunk says."""

    def __init__(self, path: str, hunk_number: int, line: int, *, expected: list[str], found: list[str],
                 reason: str = "context mismatch"):
        self.path = path
        self.hunk_number = hunk_number
        self.line = line
        self.expected = expected
        self.found = found
        self.reason = reason
        super().__init__(self.describe())

    def describe(self) -> str:
        pairs = zip(self.expected, self.found, strict=False)
        shorter = min(len(self.expected), len(self.found))
        first_bad = next((i for i, (e, f) in enumerate(pairs) if e != f), shorter)
        lines = [f"{self.path}: hunk #{self.hunk_number} ({self.reason}) at line {self.line}; "
                 f"first difference at line {self.line + first_bad}"]
        lines.append("  expected:")
        lines.extend(f"    |{text}" for text in self.expected)
        lines.append("  found:")
        lines.extend(f"    |{text}" for text in self.found)
        return "\n".join(lines)


@dataclass
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    # (tag, text): tag is ' ', '-' or '+'; text has no line terminator.
    lines: list[tuple[str, str]] = field(default_factory=list)
    old_ends_without_newline: bool = False
    new_ends_without_newline: bool = False

    def old_lines(self) -> list[str]:
        return [text for tag, text in self.lines if tag in " -"]

    def new_lines(self) -> list[str]:
        return [text for tag, text in self.lines if tag in " +"]

    def reversed(self) -> Hunk:
        swap = {" ": " ", "-": "+", "+": "-"}
        return Hunk(self.new_start, self.new_len, self.old_start, self.old_len,
                    [(swap[tag], text) for tag, text in self.lines],
                    self.new_ends_without_newline, self.old_ends_without_newline)


@dataclass
class FilePatch:
    old_path: str
    new_path: str
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        """The path the patch touches (the new name, or the old one when the file is deleted)."""
        return self.old_path if self.new_path == DEV_NULL else self.new_path

    @property
    def creates(self) -> bool:
        return self.old_path == DEV_NULL

    @property
    def deletes(self) -> bool:
        return self.new_path == DEV_NULL

    def reversed(self) -> FilePatch:
        return FilePatch(self.new_path, self.old_path, [h.reversed() for h in self.hunks])


def _strip_path(raw: str, strip: int) -> str:
    path = raw.split("\t", 1)[0].strip()
    if path == DEV_NULL:
        return path
    parts = path.split("/")
    if strip >= len(parts):
        raise PatchFormatError(f"cannot strip {strip} leading components from '{path}'")
    stripped = "/".join(parts[strip:])
    if stripped.startswith("/") or ".." in stripped.split("/"):
        raise PatchFormatError(f"refusing a path outside the tree: '{path}'")
    return stripped


def parse(text: str, strip: int = 1) -> list[FilePatch]:
    """Parse a unified diff (git or diff -u style). `strip` is patch's -p level."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    patches: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchFormatError(f"line {i + 1}: '---' header without a '+++' header")
        current = FilePatch(_strip_path(line[4:], strip), _strip_path(lines[i + 1][4:], strip))
        patches.append(current)
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            i = _parse_hunk(lines, i, current)
        if not current.hunks:
            raise PatchFormatError(f"{current.path}: file header without hunks")
    if not patches:
        raise PatchFormatError("no file headers ('--- a/…' / '+++ b/…') found")
    return patches


def _parse_hunk(lines: list[str], i: int, target: FilePatch) -> int:
    match = _HUNK_HEADER.match(lines[i])
    if not match:
        raise PatchFormatError(f"line {i + 1}: bad hunk header '{lines[i]}'")
    old_start, old_len, new_start, new_len = (
        int(match.group(1)), int(match.group(2) or 1), int(match.group(3)), int(match.group(4) or 1))
    hunk = Hunk(old_start, old_len, new_start, new_len)
    i += 1
    old_seen = new_seen = 0
    while i < len(lines) and (old_seen < old_len or new_seen < new_len):
        line = lines[i]
        tag, text = (line[0], line[1:]) if line else (" ", "")
        if tag not in " -+":
            raise PatchFormatError(f"{target.path}: line {i + 1}: unexpected '{line}' inside hunk "
                                   f"#{len(target.hunks) + 1}")
        hunk.lines.append((tag, text))
        old_seen += tag in " -"
        new_seen += tag in " +"
        i += 1
        if i < len(lines) and lines[i] == NO_NEWLINE_MARKER:
            if tag in " -":
                hunk.old_ends_without_newline = True
            if tag in " +":
                hunk.new_ends_without_newline = True
            i += 1
    if old_seen != old_len or new_seen != new_len:
        raise PatchFormatError(f"{target.path}: hunk #{len(target.hunks) + 1} is truncated "
                               f"(header says -{old_len} +{new_len}, body has -{old_seen} +{new_seen})")
    target.hunks.append(hunk)
    return i


def split_lines(text: str) -> tuple[list[str], bool]:
    """Lines without terminators, and whether the text ends with a newline."""
    if text == "":
        return [], True
    ends_with_newline = text.endswith("\n")
    body = text[:-1] if ends_with_newline else text
    return body.split("\n"), ends_with_newline


def join_lines(lines: list[str], ends_with_newline: bool) -> str:
    if not lines:
        return ""
    return "\n".join(lines) + ("\n" if ends_with_newline else "")


def apply_file_patch(original: str | None, patch: FilePatch) -> str | None:
    """Apply one file's hunks exactly; returns the new text (None when the patch deletes the file).

    `original` is None when the file does not exist. Raises HunkMismatchError on any difference.
    """
    if patch.creates:
        if original is not None:
            raise HunkMismatchError(patch.path, 1, 1, expected=[], found=split_lines(original)[0][:5],
                                    reason="file to be created already exists")
        original = ""
    elif original is None:
        raise HunkMismatchError(patch.path, 1, 1, expected=patch.hunks[0].old_lines(), found=[],
                                reason="file does not exist")
    lines, ends_with_newline = split_lines(original)
    result: list[str] = []
    cursor = 0
    for number, hunk in enumerate(patch.hunks, start=1):
        # A zero-length side starts *after* the given line (diff convention).
        start = hunk.old_start if hunk.old_len == 0 else hunk.old_start - 1
        expected = hunk.old_lines()
        found = lines[start:start + len(expected)] if start >= 0 else []
        if start < cursor:
            raise HunkMismatchError(patch.path, number, start + 1, expected=expected, found=found,
                                    reason="hunk overlaps the previous one")
        if found != expected:
            raise HunkMismatchError(patch.path, number, start + 1, expected=expected, found=found)
        at_end = start + len(expected) == len(lines)
        if hunk.old_ends_without_newline and not (at_end and not ends_with_newline):
            raise HunkMismatchError(patch.path, number, start + 1, expected=expected, found=found,
                                    reason="the file ends with a newline where the hunk says it does not")
        if at_end and expected and not hunk.old_ends_without_newline and not ends_with_newline:
            raise HunkMismatchError(patch.path, number, start + 1, expected=expected, found=found,
                                    reason="the file lacks the final newline the hunk expects")
        result.extend(lines[cursor:start])
        result.extend(hunk.new_lines())
        cursor = start + len(expected)
        if at_end:
            ends_with_newline = not hunk.new_ends_without_newline
    result.extend(lines[cursor:])
    if patch.deletes:
        if result:
            raise HunkMismatchError(patch.path, len(patch.hunks), 1, expected=[], found=result[:5],
                                    reason="file to be deleted has more lines than the patch removes")
        return None
    return join_lines(result, ends_with_newline)


def apply(files: dict[str, str | None], patches: list[FilePatch],
          reverse: bool = False) -> dict[str, str | None]:
    """Apply a patch series to in-memory files ({path: text or None}); returns only the changed paths.

    With reverse=True the series is undone: patches in reverse order, each hunk reversed.
    """
    state = dict(files)
    series = [p.reversed() for p in reversed(patches)] if reverse else patches
    touched: list[str] = []
    for patch in series:
        state[patch.path] = apply_file_patch(state.get(patch.path), patch)
        if patch.path not in touched:
            touched.append(patch.path)
    return {path: state[path] for path in touched}


def render(path: str, before: str | None, after: str | None, context: int = 3) -> str:
    """A unified diff of one file, as `diff -u` would print it (a/ and b/ prefixes)."""
    old = (before or "").splitlines(keepends=True)
    new = (after or "").splitlines(keepends=True)
    out = []
    for line in difflib.unified_diff(old, new, f"a/{path}" if before is not None else DEV_NULL,
                                     f"b/{path}" if after is not None else DEV_NULL, n=context):
        out.append(line if line.endswith("\n") else line + "\n" + NO_NEWLINE_MARKER + "\n")
    return "".join(out)
