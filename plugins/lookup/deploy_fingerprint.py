# SPDX-License-Identifier: Apache-2.0
"""Lookup plugin: one digest of everything a deploy is made from, on the controller, before the host is asked."""

from __future__ import annotations

DOCUMENTATION = r"""
name: deploy_fingerprint
author: the blackwell-llm-serving authors (!UNKNOWN)
short_description: A digest of a deploy's inputs - the host's variables, the checkout's code and the lock files
description:
  - SHA-256 over the values of the host's variables named by I(prefixes) and I(names) (inventory, extra variables,
    role defaults, as given - templates are not rendered), the bytes of every file under I(trees) of this checkout
    (roles, plugins, the engine roster; C(__pycache__) left out) and of each of I(files).
  - The deploy records it on the host once a release serves (module C(engine_noop)); a re-run whose digest is the same
    and whose host still holds exactly that release proves it has nothing to do in one round trip. Any variable or
    file of the checkout that changes changes the digest, so the full deploy runs.
  - The digest covers secrets among the variables (API keys); it is only compared, never shown.
options:
  prefixes:
    description: Variable name prefixes whose variables count.
    type: list
    elements: str
    required: true
  names:
    description: Further variable names that count (C(engine_profile), C(groups), ...).
    type: list
    elements: str
    default: []
  exclude:
    description: Variable names that do not count though a prefix matches (switches of how the deploy runs, not of
      what it makes).
    type: list
    elements: str
    default: []
  trees:
    description: Directories of the checkout, relative to the collection's root, whose files count.
    type: list
    elements: str
    default: [roles, plugins, meta]
  files:
    description: Further files (absolute paths, such as a lock file outside the checkout) whose bytes count.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: The inputs of this deploy as one digest
  ansible.builtin.set_fact:
    __sglang_fingerprint: "{{ lookup('blackwell.serving.deploy_fingerprint', prefixes=['sglang_', 'engine_service_'],
      names=['engine_profile', 'engine_profiles', 'groups', 'inventory_hostname'], files=[__sglang_lock_file]) }}"
  no_log: true
"""

RETURN = r"""
_raw:
  description: The digest, 64 hexadecimal characters.
  type: list
  elements: str
"""

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

COLLECTION_ROOT = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=8)
def tree_digest(root: str, trees: tuple[str, ...]) -> str:
    """Every file's relative path and bytes under the trees (once per controller process: the checkout does not
    change during a run)."""
    digest = hashlib.sha256()
    for tree in trees:
        base = Path(root) / tree
        if not base.is_dir():
            raise AnsibleLookupError(f"deploy_fingerprint: {base} is not a directory of the checkout")
        for directory, subdirectories, names in os.walk(base):
            subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
            for name in sorted(names):
                path = Path(directory) / name
                if path.suffix == ".pyc" or not path.is_file():
                    continue
                digest.update(str(path.relative_to(root)).encode() + b"\0")
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def plain(value: Any) -> Any:
    """A variable's value as JSON can say it (mappings sorted, anything else by its text)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)


def fingerprint(variables: dict[str, Any], prefixes: list[str], names: list[str], *, trees: list[str],
                files: list[str], exclude: tuple[str, ...] = (), root: Path = COLLECTION_ROOT) -> str:
    chosen = {name: plain(variables[name]) for name in sorted(variables)
              if (name.startswith(tuple(prefixes)) or name in names) and name not in exclude}
    digest = hashlib.sha256(json.dumps(chosen, sort_keys=True).encode())
    digest.update(tree_digest(str(root), tuple(trees)).encode())
    for name in files:
        try:
            digest.update(name.encode() + b"\0" + hashlib.sha256(Path(name).read_bytes()).digest())
        except OSError as exc:
            raise AnsibleLookupError(f"deploy_fingerprint: {name} cannot be read: {exc.strerror}") from exc
    return digest.hexdigest()


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        return [fingerprint(dict(variables or {}), self.get_option("prefixes"), self.get_option("names"),
                            trees=self.get_option("trees"), files=[f for f in self.get_option("files") if f],
                            exclude=tuple(self.get_option("exclude")))]
