#!/usr/bin/python
"""Ansible module: remove an engine's venvs that no kept release runs from."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_envs_prune
short_description: Remove the content-addressed venvs of an engine that no kept release names
description:
  - An engine's venvs live in I(envs_dir), one directory per content (role python_env), each with a
    C(python-env.json) stamp naming the environment. A release names the venv it runs from in its C(release.json)
    (key C(venv)). After a deploy has pruned old releases, this module removes every venv of I(name) that no
    remaining release names, and what interrupted builds of I(name) left (C(.build-*) directories).
  - A venv whose stamp names another environment, or that has no readable stamp, is never touched; neither is
    anything outside I(envs_dir). The release directories listed in I(ignore_releases) (being removed by the same
    deploy) do not keep a venv.
  - A release that cannot be read keeps every venv (the module fails rather than guess).
options:
  envs_dir:
    description: The directory of the engine's venvs.
    type: path
    required: true
  name:
    description: The environment name the venvs' stamps carry (the engine, e.g. C(sglang)).
    type: str
    required: true
  state_dir:
    description: The releases' state directory (C(<state_dir>/releases/<id>/release.json)).
    type: path
    required: true
  ignore_releases:
    description: Release directories that no longer count (removed by the same deploy).
    type: list
    elements: path
    default: []
notes:
  - Supports check mode. Standard library only.
author: the blackwell-llm-serving authors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Prune | remove venvs no kept release names
  engine_envs_prune:
    envs_dir: /opt/sglang/envs
    name: sglang
    state_dir: /var/lib/llm-serving
"""

RETURN = r"""
removed:
  description: The venv and build directories removed (to be removed, in check mode).
  type: list
  elements: str
  returned: success
kept:
  description: The venvs of I(name) kept, each named by at least one release.
  type: list
  elements: str
  returned: success
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.release.files import ReleaseFilesError, read_json


class PruneError(Exception):
    pass


def venvs_named_by_releases(state_dir: str, ignore: set[str]) -> set[str]:
    releases = os.path.join(state_dir, "releases")
    named: set[str] = set()
    try:
        entries = sorted(os.scandir(releases), key=lambda e: e.name)
    except FileNotFoundError:
        return named
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False) or os.path.normpath(entry.path) in ignore:
            continue
        path = os.path.join(entry.path, "release.json")
        try:
            release = read_json(path)  # None: an incomplete release (release.json is written last) names nothing yet
        except ReleaseFilesError as exc:
            raise PruneError(f"{path} cannot be read ({exc}): no venv is removed while a release is unreadable") \
                from exc
        venv = release.get("venv") if isinstance(release, dict) else None
        if isinstance(venv, str) and venv:
            named.add(os.path.normpath(venv))
    return named


def stamp_name(venv: str) -> str | None:
    try:
        stamp = read_json(os.path.join(venv, "python-env.json"))
    except ReleaseFilesError:
        return None
    return stamp.get("name") if isinstance(stamp, dict) else None


def plan(envs_dir: str, name: str, named: set[str]) -> tuple[list[str], list[str]]:
    """(directories to remove, venvs kept)."""
    remove, kept = [], []
    try:
        entries = sorted(os.scandir(envs_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return remove, kept
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        path = os.path.normpath(entry.path)
        if entry.name.startswith(f".build-{name}-"):
            remove.append(path)
        elif entry.name.startswith(f"{name}-") and stamp_name(path) == name:
            (kept if path in named else remove).append(path)
    return remove, kept


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "envs_dir": {"type": "path", "required": True},
            "name": {"type": "str", "required": True},
            "state_dir": {"type": "path", "required": True},
            "ignore_releases": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    if not params["name"] or "/" in params["name"]:
        module.fail_json(msg=f"name {params['name']!r} must be a plain environment name")
    try:
        named = venvs_named_by_releases(params["state_dir"], {os.path.normpath(p) for p in params["ignore_releases"]})
        remove, kept = plan(params["envs_dir"], params["name"], named)
        if not module.check_mode:
            for path in remove:
                shutil.rmtree(path)
    except (PruneError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=bool(remove), removed=remove, kept=kept)


if __name__ == "__main__":
    main()
