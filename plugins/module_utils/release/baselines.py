# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""The throughput baselines verify recorded on a host, for engine_status (status.yml).

verify writes one only when asked (``verify_mode=baseline``, or ``verify_record_baseline``), as
``<state dir>/verify-baselines/<key hash>.json``; the one a recording replaced moves to
``history/<key hash>-<content hash>.json``. A baseline holds throughput numbers, its key (engine and version, model
revision, layout, GPU model, workloads) and who measured it: no secret. Nothing is written here.

Standard library only: it runs on the target.
"""

from __future__ import annotations

import os
from typing import Any

from ansible_collections.blackwell.serving.plugins.module_utils.release.state import JsonFileError, read_json_file

BASELINES_DIR = "verify-baselines"
HISTORY_DIR = "history"
KEY_HASH_LENGTH = 16  # roles/verify/vars/main.yml __verify_baseline_key_hash
# What the result says of a baseline document (its workloads stay in the file: they are long, and the key hash
# already stands for them).
KEY_FIELDS = ("engine", "engine_version", "model", "gpu_model", "tensor_parallel_size", "layout")


def _document(path: str) -> tuple[dict[str, Any] | None, str]:
    """The baseline at ``path``, or None and why it cannot be read."""
    try:
        document, _ = read_json_file(path)
    except (OSError, JsonFileError) as exc:
        return None, f"cannot be read: {exc}"
    if not isinstance(document, dict) or document.get("kind") != "verify-baseline":
        return None, "is not a verify baseline (its kind is not verify-baseline)"
    return document, ""


def _throughput(document: dict[str, Any]) -> dict[str, Any]:
    throughput = document.get("output_throughput")
    return dict(throughput) if isinstance(throughput, dict) else {}


def _brief(document: dict[str, Any]) -> dict[str, Any]:
    key = document.get("key") if isinstance(document.get("key"), dict) else {}
    return {"recorded": document.get("timestamp"), "profile": document.get("profile"),
            "output_throughput": _throughput(document),
            **{field: key.get(field) for field in KEY_FIELDS if key.get(field) is not None}}


def _history(history_dir: str, key_hash: str) -> list[dict[str, Any]]:
    """The baselines this key's recordings replaced, newest first (by the time each was measured)."""
    try:
        names = sorted(name for name in os.listdir(history_dir)
                       if name.startswith(f"{key_hash}-") and name.endswith(".json"))
    except OSError:
        return []
    entries = []
    for name in names:
        document, why = _document(os.path.join(history_dir, name))
        entries.append({"file": name, **({"recorded": None, "error": why} if document is None else {
            "recorded": document.get("timestamp"), "output_throughput": _throughput(document)})})
    return sorted(entries, key=lambda entry: str(entry.get("recorded") or ""), reverse=True)


def read_baselines(state_dir: str) -> list[dict[str, Any]]:
    """Every baseline recorded under the state directory, one per key, newest first: key (the hash that names the
    file), recorded (UTC, when it was measured), profile, output_throughput (concurrency to tok/s), the key's fields
    (engine, engine_version, model, gpu_model, tensor_parallel_size, layout), history (the ones it replaced, newest
    first), and error instead of the numbers when the file cannot be read. Empty when none was recorded."""
    directory = os.path.join(state_dir, BASELINES_DIR)
    try:
        names = sorted(name for name in os.listdir(directory) if name.endswith(".json")
                       and os.path.isfile(os.path.join(directory, name)))
    except OSError:
        return []
    baselines = []
    for name in names:
        key_hash = name[: -len(".json")]
        document, why = _document(os.path.join(directory, name))
        entry: dict[str, Any] = {"key": key_hash}
        entry.update({"recorded": None, "error": why} if document is None else _brief(document))
        entry["history"] = _history(os.path.join(directory, HISTORY_DIR), key_hash)
        baselines.append(entry)
    return sorted(baselines, key=lambda entry: str(entry.get("recorded") or ""), reverse=True)


def baseline_lines(baselines: list[dict[str, Any]]) -> list[str]:
    """One line per recorded baseline: when, profile, engine and version, layout, GPU model, tok/s per concurrency,
    and how many earlier ones it replaced."""
    lines = []
    for baseline in baselines or []:
        if baseline.get("error"):
            lines.append(f"baseline {baseline['key']}: {baseline['error']}")
            continue
        layout = baseline.get("layout") or {"tensor_parallel_size": baseline.get("tensor_parallel_size")}
        said = " x ".join(f"{name.replace('_parallel_size', '').replace('_', ' ')} {size}"
                          for name, size in sorted(layout.items(), key=lambda item: item[0] != "tensor_parallel_size")
                          if size is not None and (name == "tensor_parallel_size" or int(size) > 1)) \
            or "layout unrecorded"
        levels = ", ".join(f"c{level} {value} tok/s" for level, value in
                           sorted(baseline.get("output_throughput", {}).items(), key=lambda item: int(item[0])))
        earlier = len(baseline.get("history") or [])
        lines.append(f"baseline {baseline['key']} recorded {baseline.get('recorded') or 'at an unknown time'}: "
                     f"profile {baseline.get('profile') or '?'}, {baseline.get('engine') or '?'} "
                     f"{baseline.get('engine_version') or ''}".rstrip()
                     + f", {said}, {baseline.get('gpu_model') or 'GPU unknown'}: {levels or 'no levels'}"
                     + (f" (replaced {earlier} earlier, kept in {BASELINES_DIR}/{HISTORY_DIR}/)" if earlier else ""))
    return lines or ["no throughput baseline recorded (verify_mode=baseline records one)"]
