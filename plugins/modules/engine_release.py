#!/usr/bin/python
"""Ansible module: write an engine release (and the host files it needs) in one call, and read back what serves."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_release
short_description: Write an engine release's directories and files in one call, and read back what the switch decides on
description:
  - Makes the release directory I(state_dir)C(/releases/)I(release_id) and its files hold exactly what is given
    (content, owner, group, mode), each file written to a temporary file beside it, checked by its I(validate)
    command and renamed over the old one, so a reader never sees half a file. C(release.json) should come last
    in I(files), whose presence marks a complete release (I(release_existed)).
  - Host files outside the release (the NVIDIA module list, the boot-time device-node unit, the argument checker)
    and extra directories are handled the same way.
  - Reads back, in the same call, what the deploy's switch decides on, C(state.json), the sha256 of the unit files
    systemd runs, the state of the engine units (one C(systemctl show)) and whether some paths exist. A deploy
    that changes nothing then costs one round trip here instead of one per file.
  - C(release.json) (a JSON object in I(files)) gets C(created), when the release was first written (UTC, such as
    C(2026-12-04T18:40:12Z)); written again, the release keeps its time, so nothing changes. A release written
    before C(created) was recorded is left without it.
  - A release that did not exist before and whose file a validator refuses is removed again, so no half release is
    left behind. Secret files (I(secret_files)) are never shown in a diff or in the task's output.
  - Supports check mode (nothing is written; C(changed) and the diff say what would be) and diff mode. In diff
    mode, when C(state.json) names another release as current, each file of this release is compared with the same
    file of that serving release (a new release directory would otherwise show whole new files), secret files
    too, with the value of every key-like setting masked (I(masked_names), and any name with key, token, secret or
    password in it), so a changed flag shows and no key does.
options:
  state_dir:
    description: Directory of the host's release state (C(state.json), C(releases/)).
    type: path
    required: true
  release_id:
    description: Name of the release directory under I(state_dir)C(/releases).
    type: str
    required: true
  group:
    description: Group of the release directory (C(0750)), the service group of the engine.
    type: str
    required: true
  service_user:
    description:
      - The engine's system user, created first when missing (a system account in I(group), created too, with no
        login and no home directory of its own); an existing one gets its group, home and shell corrected.
      - Omitted, no account is touched.
    type: dict
    suboptions:
      name:
        description: User name.
        type: str
        required: true
      home:
        description: Home directory, not created (the unit's C(StateDirectory=) makes it).
        type: path
        required: true
      shell:
        description: Login shell.
        type: path
        default: /usr/sbin/nologin
  files:
    description: Files of the release directory, written in this order.
    type: list
    elements: dict
    default: []
    suboptions: &file_options
      name:
        description:
          - File name inside the release directory, or C(<directory>/<name>) one level below it (the directory is
            created C(root:<group> 0750)), such as the dist-info directory of an engine plugin.
        type: str
        required: true
      content:
        description: Exact content.
        type: str
        required: true
      owner:
        description: Owner.
        type: str
        default: root
      group:
        description: Group; the service group when not given.
        type: str
      mode:
        description: Octal mode.
        type: str
        default: "0640"
      validate:
        description: Command run on the temporary file before it replaces the file (C(%s) is its path).
        type: str
        default: ""
  secret_files:
    description: Like I(files), for files that hold secrets (an API key), never in a diff and never logged.
    type: list
    elements: dict
    default: []
    suboptions: *file_options
  host_files:
    description: >-
      Files outside the release directory (absolute I(path)); their directory must exist or be listed in
      I(directories).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      content:
        description: Exact content.
        type: str
        required: true
      owner:
        description: Owner.
        type: str
        default: root
      group:
        description: Group.
        type: str
        default: root
      mode:
        description: Octal mode.
        type: str
        default: "0644"
      validate:
        description: As for I(files).
        type: str
        default: ""
      validate_requires:
        description: Validate only when this path exists (a unit whose C(ExecStart=) binary comes with the driver).
        type: path
        default: ""
  directories:
    description: Extra directories, created before any file (parents first).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      owner:
        description: Owner.
        type: str
        default: root
      group:
        description: Group.
        type: str
        default: root
      mode:
        description: Octal mode.
        type: str
        default: "0755"
  units:
    description: Units whose state is returned in I(units) (LoadState, ActiveState, SubState, UnitFileState, Result).
    type: list
    elements: str
    default: []
  checksum_paths:
    description: Paths whose sha256 is returned in I(checksums) (empty string for a missing file).
    type: list
    elements: path
    default: []
  check_paths:
    description: Paths whose existence is returned in I(exists).
    type: list
    elements: path
    default: []
  masked_names:
    description:
      - Setting names whose values are masked when secret files are compared with the serving release (diff mode),
        such as the engines' key flags; C(_) and C(-) alike, matched as the whole name or its suffix
        (C(VLLM_API_KEY) ends in C(api-key)).
    type: list
    elements: str
    default: []
notes:
  - Standard library only. Runs as root (it sets owners).
author: the blackwell-llm-serving authors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Write the release and read what serves
  engine_release:
    state_dir: /var/lib/llm-serving
    release_id: sglang-0123456789ab
    group: sglang
    files:
      - {name: sglang.service, content: "{{ unit_text }}", mode: "0644", group: root,
         validate: "systemd-analyze verify --man=no %s:sglang.service"}
      - {name: release.json, content: "{{ metadata | to_nice_json }}", mode: "0644", group: root}
    secret_files:
      - {name: config.yaml, content: "{{ config_with_api_key }}"}
    units: [sglang.service, vllm.service]
    checksum_paths: [/etc/systemd/system/sglang.service]
  register: release
"""

RETURN = r"""
release_dir:
  description: The release directory.
  type: str
  returned: always
release_existed:
  description: Whether C(release.json) was in the release directory before this call.
  type: bool
  returned: always
accounts:
  description: What was (in check mode, would be) done to the service group and user.
  type: list
  elements: str
  returned: always
releases:
  description: The release directories under I(state_dir)C(/releases) after this call, with their mtime (for pruning).
  type: list
  elements: dict
  returned: always
changed_paths:
  description: Directories and files that were (in check mode, would be) created or changed.
  type: list
  elements: str
  returned: always
state:
  description: C(state.json) of I(state_dir), parsed; null when there is none.
  type: raw
  returned: always
units:
  description: >-
    Per unit of I(units): state (running, stopped, failed), status (the unit file state, or not-found),
    active_state, sub_state, and the raw properties. Empty where systemd does not run.
  type: dict
  returned: always
systemd:
  description: Whether systemd is this host's service manager.
  type: bool
  returned: always
serving_release:
  description: The release C(state.json) names as current if not this one (the diff compares with it), or null.
  type: str
  returned: always
checksums:
  description: sha256 per path of I(checksum_paths).
  type: dict
  returned: always
exists:
  description: Existence per path of I(check_paths).
  type: dict
  returned: always
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import (
    SystemdError,
    service_summary,
    show_units,
    systemctl_here,
)
from ansible_collections.blackwell.serving.plugins.module_utils.release.compare import (
    ReleaseFile,
    compare_with_serving,
    serving_release_id,
)
from ansible_collections.blackwell.serving.plugins.module_utils.release.files import (
    ReleaseFilesError,
    Wanted,
    apply,
    ensure_service_account,
    list_releases,
    parse_mode,
    read_bytes,
    read_json,
    sha256_of,
    utc_now_text,
    with_created,
)

FILE_OPTIONS = {
    "name": {"type": "str", "required": True},
    "content": {"type": "str", "required": True},
    "owner": {"type": "str", "default": "root"},
    "group": {"type": "str"},
    "mode": {"type": "str", "default": "0640"},
    "validate": {"type": "str", "default": ""},
}
SECRET_FILE_OPTIONS = {**FILE_OPTIONS, "content": {**FILE_OPTIONS["content"], "no_log": True}}


def _plain(part: str) -> bool:
    return part not in ("", ".", "..") and "/" not in part


def release_subdirectories(params: dict) -> list[str]:
    """The directories the release's file names open (`<dir>/<file>`: one level, such as a Python package's
    dist-info directory that the engine finds on the unit's PYTHONPATH), in order."""
    names = [entry["name"] for entry in params["secret_files"] + params["files"]]
    return sorted({name.split("/", 1)[0] for name in names
                   if name.count("/") == 1 and all(_plain(part) for part in name.split("/"))})


def stamped_files(files: list[dict], release_dir: str, now: str) -> list[dict]:
    """`files` with release.json's `created` kept from the host, or `now` for a new release (files.with_created)."""
    return [{**entry, "content": with_created(entry["content"], read_bytes(os.path.join(release_dir, entry["name"])),
                                              now)}
            if entry["name"] == "release.json" else entry for entry in files]


def release_files(params: dict, release_dir: str) -> list[Wanted]:
    def wanted(entry: dict, secret: bool) -> Wanted:
        parts = entry["name"].split("/")
        if len(parts) > 2 or not all(_plain(part) for part in parts):
            raise ReleaseFilesError(f"file name {entry['name']!r} must be a plain name inside the release directory, "
                                    "or <directory>/<name> one level below it")
        return Wanted(path=os.path.join(release_dir, entry["name"]), owner=entry.get("owner") or "root",
                      group=entry.get("group") or params["group"], mode=parse_mode(entry.get("mode") or "0640"),
                      content=entry["content"].encode(), secret=secret, validate=entry.get("validate") or "")

    # Secrets first: release.json (a plain file, given last) marks the release complete.
    return ([wanted(e, True) for e in params["secret_files"]] + [wanted(e, False) for e in params["files"]])


def host_files(params: dict) -> list[Wanted]:
    return [Wanted(path=e["path"], owner=e["owner"], group=e["group"], mode=parse_mode(e["mode"]),
                   content=e["content"].encode(), validate=e["validate"], validate_requires=e["validate_requires"])
            for e in params["host_files"]]


def directories(params: dict, release_dir: str) -> list[Wanted]:
    state_dir = params["state_dir"]
    return [
        Wanted(path=state_dir, owner="root", group="root", mode=0o755),
        Wanted(path=os.path.join(state_dir, "releases"), owner="root", group="root", mode=0o755),
        Wanted(path=release_dir, owner="root", group=params["group"], mode=0o750),
        *(Wanted(path=os.path.join(release_dir, name), owner="root", group=params["group"], mode=0o750)
          for name in release_subdirectories(params)),
        *(Wanted(path=e["path"], owner=e["owner"], group=e["group"], mode=parse_mode(e["mode"]))
          for e in params["directories"]),
    ]


def read_units(units: list[str]) -> tuple[bool, dict]:
    systemctl = systemctl_here()
    if systemctl is None:
        return False, {}
    shown = show_units(units, systemctl=systemctl)
    return True, {unit: {**service_summary(props), "properties": props} for unit, props in shown.items()}


def main() -> None:
    dict_list = {"type": "list", "elements": "dict", "default": []}
    module = AnsibleModule(
        argument_spec={
            "state_dir": {"type": "path", "required": True},
            "release_id": {"type": "str", "required": True},
            "group": {"type": "str", "required": True},
            "service_user": {"type": "dict", "options": {
                "name": {"type": "str", "required": True},
                "home": {"type": "path", "required": True},
                "shell": {"type": "path", "default": "/usr/sbin/nologin"},
            }},
            "files": {**dict_list, "options": FILE_OPTIONS},
            # Only the content is secret: with the whole list no_log, Ansible would mask every file name (config.yaml)
            # wherever it occurs in the result, the diff's headers too.
            "secret_files": {**dict_list, "options": SECRET_FILE_OPTIONS, "no_log": False},
            "host_files": {**dict_list, "options": {
                "path": {"type": "path", "required": True},
                "content": {"type": "str", "required": True},
                "owner": {"type": "str", "default": "root"},
                "group": {"type": "str", "default": "root"},
                "mode": {"type": "str", "default": "0644"},
                "validate": {"type": "str", "default": ""},
                "validate_requires": {"type": "path", "default": ""},
            }},
            "directories": {**dict_list, "options": {
                "path": {"type": "path", "required": True},
                "owner": {"type": "str", "default": "root"},
                "group": {"type": "str", "default": "root"},
                "mode": {"type": "str", "default": "0755"},
            }},
            "units": {"type": "list", "elements": "str", "default": []},
            "checksum_paths": {"type": "list", "elements": "path", "default": []},
            "check_paths": {"type": "list", "elements": "path", "default": []},
            "masked_names": {"type": "list", "elements": "str", "default": [], "no_log": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    if "/" in params["release_id"] or params["release_id"] in ("", ".", ".."):
        module.fail_json(msg=f"release_id {params['release_id']!r} must be a plain directory name")
    release_dir = os.path.join(params["state_dir"], "releases", params["release_id"])
    release_existed = os.path.isfile(os.path.join(release_dir, "release.json"))
    try:
        params = {**params, "files": stamped_files(params["files"], release_dir, utc_now_text())}
        wanted_dirs = directories(params, release_dir)
        wanted_files = release_files(params, release_dir) + host_files(params)
        account = params["service_user"]
        accounts = ensure_service_account(account["name"], params["group"], account["home"], account["shell"],
                                          module.check_mode) if account else []
        try:
            outcome = apply(wanted_dirs, wanted_files, module.check_mode)
        except ReleaseFilesError:
            if not release_existed and not module.check_mode:
                shutil.rmtree(release_dir, ignore_errors=True)
            raise
        systemd, units = read_units(params["units"])
        state = read_json(os.path.join(params["state_dir"], "state.json"))
        serving = serving_release_id(state, params["release_id"])
        result = {
            "changed": bool(outcome.changed_paths or accounts),
            "accounts": accounts,
            "releases": list_releases(os.path.join(params["state_dir"], "releases")),
            "release_dir": release_dir,
            "release_existed": release_existed,
            "changed_paths": outcome.changed_paths,
            "state": state,
            "serving_release": serving,
            "systemd": systemd,
            "units": units,
            "checksums": {path: sha256_of(path) for path in params["checksum_paths"]},
            "exists": {path: os.path.exists(path) for path in params["check_paths"]},
        }
    except (ReleaseFilesError, SystemdError, OSError) as exc:
        module.fail_json(msg=str(exc), release_dir=release_dir, release_existed=release_existed)
    if module._diff:
        result["diff"] = release_diff(params, outcome.diff, release_dir, serving)
    module.exit_json(**result)


def release_diff(params: dict, written: list[dict], release_dir: str, serving: str | None) -> list[dict]:
    """The diff of what was (would be) written; the release's own files compared with the serving release's
    instead of with nothing, when one serves."""
    if serving is None:
        return written
    files = ([ReleaseFile(e["name"], e["content"], True) for e in params["secret_files"]]
             + [ReleaseFile(e["name"], e["content"], False) for e in params["files"]])
    outside = [d for d in written if not d["after_header"].startswith(release_dir + os.sep)]
    return outside + compare_with_serving(params["state_dir"], serving, params["release_id"], files,
                                          params["masked_names"])


if __name__ == "__main__":
    main()
