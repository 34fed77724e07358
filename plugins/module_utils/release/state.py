# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""The host's release state (state.json): which release serves, which one served before, and what happens to
them on a switch, a rollback, a teardown and when old releases are pruned.

state.json holds {"current", "previous", "status"[, "boot"][, "failed"]}:
- status "serving": `current` answered /health and passed its gate;
- status "switching": a deploy (or rollback) stopped what served and is starting `current`; it is not known to
  serve (an interrupted deploy leaves this; its re-run finishes it); `previous` is what a failed gate goes back to,
  and `boot` the last release that passed its gate, which a reboot starts (the same as `previous`, except where the
  release being started is itself the last that passed, or nothing served before: null). A switching state written
  before `boot` existed boots `previous`;
- status "stopped": teardown stopped `current`; it served before and may be rolled back to;
- "by": "rollback" on a switching state that rollback.yml wrote (release_to_restore).
A state.json written before "status" existed is read as serving.

What a reboot starts is what state.json says (release_to_boot; the boot unit's program,
roles/engine_service/files/engine_boot.py, decides the same way), so it changes in the rename that writes state.json.

Standard library only: the gpu_release module records a teardown on the target with it, and the engine_service
role's release_state filters (controller side) are these functions.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

STATUSES = ("serving", "switching", "stopped")


def release_state(raw: Any) -> dict:
    """Normalise the parsed state.json (None when absent) to {current, previous, status}."""
    state = dict(raw) if isinstance(raw, dict) else {}
    status = state.get("status") or ("serving" if state.get("current") else "stopped")
    if status not in STATUSES:
        raise ValueError(f"state.json has an unknown status {status!r} (known: {', '.join(STATUSES)})")
    return {**state, "current": state.get("current"), "previous": state.get("previous"), "status": status}


def release_last_good(state: dict) -> str | None:
    """The newest release known to have served: current unless a switch to it never finished."""
    state = release_state(state)
    if state["status"] == "switching":
        return state.get("boot") if "boot" in state else state["previous"]
    return state["current"]


def release_to_boot(state: dict) -> str | None:
    """The release a reboot starts: the last good one, none after a teardown (stopped) or before any served."""
    state = release_state(state)
    return None if state["status"] == "stopped" else release_last_good(state)


def release_rollback_target(state: dict, release_id: str) -> str | None:
    """The release a failed deploy of `release_id` goes back to: never `release_id` itself."""
    state = release_state(state)
    return next((r for r in (release_last_good(state), state["previous"]) if r and r != release_id), None)


def release_state_switching(state: dict, release_id: str, by: str = "deploy") -> dict:
    """Written before the switch: `release_id` is being started; the rollback target is kept as previous, and the
    release a reboot starts meanwhile (the last good one; none on a host teardown stopped) as boot. A switch that
    rollback.yml makes says so (`"by": "rollback"`), so that rollback.yml re-run with no release after a cut finishes
    that switch instead of undoing it (release_to_restore); a deploy's switch has no `by`."""
    if by not in ("deploy", "rollback"):
        raise ValueError(f"a switch is made by a deploy or a rollback, not {by!r}")
    switching = {"current": release_id, "previous": release_rollback_target(state, release_id), "status": "switching",
                 "boot": release_to_boot(state)}
    return {**switching, "by": "rollback"} if by == "rollback" else switching


def release_to_restore(state: dict) -> str | None:
    """The release rollback.yml starts when none is named: the one an interrupted rollback was starting (finish it,
    so that a rollback cut at any point ends where it would have ended), else the previous one."""
    state = release_state(state)
    if state["status"] == "switching" and state.get("by") == "rollback":
        return state["current"]
    return state["previous"]


def release_state_serving(state: dict, release_id: str) -> dict:
    """Written once `release_id` answered /health and passed its gate."""
    state = release_state(state)
    if state["current"] == release_id:
        previous = state["previous"] if state["previous"] != release_id else None
        return {"current": release_id, "previous": previous, "status": "serving"}
    return {"current": release_id, "previous": release_rollback_target(state, release_id), "status": "serving"}


def release_state_rolled_back(before: dict, rollback_to: str, failed: str) -> dict:
    """After a failed deploy of `failed`: `rollback_to` serves again; its own predecessor stays previous."""
    before = release_state(before)
    good = release_last_good(before)
    candidates = [good, before["previous"]]
    previous = next((r for r in candidates if r and r not in (rollback_to, failed)), None)
    return {"current": rollback_to, "previous": previous, "status": "serving", "failed": failed}


def release_state_stopped(state: dict) -> dict:
    """After teardown: nothing serves; a switch that never finished leaves its predecessor as the one to keep."""
    state = release_state(state)
    if not state["current"]:
        return state
    if state["status"] == "switching":
        good = release_last_good(state)
        previous = state["previous"] if good and state["previous"] not in (good, state["current"]) else None
        return {"current": good, "previous": previous, "status": "stopped"}
    return {"current": state["current"], "previous": state["previous"], "status": "stopped"}


def releases_to_prune(directories: list[dict], keep: int, protected: list[Any]) -> list[str]:
    """Release directories beyond the newest `keep` (by mtime) besides the protected ones (current, previous),
    which are never pruned. `directories` are ansible.builtin.find results (path, mtime)."""
    if int(keep) < 0:
        raise ValueError(f"engine_service_keep_releases must be 0 or more, got {keep}")
    keep_ids = {str(p) for p in protected if p}
    newest_first = sorted(directories, key=lambda d: (float(d["mtime"]), d["path"]), reverse=True)
    kept = 0
    prune = []
    for directory in newest_first:
        name = directory["path"].rstrip("/").rsplit("/", 1)[-1]
        if name in keep_ids:
            continue
        if kept < int(keep):
            kept += 1
            continue
        prune.append(directory["path"])
    return prune


# ---------------------------------------------------------------- state.json on the host (target side)

STATE_FILE = "state.json"


def state_json_text(state: dict) -> str:
    """state.json as Ansible's to_nice_json writes it (so a deploy and a teardown write the same text)."""
    return json.dumps(state, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"


class JsonFileError(ValueError):
    """A file that is not JSON: its path, its size and the parser's message (a caller may say it its own way)."""

    def __init__(self, path: str, text: str, error: ValueError) -> None:
        super().__init__(f"{path} is not valid JSON: {error}")
        self.path, self.size, self.error = path, len(text), error


def read_json_file(path: str) -> tuple[Any, str | None]:
    """(parsed content, raw text); (None, None) when the file does not exist; JsonFileError when it is not JSON."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None, None
    try:
        return json.loads(text), text
    except ValueError as exc:
        raise JsonFileError(path, text, exc) from exc


def read_serving(state_dir: str) -> dict[str, Any]:
    """What the host records: {path, text (None without state.json), state, release (its release.json or {})}."""
    path = os.path.join(state_dir, STATE_FILE)
    raw, text = read_json_file(path)
    state = release_state(raw)
    release: dict = {}
    if state["current"]:
        found, _ = read_json_file(os.path.join(state_dir, "releases", str(state["current"]), "release.json"))
        release = found if isinstance(found, dict) else {}
    return {"path": path, "text": text, "state": state, "release": release}


def write_text_atomically(path: str, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` (root-owned when run as root): a reader sees the old or the new file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".state.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        if os.geteuid() == 0:
            os.chown(tmp, 0, 0)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def record_stopped(serving: dict[str, Any], write: bool) -> dict[str, Any]:
    """After a teardown: state.json says the current release no longer serves (written when ``write``).

    ``serving`` is what read_serving returned before the stop. Returns {changed, path, before, after}; nothing
    changes where nothing was deployed (no current release) or state.json already says so.
    """
    state = serving["state"]
    if not state["current"]:
        return {"changed": False, "path": serving["path"], "before": serving["text"], "after": serving["text"]}
    after = state_json_text(release_state_stopped(state))
    changed = after != serving["text"]
    if changed and write:
        write_text_atomically(serving["path"], after)
    return {"changed": changed, "path": serving["path"], "before": serving["text"] or "", "after": after}


def record_teardown(result: dict[str, Any], serving: dict[str, Any], write: bool, failed: bool) -> None:
    """gpu_release with O(state_dir): state.json records the current release as stopped (written unless
    `write` is false), and gpu_release's `result` gets the release, its diff and a summary line naming it."""
    record = record_stopped(serving, write=write)
    release = serving["release"]
    result["release"] = {
        **{k: release.get(k) for k in ("id", "engine", "profile", "unit")},
        "state_before": serving["state"] if serving["text"] is not None else None,
        "state_changed": record["changed"],
    }
    if record["changed"] and not failed and not result["report_only"]:  # written, or would be in check mode
        result["changed"] = True
        result["diff"] = {
            "before": record["before"],
            "after": record["after"],
            "before_header": record["path"],
            "after_header": record["path"],
        }
    if release.get("id") is not None:
        verb = "would be" if result["check_mode"] else "is"
        named = f"release {release['id']} ({release.get('engine')}, profile {release.get('profile')})"
        if failed:
            result["summary"].append(f"{named}: state.json left as it was ({serving['state']['status']})")
        else:
            result["summary"].append(f"{named} {verb} recorded as stopped; a deploy starts it again")
    else:
        result["summary"].append("no release recorded on this host")
