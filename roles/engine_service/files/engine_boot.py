#!/usr/bin/python3
# Managed by Ansible (roles/engine_service); local edits are overwritten.
"""At boot, start the one engine release that state.json names: the only way an engine unit starts at boot.

No engine unit is enabled; this program, run once by the boot unit (engine-boot.service.j2), decides. state.json
is the single record of the boot-time choice, so what boots and what state.json says change in the same atomic
step (the rename that writes state.json):
- "serving": its `current` release;
- "switching" (a deploy or rollback stopped what served and had not yet recorded the new release as serving):
  its `boot`, the last release that passed its gate (`previous` in a state.json written before `boot` existed);
  nothing when there is none (a first deploy, a deploy on a host teardown stopped);
- "stopped" (teardown) or no state.json: nothing.
It starts only an engine unit the engine roster declares (the boot unit passes each with --unit): a release.json that
names any other unit (a stray `*.service`, a system unit) fails the boot unit and starts nothing. The unit file of the
release is the one in its release directory, and it starts from /etc/systemd/system: where /etc holds another one of
that name (a power cut after a deploy's commit wrote the new release's unit and before it wrote state.json), the
release's own copy replaces it there (atomically), so the release starts byte for byte as it served and /etc says
what runs; a copy of that name in the runtime unit directory, which systemd reads before /etc, is removed first.

Standard library only. --dry-run prints the choice as JSON and changes nothing. Exit 0 when the choice was made
(nothing to start included); 1 when state.json or the release cannot be read (the unit shows failed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

UNIT_NAME = re.compile(r"^[A-Za-z0-9@._:-]+\.service$")
RELEASE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class BootError(Exception):
    """state.json or the release it names cannot be read as a deploy writes them."""


def release_to_boot(state: object) -> tuple[str | None, str]:
    """(release id or None, why) from the parsed state.json (None when it does not exist)."""
    if state is None:
        return None, "no state.json: nothing was deployed"
    if not isinstance(state, dict):
        raise BootError(f"state.json holds {type(state).__name__}, not an object")
    status = state.get("status") or ("serving" if state.get("current") else "stopped")
    if status == "serving":
        return state.get("current") or None, "state.json: serving"
    if status == "switching":
        # `boot` where the deploy recorded it; a state.json written before it existed boots `previous`.
        good = (state.get("boot") if "boot" in state else state.get("previous")) or None
        why = "state.json: switching, the last release that passed its gate"
        return good, why if good else "state.json: switching, and no release passed its gate before (none to start)"
    if status == "stopped":
        return None, "state.json: stopped (teardown)"
    raise BootError(f"state.json has an unknown status {status!r}")


def read_json(path: str) -> object:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise BootError(f"{path} cannot be read: {exc}") from exc


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def choose(state_dir: str, unit_dir: str, units: frozenset[str], runtime_dir: str | None = None) -> dict:
    """What boots: {release, unit, why, overlay (the release's unit must be written to unit_dir)}; only one of
    `units` (the roster's engine units)."""
    release, why = release_to_boot(read_json(os.path.join(state_dir, "state.json")))
    if release is None:
        return {"release": None, "unit": None, "why": why, "overlay": False}
    if not RELEASE_NAME.match(str(release)) or release in (".", ".."):
        raise BootError(f"state.json names {release!r}, not a release directory name")
    release_dir = os.path.join(state_dir, "releases", release)
    metadata = read_json(os.path.join(release_dir, "release.json"))
    if not isinstance(metadata, dict) or not UNIT_NAME.match(str(metadata.get("unit", ""))):
        raise BootError(f"{release_dir}/release.json is missing or names no unit")
    unit = metadata["unit"]
    if unit not in units:
        allowed = ", ".join(sorted(units)) or "none given"
        raise BootError(f"{release_dir}/release.json names {unit}, not an engine unit of the roster ({allowed})")
    own = read_bytes(os.path.join(release_dir, unit))
    if own is None:
        raise BootError(f"{release_dir}/{unit} is missing")
    shadow = os.path.join(runtime_dir, unit) if runtime_dir else None
    return {"release": release, "unit": unit, "why": why,
            "overlay": read_bytes(os.path.join(unit_dir, unit)) != own, "unit_path": os.path.join(release_dir, unit),
            "shadow": shadow if shadow and os.path.lexists(shadow) else None}


def write_unit(source: str, unit_dir: str, unit: str) -> None:
    """The release's own unit file as unit_dir/unit, replaced in one rename and synced with its directory."""
    with open(source, "rb") as handle:
        content = handle.read()
    fd, temporary = tempfile.mkstemp(dir=unit_dir, prefix=f".{unit}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, os.path.join(unit_dir, unit))
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    directory = os.open(unit_dir, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", default="/var/lib/llm-serving")
    parser.add_argument("--unit-dir", default="/etc/systemd/system")
    parser.add_argument("--runtime-dir", default="/run/systemd/system.control")
    parser.add_argument("--unit", action="append", default=[], dest="units", metavar="NAME",
                        help="an engine unit of the roster, the only units it may start (repeat for each)")
    parser.add_argument("--systemctl", default="systemctl")
    parser.add_argument("--dry-run", action="store_true", help="print the choice as JSON, change nothing")
    args = parser.parse_args(argv)
    try:
        choice = choose(args.state_dir, args.unit_dir, frozenset(args.units), args.runtime_dir)
    except BootError as exc:
        print(f"engine boot: {exc}; no engine started", file=sys.stderr)
        return 1
    if args.dry_run:
        print(json.dumps({k: choice[k] for k in ("release", "unit", "why", "overlay")}, sort_keys=True))
        return 0
    if choice["unit"] is None:
        print(f"engine boot: nothing to start ({choice['why']})")
        return 0
    if choice["shadow"]:
        os.unlink(choice["shadow"])
    if choice["overlay"]:
        write_unit(choice["unit_path"], args.unit_dir, choice["unit"])
    if choice["overlay"] or choice["shadow"]:
        subprocess.run([args.systemctl, "daemon-reload"], check=True)
    subprocess.run([args.systemctl, "start", "--no-block", "--", choice["unit"]], check=True)
    print(f"engine boot: starting {choice['unit']} of release {choice['release']} ({choice['why']})"
          + (f"; its own unit file written to {args.unit_dir} (another one of that name was there)"
             if choice["overlay"] else "")
          + (f"; {choice['shadow']} removed (it would override {args.unit_dir})" if choice["shadow"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
