# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""The interconnect proof's record: its key, the records on the host, what changed, the messages (stdlib only).

Used by the interconnect_proof module. The key hashes what the proof depends on: the identity (driver version,
GPU uuids, engine version), world size, backend, python, the unit's NCCL_*/CUDA_*/TORCH_NCCL_*/NVIDIA_* variables and
the engine's own (its roster prefixes; names that look like secrets left out, as the proof script reports them),
the engine's own settings the proof applies (engine, its model file, its switches that shape NCCL, whether its
custom all-reduce runs), the proof script itself, and the fabric.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_NCCL_", "NVIDIA_")  # beside the engine's own (the roster's env_prefixes)
# As roles/engine_service/files/interconnect_proof.py: never keyed nor recorded (an API key can be in the unit).
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
README_FIX = "docs/provisioning.md, section 'Interconnect: IOMMU and ACS'"


def interconnect_environment(env: dict[str, str], engine_prefixes: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """The unit's variables that shape the engine's communication, as the proof script reports them."""
    return without_secrets({k: v for k, v in env.items() if k.startswith((*ENV_PREFIXES, *engine_prefixes))})


def without_secrets(env: dict[str, str]) -> dict[str, str]:
    """The variables less those whose names look like secrets, sorted by name."""
    return {k: v for k, v in sorted(env.items()) if not any(word in k for word in SECRET_WORDS)}


def release_neutral(env: dict[str, str], release_dir: str) -> dict[str, str]:
    """The environment as the record keys it: a path inside the release's own directory (SGLang's
    logging configuration path, say) names the release, not the fabric, and would make every release prove again."""
    if not release_dir:
        return dict(env)
    return {k: v.replace(release_dir.rstrip("/") + "/", "<release>/") for k, v in env.items()}


def engine_settings(engine: str = "none", engine_flags: list[str] | None = None,
                    custom_all_reduce: bool = False, *, model: str | None = None) -> dict[str, Any]:
    """The engine's own settings the proof applies (its in-process NCCL/CUDA variables, its peer-to-peer path);
    ``model``: the digest of the engine model file that says what those are."""
    return {"engine": engine, "model": model, "engine_flags": sorted(engine_flags or []),
            "custom_all_reduce": bool(custom_all_reduce)}


def file_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()[:16]
    except OSError:
        return None


def environment_hash(env: dict[str, str]) -> str:
    """As interconnect_proof.py computes it from its own environment."""
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]


def proof_key(identity: dict, world_size: int, backend: str, python: str, environment: dict[str, str], *,
              fabric: dict[str, Any] | None = None, engine: dict[str, Any] | None = None,
              script: str | None = None) -> str:
    material = {"identity": identity, "world_size": int(world_size), "backend": backend, "python": python,
                "environment": without_secrets(environment)}
    if fabric is not None:
        material["fabric"] = fabric
    if engine is not None and engine != engine_settings():
        material["engine"] = engine
    if script is not None:
        material["script"] = script
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def read_records(records_dir: str) -> list[dict[str, Any]]:
    records = []
    try:
        names = sorted(os.listdir(records_dir))
    except OSError:
        return []
    for name in names:
        if name.endswith(".json"):
            try:
                with open(os.path.join(records_dir, name), encoding="utf-8") as handle:
                    records.append(json.load(handle))
            except (OSError, ValueError):
                continue
    return records


def find_record(records: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    return next((r for r in records if r.get("key") == key), None)


def newest_record(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    return max(records, key=lambda r: r.get("proven_at", ""), default=None)


def differences(last: dict[str, Any] | None, identity: dict, world_size: int, python: str,
                environment: dict[str, str], *, fabric: dict[str, Any] | None = None,
                engine: dict[str, Any] | None = None, script: str | None = None) -> list[str]:
    """What differs from the last recorded proof, in words (empty when nothing was ever proven here)."""
    if not last:
        return []
    found = []
    old_identity = last.get("identity", {})
    for name in sorted(set(old_identity) | set(identity)):
        if old_identity.get(name) != identity.get(name):
            found.append(f"{name}: {old_identity.get(name)} -> {identity.get(name)}")
    if int(last.get("world_size", 0)) != int(world_size):
        found.append(f"world size: {last.get('world_size')} -> {world_size}")
    if last.get("python") != python:
        found.append(f"python: {last.get('python')} -> {python}")
    old_fabric = last.get("fabric", {})
    for name in sorted(set(old_fabric) | set(fabric or {})):
        if old_fabric.get(name) != (fabric or {}).get(name):
            found.append(f"{name.replace('_', ' ')}: {old_fabric.get(name, '(not recorded)')} -> "
                         f"{(fabric or {}).get(name)}")
    old_engine, new_engine = last.get("engine_settings") or engine_settings(), engine or engine_settings()
    for name in sorted(set(old_engine) | set(new_engine)):
        if old_engine.get(name) != new_engine.get(name):
            found.append(f"engine settings ({name}): {old_engine.get(name)} -> {new_engine.get(name)}")
    if script is not None and last.get("script") != script:
        found.append(f"proof script: {last.get('script', '(not recorded)')} -> {script}")
    old_env = last.get("environment", {})
    for name in sorted(set(old_env) | set(environment)):
        if old_env.get(name) != environment.get(name):
            found.append(f"{name}: {old_env.get(name, '(unset)')} -> {environment.get(name, '(unset)')}")
    return found


def proven_message(record: dict[str, Any]) -> str:
    return (f"interconnect proven on {record.get('proven_at')} by release {record.get('release')} "
            f"({record.get('world_size')} ranks, key {record.get('key')}); not run again")


def not_proven_message(last: dict[str, Any] | None, found: list[str]) -> str:
    if not last:
        return "no interconnect proof is recorded on this host"
    return (f"the interconnect is not proven for this driver, GPU set and environment (last proof on "
            f"{last.get('proven_at')} by release {last.get('release')}; changed: {'; '.join(found) or 'key'})")


def parse_report(stdout: str) -> dict[str, Any] | None:
    """The proof's JSON document (the whole of stdout), or None when it printed none."""
    text = stdout.strip()
    start = text.find("{")
    if start < 0:
        return None
    try:
        report = json.loads(text[start:])
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def failure_message(report: dict[str, Any] | None, rc: int, stderr: str, unit_name: str) -> str:
    """Ranks that did not finish, the IOMMU mode, ACS redirection, topo -p2p r and the fix, in one message."""
    if report is None:
        return (f"interconnect proof FAILED: {unit_name} ended with exit {rc} without a report: "
                f"{stderr.strip()[-1500:] or '(no output)'}. Fix: {README_FIX}")
    parts = [f"interconnect proof FAILED ({report.get('backend')}, {report.get('world_size')} ranks, "
             f"uid {report.get('uid')} {report.get('user')}): {report.get('reason') or f'exit {rc}'}"]
    unfinished = report.get("unfinished_ranks")
    if unfinished:
        parts.append("ranks that did not finish: " + ", ".join(map(str, unfinished)))
    diagnostics = report.get("diagnostics", {})
    pcie = diagnostics.get("pcie", {})
    if "iommu" in pcie:
        iommu = pcie["iommu"]
        parts.append(f"IOMMU mode: {iommu.get('mode')} ({iommu.get('source')})")
        acs = pcie.get("acs", {})
        ports = [f"{p['bdf']} ({'+ '.join(p['redirecting'])}+)" for p in acs.get("redirecting", [])]
        unchecked = f"not checked ({acs.get('error', 'no lspci')})"
        listed = ", ".join(ports) if ports else "none" if acs.get("checked") else unchecked
        parts.append("PCIe ports with ACS ReqRedir+/CmpltRedir+: " + listed)
    elif "pcie" in diagnostics:
        parts.append(f"IOMMU/ACS: {pcie.get('error')}")
    if "topo_p2p_read" in diagnostics:
        parts.append("nvidia-smi topo -p2p r:\n" + str(diagnostics["topo_p2p_read"]).rstrip())
    parts.append(f"Fix: {README_FIX}")
    return "; ".join(parts)


def steps_summary(report: dict[str, Any]) -> str:
    """The engine settings the ranks applied and each step after the float32 sizes, in one line."""
    applied = report.get("engine_environment") or {}
    steps = ((report.get("ranks") or [{}])[0]).get("steps") or []
    return (f"engine {report.get('engine', 'none')} settings "
            + (", ".join(f"{k}={v}" for k, v in sorted(applied.items())) or "none") + "; "
            + ("; ".join(step_text(s) for s in steps) or "no other steps reported"))


def write_record(records_dir: str, record: dict[str, Any]) -> None:
    os.makedirs(records_dir, mode=0o755, exist_ok=True)
    path = os.path.join(records_dir, f"{record['key']}.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def step_text(step: dict) -> str:
    """One proof step for the summary line: its name, status and, where given, the reason's last part."""
    reason = f" ({step['reason'].split(': ', 1)[-1]})" if step.get("reason") else ""
    return f"{step.get('step')}: {step.get('status')}{reason}"
