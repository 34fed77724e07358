# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""The deploy stamp (<state dir>/deployed.json): what a deploy that ended with its release serving leaves for the next
one to compare with, and the comparison - whether a re-run would change nothing.

The stamp holds the controller's digest of the deploy's inputs (lookup deploy_fingerprint), the release, and the
SHA-256 of every file the release is made of or depends on, as they were when it passed: the files of its release
directory, its unit in /etc/systemd/system, the boot unit and its program, its venv's stamp, and whatever the engine
role adds (a host-made key file, the kernel cache's toolchain stamp). A re-run is a no-op when the digest is the same,
state.json says that release serves with no failed deploy since, every file hashes as recorded, no unit of it runs on
trial, its unit is active, only the boot unit is enabled, and /health answers 200. A file inside the venv changed
without its stamp is not seen (the venv is not hashed file by file).

Standard library only (module engine_noop, on the target).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from ansible_collections.blackwell.serving.plugins.module_utils.release.state import (
    read_json_file,
    release_state,
)

STAMP_FILE = "deployed.json"
STAMP_VERSION = 1


def sha256_or_none(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except FileNotFoundError:
        return None


def release_files(release_dir: str) -> list[str]:
    found = []
    for directory, subdirectories, names in os.walk(release_dir):
        subdirectories.sort()
        found += [os.path.join(directory, name) for name in sorted(names)]
    return found


def stamped_paths(state_dir: str, release_id: str, release: dict[str, Any], unit_dir: str, *,
                  boot_files: list[str], extra: list[str]) -> list[str]:
    """The files a release serves from: its directory, its unit in /etc, the boot unit's files, its venv's stamp,
    and the engine role's own (extra)."""
    paths = release_files(os.path.join(state_dir, "releases", release_id))
    paths.append(os.path.join(unit_dir, str(release.get("unit"))))
    if release.get("venv"):
        paths.append(os.path.join(str(release["venv"]), "python-env.json"))
    return list(dict.fromkeys([*paths, *boot_files, *(p for p in extra if p)]))


def make_stamp(state_dir: str, fingerprint: str, unit_dir: str, boot_files: list[str], extra: list[str]) -> dict:
    """The stamp of the release state.json says serves (ValueError when none does)."""
    raw, _ = read_json_file(os.path.join(state_dir, "state.json"))
    state = release_state(raw)
    if state["status"] != "serving" or not state["current"]:
        raise ValueError(f"state.json does not say a release serves (status {state['status']})")
    release_id = str(state["current"])
    release, _ = read_json_file(os.path.join(state_dir, "releases", release_id, "release.json"))
    if not isinstance(release, dict):
        raise ValueError(f"release {release_id} has no release.json")
    paths = stamped_paths(state_dir, release_id, release, unit_dir, boot_files=boot_files, extra=extra)
    return {"version": STAMP_VERSION, "fingerprint": fingerprint, "release": release_id, "unit": release.get("unit"),
            "health_url": release.get("health_url"), "files": {p: sha256_or_none(p) for p in paths}}


def stamp_text(stamp: dict) -> str:
    return json.dumps(stamp, indent=2, sort_keys=True) + "\n"


def file_drift(files: dict[str, str | None]) -> list[str]:
    drift = []
    for path, recorded in files.items():
        now = sha256_or_none(path)
        if now != recorded:
            drift.append(f"{path} {'is gone' if now is None else 'appeared' if recorded is None else 'changed'}")
    return drift


def stamp_drift(state_dir: str, fingerprint: str) -> tuple[dict | None, list[str]]:
    """(the stamp, what differs from it on disk and in state.json); the runtime (unit, health) is the caller's."""
    try:
        stamp, _ = read_json_file(os.path.join(state_dir, STAMP_FILE))
        raw, _ = read_json_file(os.path.join(state_dir, "state.json"))
        state = release_state(raw)
    except ValueError as exc:
        return None, [str(exc)]
    if not isinstance(stamp, dict) or stamp.get("version") != STAMP_VERSION:
        return None, ["no deploy stamp (no deploy of this version finished here)"]
    drift = []
    if stamp.get("fingerprint") != fingerprint:
        drift.append("the deploy's inputs differ from the last one's (a variable, the profile, the lock or the "
                     "checkout's code)")
    if state["status"] != "serving" or state["current"] != stamp.get("release"):
        drift.append(f"state.json says {state['status']} {state['current'] or 'nothing'}, the last deploy left "
                     f"{stamp.get('release')} serving")
    if state.get("failed"):
        drift.append(f"a deploy of {state['failed']} failed since (state.json)")
    return stamp, drift + file_drift(stamp.get("files") or {})
