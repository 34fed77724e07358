"""Attach an engine lock's sha256 digests to its requirement lines, for `uv pip sync --require-hashes`."""

from __future__ import annotations

import re

SHA256 = re.compile(r"^[0-9a-f]{64}$")


def requirement_name(line: str) -> str:
    """`name` of `name[extras]==version ...`, as the lock's `hashes` mapping spells it."""
    return re.split(r"[\[=<>!~;\s]", line.strip(), maxsplit=1)[0]


def hashed_requirements(lines: list[str], hashes: dict[str, list[str]]) -> list[str]:
    """Each line with `--hash=sha256:<digest>` for every digest `hashes` lists under its name; a line that already
    carries --hash options keeps its own. Lines without a digest stay as they are (the role refuses them)."""
    hashed = []
    for line in lines:
        if line.lstrip().startswith("#"):
            hashed.append(line)
            continue
        listed = [] if "--hash=" in line else hashes.get(requirement_name(line)) or []
        digests = [digest for digest in listed if SHA256.match(str(digest))]
        hashed.append(" ".join([line, *(f"--hash=sha256:{digest}" for digest in digests)]))
    return hashed


class FilterModule:
    def filters(self) -> dict:
        return {"hashed_requirements": hashed_requirements}
