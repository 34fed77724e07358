#!/usr/bin/python
"""Ansible module: fetch a model directory from its source, resumably, and verify it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_fetch
short_description: Fetch a model (or drafter) directory from its source, resuming and verifying
description:
  - Lists the files of a model from its source (Hugging Face Hub API, an HTTP mirror with a manifest, a
    local or NFS-mounted directory, or rsync), checks free disk space before writing anything, transfers the
    missing files into C(<file>.part) and resumes those partial files on the next run (HTTP Range, seek,
    C(rsync --append-verify)), verifies sizes and the checksums the source publishes (LFS sha256 and git blob
    ids on the Hub, sha256 in a manifest), and records the complete copy in
    C(<dest>/.model_store/manifest.json).
  - A complete copy is never removed or overwritten; a file that disagrees with the source stops the run with
    a message that names it and says what to do.
  - Once a directory is recorded complete, later runs check it against the record without the network
    unless O(refresh=true).
  - "HTTP mirrors: several files at once and large files in ranges on O(streams) connections; the sha256 is
    computed while the bytes arrive (no second read). Hub sources: the C(huggingface_hub) client of the
    model store's tools venv (O(hf_client)) fetches the missing files into O(dest); the sha256 (and git blob
    id) of each is computed from the bytes as the client writes them and checked against the Hub's listing
    (O(hf_client.verify))."
  - With O(slice_s) a call fetches for about that long (no new file starts after it; files started finish),
    then returns C(done), C(progress) (bytes done / total, rate, ETA) and a one-line C(msg); the next call
    resumes. The same numbers are written to C(<dest>/.model_store/progress.json) every second.
options:
  dest:
    description: Model directory on the host.
    type: path
    required: true
  source:
    description:
      - Where the files come from. C(type) is one of C(hf), C(http), C(local), C(nfs), C(rsync).
      - "C(hf): C(repo), C(revision) (default C(main)), C(endpoint) (default U(https://huggingface.co))."
      - "C(http): C(url) (base URL of the files), C(manifest) (path under C(url), default
        C(.model_store/manifest.json): the format this module writes)."
      - "C(local): C(path). C(nfs): C(export), C(mount_point), C(subdir) (the export must be mounted)."
      - "C(rsync): C(src) (C(host:/path/), C(rsync://host/module/path/) or a local path), C(options)."
      - All types take C(include) and C(exclude) lists of shell patterns of relative paths.
    type: dict
    required: true
  token:
    description: Bearer token for the Hub or the mirror. Never logged; sent only to the source's own host.
    type: str
  plan_only:
    description:
      - Only list and compare; write nothing. The result says what would be fetched and the disk it needs.
    type: bool
    default: false
  only:
    description: Fetch only these relative paths (from a plan's C(to_fetch)) and do not record completion.
    type: list
    elements: str
  listing:
    description: The C(listing) returned by a plan, so the source is not listed again.
    type: dict
  refresh:
    description: List the source again even when the directory is recorded complete.
    type: bool
    default: false
  verify_checksums:
    description: Verify sha256 / git blob ids published by the source (one extra read of each new file).
    type: bool
    default: true
  reserve_bytes:
    description: Bytes that must stay free on the file system after the transfer.
    type: int
    default: 0
  retries:
    description: Times an interrupted transfer is resumed within one run before the module gives up.
    type: int
    default: 3
  retry_delay:
    description: Seconds before the first retry; doubles with each retry.
    type: float
    default: 2.0
  timeout:
    description: Network timeout in seconds for one read.
    type: int
    default: 60
  slice_s:
    description:
      - Seconds of transfer per call; 0 fetches everything in one call. Files are not split across slices
        by the Hub client; HTTP ranges and local copies resume exactly.
    type: float
    default: 0
  streams:
    description:
      - Parallel HTTP connections for C(http) mirrors (files side by side, large files in ranges).
      - 0 picks one per CPU of the host, at most 4 (measured with C(bench/bench_model_fetch.py)).
    type: int
    default: 0
  piece_mib:
    description: Size of one HTTP range, in MiB; files up to this size move on one connection.
    type: int
    default: 64
  buffer_mib:
    description: Memory, in MiB, for ranges that arrive ahead of the hashing position (bounds peak memory).
    type: int
    default: 128
  hf_client:
    description:
      - "The C(huggingface_hub) client for C(hf) sources. C(venv) is the tools venv holding it and
        C(bws_hf_fetch.py) (created by the model_store role); C(workers) parallel files; C(xet) lets it use
        Xet storage (C(HF_HUB_DISABLE_XET) otherwise); C(verify) is C(read) (each finished file is compared
        with the listing's sha256 / git blob id, from the digests of its bytes as the client wrote them, or
        read once more where the client wrote it without them, as with Xet storage) or C(trust) (the
        client's size check only; the listing's sha256 is recorded with method C(hf-client))."
    type: dict
    suboptions:
      venv:
        description: The tools venv that holds C(huggingface_hub) and C(bws_hf_fetch.py).
        type: path
        required: true
      workers:
        description: Files fetched in parallel.
        type: int
        default: 8
      xet:
        description: Let the client use Xet storage (C(HF_HUB_DISABLE_XET) otherwise).
        type: bool
        default: true
      verify:
        description: C(read) compares each file with the listing's digests; C(trust) keeps the client's size check.
        type: str
        default: read
        choices: [read, trust]
  batch_bytes:
    description:
      - How the plan groups missing files into C(batches), one task item each (for progress lines).
        Small files go together up to this many bytes; every larger file is alone.
    type: int
    default: 268435456
notes:
  - Supports check mode (then it only plans). Standard library only.
author: the blackwell-llm-serving authors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Fetch Kimi-K2.5 from the Hub
  model_fetch:
    dest: /srv/models/moonshotai/Kimi-K2.5
    source: {type: hf, repo: moonshotai/Kimi-K2.5, revision: main}
    token: "{{ model_store_hf_token }}"
    reserve_bytes: 10737418240
  no_log: false

- name: Plan only (what is missing, how much disk it needs)
  model_fetch:
    dest: /srv/models/Qwen/Qwen3-0.6B
    source: {type: http, url: "https://mirror.example.internal/models/Qwen3-0.6B/"}
    plan_only: true
  register: plan
"""

RETURN = r"""
complete:
  description: True when every listed file is present, verified and the copy is recorded complete.
  type: bool
  returned: always
revision:
  description: The source's revision (a commit on the Hub), when it has one.
  type: str
  returned: always
batches:
  description: The missing files grouped for one transfer call each, with paths and a label.
  type: list
  elements: dict
  returned: always
to_fetch:
  description: Files still missing, each with path, size, sha256 (when published) and part_bytes already kept.
  type: list
  elements: dict
  returned: always
in_place:
  description: True when the source is the model directory itself (served in place; checked, never written).
  type: bool
  returned: when true
done:
  description: True when nothing is left to fetch for this call (the last slice; the copy is then recorded).
  type: bool
  returned: always
progress:
  description:
    - bytes_done, bytes_total, slice_bytes, slice_s, rate_bytes_per_s, eta_s of the directory.
    - For Hub sources also C(profile.hub_client), the client run's timeline in seconds from the slice start
      (client spawned and imported, first and last file, verification, records) and the peak memory (max
      RSS, MiB) of the client and of the module.
  type: dict
  returned: always
fetched:
  description: Files transferred by this run.
  type: list
  elements: str
  returned: always
needed_bytes:
  description: Bytes still to transfer (sizes of the missing files less their partial downloads).
  type: int
  returned: always
free_bytes:
  description: Free bytes on the file system of dest (or its nearest existing parent).
  type: int
  returned: always
fs_id:
  description: Device id of that file system, to add up needs of several directories on one disk.
  type: str
  returned: always
bytes_total:
  description: Size of the whole model.
  type: int
  returned: always
listing:
  description: The source's listing (revision and files), to pass back as O(listing).
  type: dict
  returned: always
hf_client_held:
  description:
    - What the tools venv of O(hf_client) holds, for the role to compare with its own files - C(runner_sha1)
      (sha1 of C(bws_hf_fetch.py)) and C(lock_sha1) (of C(hf-client.lock.installed), the lock pip installed
      last), null where missing; empty when the venv has no Python.
  type: dict
  returned: when planning (O(plan_only) or check mode) an C(hf) source with O(hf_client)
msg:
  description: What happened, or on failure what is wrong and what to do.
  type: str
  returned: always
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.model.hub import client_held
from ansible_collections.blackwell.serving.plugins.module_utils.model.store import (
    ModelStoreError,
    check_model_dir,
    human_bytes,
    statvfs_free,
)
from ansible_collections.blackwell.serving.plugins.module_utils.model.transfer import (
    ModelStore,
    make_source,
    progress_line,
)


def summary(plan: dict, fetched: list[str]) -> str:
    if fetched:
        return f"fetched {len(fetched)} files into {plan['dest']}"
    if plan["to_fetch"]:
        return (
            f"{plan['dest']}: {len(plan['to_fetch'])} of {plan['files_total']} files to fetch, "
            f"{human_bytes(plan['needed_bytes'])} needed, {human_bytes(plan['free_bytes'])} free"
        )
    return f"{plan['dest']}: {plan['files_total']} files, {human_bytes(plan['bytes_total'])}"


def hub_client(params: dict) -> bool:
    return bool(params["hf_client"]) and params["source"].get("type") == "hf"


def source_not_mounted(source: dict) -> bool:
    return source.get("type") == "nfs" and not os.path.ismount(str(source.get("mount_point")))


def nothing_to_fetch(dest: str, **fields: object) -> dict:
    """A result for a directory this run does not transfer into; `fields` say why and what was seen."""
    free, measured_on = statvfs_free(dest)
    result = {
        "dest": dest,
        "revision": None,
        "listing": {"revision": None, "files": []},
        "files_total": 0,
        "bytes_total": 0,
        "to_fetch": [],
        "conflicts": [],
        "unverified": [],
        "batches": [],
        "needed_bytes": 0,
        "free_bytes": free,
        "fs_path": measured_on,
        "fs_id": str(os.stat(measured_on).st_dev),
        "fetched": [],
    }
    result.update(fields)
    return result


def would_mount(dest: str, source: dict) -> dict:
    """Check mode cannot list an NFS export that the role has not mounted (it mounts only for real)."""
    return nothing_to_fetch(
        dest,
        complete=False,
        changed=True,
        msg=f"would mount {source.get('export')} on {source.get('mount_point')} and fetch {dest} from it",
    )


def in_place(dest: str) -> dict:
    """The source is the model directory itself (a local or NFS path served as is): only check it."""
    check = check_model_dir(dest)
    if not check["complete"]:
        raise ModelStoreError(check["msg"])
    return nothing_to_fetch(
        dest,
        files_total=check["files_checked"],
        bytes_total=check["total_bytes"],
        complete=True,
        in_place=True,
        changed=False,
        msg=f"{dest} is its own source (served in place): {check['msg']}",
    )


def make_store(params: dict) -> ModelStore:
    return ModelStore(
        params["dest"],
        make_source(params["source"], params["token"], params["timeout"], params["hf_client"]),
        reserve_bytes=params["reserve_bytes"],
        retries=params["retries"],
        retry_delay=params["retry_delay"],
        verify_checksums=params["verify_checksums"],
        streams=params["streams"],
        piece_bytes=params["piece_mib"] * 1024 * 1024,
        buffer_bytes=params["buffer_mib"] * 1024 * 1024,
    )


def sliced(store: ModelStore, plan: dict, fetched: list[str], done: bool) -> dict:
    progress = store.progress.snapshot()
    line = f"{plan['dest']}: {progress_line(progress)}" + (f"; finished {len(fetched)} files" if fetched else "")
    return {**plan, "fetched": fetched, "changed": bool(fetched), "done": done, "progress": progress, "msg": line}


def run(module: AnsibleModule) -> dict:
    params = module.params
    store = make_store(params)
    if module.check_mode and source_not_mounted(params["source"]):
        return would_mount(store.dest, params["source"])
    if store.same_directory_as_source():
        return in_place(store.dest)
    plan = store.plan(listing=params["listing"], refresh=params["refresh"], batch_bytes=params["batch_bytes"])
    changed = bool(plan["to_fetch"] or plan["unverified"] or not plan["complete"])
    if module.check_mode or params["plan_only"]:
        if plan["conflicts"]:
            raise ModelStoreError(store.conflict_message(store.dest, plan["conflicts"]))
        changed = changed and module.check_mode
        held = {"hf_client_held": client_held(params["hf_client"]["venv"])} if hub_client(params) else {}
        return {**plan, **held, "fetched": [], "changed": changed, "done": plan["complete"], "msg": summary(plan, [])}
    if plan["complete"]:
        return {**plan, "fetched": [], "changed": False, "done": True, "msg": summary(plan, [])}
    deadline = time.monotonic() + params["slice_s"] if params["slice_s"] > 0 else None
    fetched = store.fetch(plan, only=params["only"], deadline=deadline) if plan["to_fetch"] else []
    wanted = [e["path"] for e in plan["to_fetch"] if params["only"] is None or e["path"] in params["only"]]
    if params["only"] is not None or len(fetched) < len(wanted):
        return sliced(store, plan, fetched, done=len(fetched) == len(wanted))
    final = store.plan(listing=plan["listing"])
    changed = store.finalize(final) or bool(fetched)
    final["complete"] = True
    return {**sliced(store, final, fetched, done=True), "changed": changed}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "source": {"type": "dict", "required": True},
            "token": {"type": "str", "no_log": True},
            "plan_only": {"type": "bool", "default": False},
            "only": {"type": "list", "elements": "str"},
            "listing": {"type": "dict"},
            "refresh": {"type": "bool", "default": False},
            "verify_checksums": {"type": "bool", "default": True},
            "reserve_bytes": {"type": "int", "default": 0},
            "retries": {"type": "int", "default": 3},
            "retry_delay": {"type": "float", "default": 2.0},
            "timeout": {"type": "int", "default": 60},
            "batch_bytes": {"type": "int", "default": 268435456},
            "slice_s": {"type": "float", "default": 0},
            "streams": {"type": "int", "default": 0},
            "piece_mib": {"type": "int", "default": 64},
            "buffer_mib": {"type": "int", "default": 128},
            "hf_client": {
                "type": "dict",
                "options": {
                    "venv": {"type": "path", "required": True},
                    "workers": {"type": "int", "default": 8},
                    "xet": {"type": "bool", "default": True},
                    "verify": {"type": "str", "default": "read", "choices": ["read", "trust"]},
                },
            },
        },
        supports_check_mode=True,
    )
    try:
        result = run(module)
    except ModelStoreError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
