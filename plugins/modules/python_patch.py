#!/usr/bin/python
# Apply an engine patch set to the site-packages of an engine's venv: exact context, atomic, verified.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: python_patch
short_description: Apply a patch set to an installed Python engine, exactly, atomically and verified
description:
  - Applies a patch set (a directory with C(patchset.yml) and unified-diff C(.patch) files) to the
    site-packages of an engine's venv, for example vLLM's EAGLE-3 backport for Kimi-K2.5.
  - The set is keyed by engine and version range. The installed version is read from the engine's own
    interpreter unless given. A version below the range is refused; a version at or above
    C(not_needed_from) is reported C(not-needed), but only when the installed files confirm the fix
    (the set's C(upstream_fixed_if) markers).
  - Every hunk must match the file exactly where its header says. There is no fuzz and no offset; on any
    difference the set is refused, naming the file, the hunk, the expected and the found lines, and
    nothing is written.
  - The patched files are compiled with the engine's interpreter before anything is written. Then all
    files are replaced by rename from temp files (originals backed up under O(state_dir)), the
    C(__pycache__) directories of the touched packages are removed, and the set's modules are imported
    and its assertions evaluated in the engine's interpreter. Any failure restores the originals
    byte for byte.
  - Idempotent. A set whose patches reverse-apply cleanly is C(already-applied) (changed=false).
  - Check mode computes the result in memory, compiles it, and returns the diff; it writes nothing.
version_added: "0.1.0"
author: the blackwell-llm-serving authors (!UNKNOWN)
options:
  patchset:
    description: Directory on the target that holds C(patchset.yml) and the C(.patch) files it lists.
    type: path
    required: true
  manifest:
    description:
      - The content of C(patchset.yml) as a mapping, for example
        C("{{ lookup('ansible.builtin.file', 'patches/x/patchset.yml') | from_yaml }}").
      - When omitted, C(patchset.yml) is read on the target, which needs PyYAML there.
    type: dict
  venv:
    description: The engine's venv. Its C(bin/python) is the engine interpreter unless O(python) is set.
    type: path
  python:
    description: The engine's interpreter. One of O(venv) or O(python) is required.
    type: path
  site_packages:
    description: Where the engine's distribution is installed. Discovered from the interpreter when omitted.
    type: path
  engine_version:
    description:
      - The engine version the caller expects. It is always read from the interpreter with
        C(importlib.metadata) (unless O(site_packages) is given too), and a different installed
        version fails the task.
    type: str
  engine:
    description: The engine this patch set must be for (C(vllm), C(sglang)); a mismatch fails.
    type: str
  state:
    description:
      - V(present) applies the set; V(absent) reverse-applies it (with the same checks), for rollback.
    type: str
    choices: [present, absent]
    default: present
  state_dir:
    description: Where backups and the record of applied sets are kept.
    type: path
    default: /var/lib/blackwell-serving/patches
  verify_environment:
    description: Extra environment for the compile and import checks run with the engine's interpreter.
    type: dict
    default: {}
  timeout:
    description: Seconds allowed for each run of the engine's interpreter (big engines import slowly).
    type: int
    default: 600
notes:
  - Runs on the target with the Python standard library only; the engine's venv needs nothing extra.
  - Supports check mode and diff mode.
"""

EXAMPLES = r"""
- name: Apply the Kimi EAGLE-3 patch set to vLLM
  python_patch:
    patchset: /opt/blackwell-serving/patches/kimi-eagle3-0.17
    manifest: "{{ lookup('ansible.builtin.file', 'patches/kimi-eagle3-0.17/patchset.yml') | from_yaml }}"
    venv: /opt/vllm/venv
    engine: vllm
  register: __vllm_patch

- name: Show what a patch would change, touching nothing
  python_patch:
    patchset: /opt/blackwell-serving/patches/kimi-eagle3-0.17
    venv: /opt/vllm/venv
  check_mode: true
  diff: true

- name: Take the patches out again
  python_patch:
    patchset: /opt/blackwell-serving/patches/kimi-eagle3-0.17
    venv: /opt/vllm/venv
    state: absent
"""

RETURN = r"""
state:
  description: >-
    applied, already-applied, not-needed, reverted or not-applied; on failure refused
    (nothing changed, or everything rolled back); in check mode before the engine is installed,
    not-installed (skipped).
  returned: always
  type: str
  sample: applied
engine:
  description: The engine the patch set is for.
  returned: always
  type: str
  sample: vllm
engine_version:
  description: The installed engine version the decision was made for.
  returned: always
  type: str
  sample: 0.17.1
patchset:
  description: The patch set's name.
  returned: always
  type: str
  sample: kimi-eagle3-0.17
site_packages:
  description: The site-packages directory that was (or would be) patched.
  returned: always
  type: str
files:
  description: Files changed (or that would be), with their SHA-256 before and after.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "vllm/config/speculative.py", "before_sha256": "3f…", "after_sha256": "9a…"}]
upstream:
  description: Per patch, whether the installed files already contain the fix, and which marker said so.
  returned: when the installed files were inspected for the upstream fix
  type: list
  elements: dict
verified:
  description: Whether the patched modules were imported and the set's assertions held in the engine's venv.
  returned: always
  type: bool
verification:
  description: The import and assertion results from the engine's interpreter.
  returned: when verification ran
  type: dict
compile:
  description: The compile check of every patched file with the engine's interpreter.
  returned: when files change (also in check mode)
  type: list
  elements: dict
pycache_cleared:
  description: The __pycache__ directories removed after writing.
  returned: always
  type: list
  elements: str
backup_dir:
  description: Where the original files were saved before writing.
  returned: always
  type: str
unified_diff:
  description: The change as one unified diff (also given as the diff-mode output).
  returned: always
  type: str
failed_hunk:
  description: The first hunk that did not match exactly, with the expected and the found lines.
  returned: when the set was refused for a context mismatch
  type: dict
  sample: {"path": "vllm/config/speculative.py", "hunk": 1, "line": 774, "expected": ["…"], "found": ["…"]}
rolled_back:
  description: True when files were written, verification failed and the originals were restored.
  returned: on failure after writing
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.patch.patchset import (
    PatchSetError,
    discover,
    execute,
    load_patchset,
)


def _load_manifest(module: AnsibleModule) -> dict:
    manifest = module.params["manifest"]
    if manifest is not None:
        return manifest
    path = os.path.join(module.params["patchset"], "patchset.yml")
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        module.fail_json(msg=f"PyYAML is not available on the target to read {path}; pass its content as "
                             f"'manifest' (lookup('ansible.builtin.file', …) | from_yaml)", state="refused")
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as exc:
        module.fail_json(msg=f"cannot read {path}: {exc.strerror}", state="refused")
    return {}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "patchset": {"type": "path", "required": True},
            "manifest": {"type": "dict"},
            "venv": {"type": "path"},
            "python": {"type": "path"},
            "site_packages": {"type": "path"},
            "engine_version": {"type": "str"},
            "engine": {"type": "str"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "state_dir": {"type": "path", "default": "/var/lib/blackwell-serving/patches"},
            "verify_environment": {"type": "dict", "default": {}},
            "timeout": {"type": "int", "default": 600},
        },
        required_one_of=[("venv", "python")],
        supports_check_mode=True,
    )
    params = module.params
    python = params["python"] or os.path.join(params["venv"], "bin", "python")
    if module.check_mode and not os.path.exists(python):
        # A first deploy in check mode: the engine is not installed yet, so there is nothing to judge.
        module.exit_json(changed=False, skipped=True, state="not-installed",
                         msg=f"{python} does not exist yet; the set is judged once the engine is installed")
    try:
        patchset = load_patchset(params["patchset"], _load_manifest(module))
        if params["engine"] and params["engine"] != patchset.engine:
            raise PatchSetError(f"patch set '{patchset.name}' is for {patchset.engine}, "
                                f"not {params['engine']}")
        version, site = params["engine_version"], params["site_packages"]
        if version is None or site is None:
            found_version, found_site = discover(python, patchset.distribution)
            if version is not None and version != found_version:
                raise PatchSetError(f"{python} has {patchset.distribution} {found_version} installed, not "
                                    f"{version} as engine_version says; nothing was changed",
                                    engine_version=found_version)
            version, site = found_version, site or found_site
        if not os.path.isdir(site):
            raise PatchSetError(f"site-packages directory {site} does not exist")
        result = execute(patchset, site, python, version, params["state_dir"], check_mode=module.check_mode,
                         revert=params["state"] == "absent",
                         verify_env={k: str(v) for k, v in params["verify_environment"].items()},
                         timeout=params["timeout"])
    except PatchSetError as exc:
        module.fail_json(msg=exc.msg, **{"state": "refused", **exc.details})
    module.exit_json(**result)


if __name__ == "__main__":
    main()
