"""What a new release changes against the release that serves: file by file, secret values masked.

A release directory is new whenever its content changes (its id is derived from the content), so a diff against
the empty new directory shows whole files and hides what a user changed. This compares each file of the new
release with the same file of the release that serves (state.json's `current`) instead; files that hold secrets
(an engine config with its keys, an environment file) are compared with every key-like value masked, so a changed
flag shows and no key does.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ansible_collections.blackwell.serving.plugins.module_utils.secrets.redact import MASK, redact

# `name: value` (YAML), `NAME=value` (environment files), `"name": value` (JSON), `--name value` (argv lists).
_ASSIGNMENT = re.compile(r'^(?P<lead>\s*["\']?-{0,2})(?P<name>[A-Za-z0-9_.-]+)(?P<sep>["\']?\s*[:=]\s*)(?P<value>.*?)'
                         r'(?P<trail>,?)\s*$')
# Names that hold a secret whatever the engine calls them (fail closed: a new key flag is masked unlisted).
_SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "credential")
_MIN_SCRUB = 4  # shorter values would mask ordinary text wherever it occurs


@dataclass(frozen=True)
class ReleaseFile:
    name: str  # inside the release directory
    content: str
    secret: bool


def normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def is_secret_name(name: str, masked_names: list[str]) -> bool:
    """The name carries a secret: one of `masked_names` (flag or variable names, `_` and `-` alike, as a suffix:
    VLLM_API_KEY ends in api-key), or a name with a secret-like word in it."""
    norm = normalise(name)
    if any(norm == m or norm.endswith("-" + m) for m in map(normalise, masked_names) if m):
        return True
    return any(word in norm for word in _SECRET_WORDS)


def mask_secret_values(text: str, masked_names: list[str]) -> tuple[str, list[str]]:
    """The text with the value of every secret-named assignment replaced by the mask, and the values replaced
    (a caller scrubs them from anything else it shows)."""
    hidden: list[str] = []
    lines = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        match = _ASSIGNMENT.match(body)
        if match and match["value"] and is_secret_name(match["name"], masked_names):
            value = match["value"].strip().strip("\"'")
            if value:
                hidden.append(value)
            body = f"{match['lead']}{match['name']}{match['sep']}{MASK}{match['trail']}"
        lines.append(body + line[len(line.rstrip("\r\n")):])
    return "".join(lines), hidden


def mask_secret_file(name: str, text: str, masked_names: list[str]) -> tuple[str, list[str]]:
    """A secret file masked: whole where its own name is a secret name (a credential file such as `api-key` holds
    nothing but the key), else each secret-named assignment in it."""
    if is_secret_name(os.path.basename(name), masked_names):
        value = text.strip()
        return (MASK + "\n" if value else text), ([value] if value else [])
    return mask_secret_values(text, masked_names)


def read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return None


def serving_release_id(state: object, release_id: str) -> str | None:
    """The release state.json names as current, when it is another release than this one."""
    current = state.get("current") if isinstance(state, dict) else None
    return current if isinstance(current, str) and current and current != release_id and "/" not in current else None


def compare_with_serving(state_dir: str, serving_id: str, release_id: str, files: list[ReleaseFile],
                         masked_names: list[str]) -> list[dict[str, str]]:
    """Diff entries (Ansible's before/after form) for each file that differs between the serving release and this
    one, in this release's file order, then the files only the serving release has. Secret files (and files only
    the serving release has) are masked on both sides, and every masked value is scrubbed from all entries; a
    secret that changed while the masked text did not is said in a line of its own."""
    releases = os.path.join(state_dir, "releases")
    serving_dir, new_dir = os.path.join(releases, serving_id), os.path.join(releases, release_id)
    names = [f.name for f in files]
    secret = {f.name for f in files if f.secret}
    old_only = sorted(set(_listing(serving_dir)) - set(names))
    entries: list[dict[str, str]] = []
    hidden: list[str] = []
    for name, new in [(f.name, f.content) for f in files] + [(n, None) for n in old_only]:
        old = read_text(os.path.join(serving_dir, name))
        if old == new:
            continue
        shown_old, shown_new = old or "", new or ""
        note = ""
        # A file only the serving release has is masked too: whether it was secret there is not known here.
        if name in secret or new is None:
            shown_old, old_hidden = mask_secret_file(name, shown_old, masked_names)
            shown_new, new_hidden = mask_secret_file(name, shown_new, masked_names)
            hidden += old_hidden + new_hidden
            if shown_old == shown_new:
                note = f"# {name}: a secret value changed (masked)\n"
        old_path, new_path = os.path.join(serving_dir, name), os.path.join(new_dir, name)
        entries.append({
            "before_header": f"{old_path} (serving)" if old is not None else f"{old_path} (absent)",
            "after_header": new_path if new is not None else f"{new_path} (absent)",
            "before": shown_old,
            "after": shown_new + note,
        })
    scrub = sorted({h for h in hidden if len(h) >= _MIN_SCRUB}, key=len, reverse=True)
    return [{key: redact(value, scrub) for key, value in entry.items()} for entry in entries]


def _listing(directory: str) -> list[str]:
    """Plain files of a release directory and one level below it (`<dir>/<name>`), as release names."""
    found: list[str] = []
    try:
        entries = sorted(os.listdir(directory))
    except OSError:
        return found
    for entry in entries:
        path = os.path.join(directory, entry)
        if os.path.isfile(path) and not os.path.islink(path):
            found.append(entry)
        elif os.path.isdir(path) and not os.path.islink(path):
            found += [f"{entry}/{sub}" for sub in sorted(os.listdir(path))
                      if os.path.isfile(os.path.join(path, sub))]
    return found
