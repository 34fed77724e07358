#!/usr/bin/env python3
"""Write the `hashes:` block of engine lock files: the sha256 of every file of each pinned requirement that a
GPU host can install (wheels for Linux x86_64 or any platform and CPython 3.11-3.14, and the sdist), read from
the index's simple repository API (PEP 691 JSON, which lists each file's sha256; nothing is downloaded).

The engine roles install a lock's `requirements` with `uv pip sync --require-hashes`, each line carrying these
hashes, so a file that differs from the one the lock was made from is refused. Run it after changing a lock's
`requirements` (roles/sglang/locks/README.md, "Add or bump a version"):

    source scripts/env.sh && python3 scripts/lock-engine-hashes.py roles/sglang/locks/sglang-0.5.23.yml
    BWS_LOCK_INDEX=https://pypi.org/simple python3 scripts/lock-engine-hashes.py LOCK.yml ...

The block is the last key of the file and is replaced as a whole; the rest of the file is kept as written.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    canonicalize_version,
    parse_sdist_filename,
    parse_wheel_filename,
)

INDEX = os.environ.get("BWS_LOCK_INDEX", "https://pypi.org/simple").rstrip("/")
PYTHONS = ("311", "312", "313", "314")
HEADER = ("# sha256 of every file of each requirement a Linux x86_64 host can install (CPython 3.11-3.14 wheels\n"
          "# and the sdist), from the index's PEP 691 listing; written by scripts/lock-engine-hashes.py. The role\n"
          "# installs `requirements` with `uv pip sync --require-hashes`: a requirement without hashes is refused.\n")


def index_files(name: str) -> list[dict]:
    request = urllib.request.Request(f"{INDEX}/{canonicalize_name(name)}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.load(reply)["files"]


def python_fits(interpreter: str, abi: str) -> bool:
    if abi == "abi3" or interpreter in ("py3", "py2.py3"):
        return True
    match = re.fullmatch(r"(?:cp|py)3(\d+)", interpreter)
    return bool(match) and ("3" + match.group(1)) in PYTHONS and not abi.endswith("t")


def host_can_install(filename: str, name: str, version: str) -> bool:
    """A wheel for Linux x86_64 (or any platform) and a CPython the hosts run, or the sdist, of name==version."""
    wanted = (canonicalize_name(name), canonicalize_version(version))
    try:
        wheel_name, wheel_version, _build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        try:
            sdist_name, sdist_version = parse_sdist_filename(filename)
        except InvalidSdistFilename:
            return False
        return (sdist_name, canonicalize_version(sdist_version)) == wanted
    if (wheel_name, canonicalize_version(wheel_version)) != wanted:
        return False
    return any((tag.platform == "any" or ("linux" in tag.platform and tag.platform.endswith("x86_64")))
               and python_fits(tag.interpreter, tag.abi) for tag in tags)


def requirement_hashes(requirement: str) -> tuple[str, list[str]]:
    name, _, version = requirement.partition("==")
    bare = name.split("[", 1)[0]
    digests = sorted({entry["hashes"]["sha256"] for entry in index_files(bare)
                      if "sha256" in entry.get("hashes", {}) and not entry.get("yanked")
                      and host_can_install(entry["filename"], bare, version)})
    if not digests:
        raise SystemExit(f"{requirement}: the index {INDEX} lists no file a Linux x86_64 host can install")
    return bare, digests


def hashes_block(requirements: list[str]) -> str:
    with ThreadPoolExecutor(max_workers=8) as pool:
        found = dict(pool.map(requirement_hashes, requirements))
    lines = [HEADER.rstrip("\n"), "hashes:"]
    for name in sorted(found, key=canonicalize_name):
        lines.append(f"  {name}:")
        lines += [f"    - {digest}" for digest in found[name]]
    return "\n".join(lines) + "\n"


def rewrite(path: Path) -> int:
    text = path.read_text(encoding="utf-8")
    requirements = [str(r) for r in yaml.safe_load(text)["requirements"]]
    kept = text.split(HEADER, 1)[0] if HEADER in text else text
    if re.search(r"^hashes:", kept, flags=re.MULTILINE):
        raise SystemExit(f"{path}: has a 'hashes:' key this script did not write; remove it first")
    block = hashes_block(requirements)
    path.write_text(kept.rstrip("\n") + "\n" + block, encoding="utf-8")
    return block.count("    - ")


def main(paths: list[str]) -> int:
    if not paths or any(p in ("-h", "--help") for p in paths):
        print(__doc__)
        return 0 if paths else 2
    for name in paths:
        print(f"{name}: {rewrite(Path(name))} hashes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
