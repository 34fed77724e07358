"""gpu_release, /dev/shm: remove the engines' leftover shared-memory entries that nothing holds.

Stdlib only; runs on the target.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from typing import Any

from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release.scope import (
    Scope,
    Users,
    resolve_users,
    user_name,
)
from ansible_collections.blackwell.serving.plugins.module_utils.host.procfs import Proc, read_mapped_paths


def shm_users(shm_dir: str, procs: dict[int, Proc]) -> dict[str, set[int]]:
    """shm path -> PIDs that have it open or mapped."""
    prefix = shm_dir.rstrip("/") + "/"
    users: dict[str, set[int]] = {}
    for proc in procs.values():
        paths = {p[: -len(" (deleted)")] if p.endswith(" (deleted)") else p for p in proc.fds}
        paths |= read_mapped_paths(proc.pid)
        for path in paths:
            if path.startswith(prefix):
                users.setdefault(path, set()).add(proc.pid)
    return users


def shm_owners(params: dict[str, Any], scope: Scope) -> Users:
    """Whose /dev/shm entries may go: O(shm_owner), or the engine service users when it is empty."""
    return resolve_users(params["shm_owner"]) if params["shm_owner"] else scope.users


def clean_shm(
    params: dict[str, Any], procs: dict[int, Proc], check_mode: bool, targets: set[int], owners: Users
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "dir": params["shm_dir"],
        "owners": owners.present,
        "removed": [],
        "would_remove": [],
        "kept": [],
    }
    if not params["clean_shm"]:
        result["skipped"] = "clean_shm is false"
        return result
    if params["report_only"]:
        result["skipped"] = "report only"
        return result
    shm_dir = os.path.realpath(params["shm_dir"])
    try:
        names = sorted(os.listdir(shm_dir))
    except OSError as exc:
        result["skipped"] = f"cannot list {shm_dir}: {exc.strerror}"
        return result
    users = shm_users(shm_dir, procs)
    for name in names:
        if not any(fnmatch.fnmatchcase(name, p) for p in params["shm_patterns"]):
            continue
        path = os.path.join(shm_dir, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        holders = users.get(path, set())
        if check_mode:
            holders = holders - targets  # targets would be gone by then
        reason = None
        if not stat.S_ISREG(st.st_mode):
            reason = "not a regular file"
        elif st.st_uid not in owners.uids:
            reason = f"owned by {user_name(st.st_uid)}, not by {', '.join(owners.present) or 'an engine service user'}"
        elif holders:
            reason = "open or mapped by PIDs " + ", ".join(str(p) for p in sorted(holders))
        if reason:
            result["kept"].append({"path": path, "reason": reason})
        elif check_mode:
            result["would_remove"].append(path)
        else:
            try:
                os.unlink(path)
                result["removed"].append(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                result["kept"].append({"path": path, "reason": f"unlink failed: {exc.strerror}"})
    return result
