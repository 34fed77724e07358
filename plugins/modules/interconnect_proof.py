#!/usr/bin/python
# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: prove the GPUs' interconnect the way an engine unit runs, once per driver + GPU set + environment."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: interconnect_proof
short_description: Run the interconnect proof as an engine unit would, and record it per driver, GPU set and environment
description:
  - Runs C(interconnect_proof.py) (a C(torch.distributed) all-reduce over O(world_size) ranks, shipped with the
    C(engine_service) role) with the engine venv's python through C(systemd-run --wait --pipe), with every
    C([Service]) setting of the release's unit file that shapes the process (C(User=), C(Group=), C(Environment=),
    C(EnvironmentFile=), C(LoadCredential=), the state and cache directories and all hardening) - everything but
    how systemd starts, stops and restarts it - so the proof meets the user, environment and sandbox the engine
    will meet.
  - The ranks set the NCCL/CUDA variables the engine sets inside its own process (O(engine_model), O(engine_flags)),
    then run float32 all-reduces, small bfloat16 messages, an all-reduce captured in a CUDA graph and, when the profile
    turns a peer-to-peer all-reduce on (an environment switch of the engine model, SGLang's
    C(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE) say, or O(custom_all_reduce)) on 2 or more
    GPUs, CUDA IPC peer writes (docs/provisioning.md, "Interconnect proof").
  - A proof is recorded under O(records_dir) by a key that hashes O(identity) (driver version, GPU uuids, engine
    version), the world size, backend, the python, the proof script, the engine settings (O(engine), the content of
    O(engine_model), O(engine_flags), O(custom_all_reduce)) and the C(NCCL_*), C(CUDA_*), C(TORCH_NCCL_*), C(NVIDIA_*)
    and O(engine_env_prefixes) variables the unit gives the engine (from C(Environment=) and C(EnvironmentFile=)),
    less names that look like secrets (C(KEY), C(TOKEN), C(SECRET), C(PASSWORD), C(CREDENTIAL)); no other variable is
    read into the key or the record. A recorded proof for the same key is reported and not run again.
  - The key also hashes the fabric the proof ran on, read on the host at each call - the boot id, the kernel command
    line, the IOMMU mode and the PCIe ports whose ACS redirects peer-to-peer traffic (C(lspci -vvv)) - so a proof
    does not outlive a reboot (a C(setpci) ACS fix is lost at reboot), a changed command line or BIOS setting; the
    message names what changed.
  - O(state=recorded) only looks the key up. O(state=proven) runs the proof when no record exists and fails,
    naming the ranks that did not finish, the IOMMU mode, the PCIe ports with ACS redirection, the
    C(nvidia-smi topo -p2p r) matrix and the documented fix, when it does not pass.
  - The proof never runs on GPUs a serving engine holds; the caller decides when the GPUs are free.
version_added: "0.1.0"
author: the blackwell-llm-serving authors (!UNKNOWN)
options:
  state:
    description: C(recorded) reports whether a proof is recorded for the key; C(proven) also runs it when none is.
    type: str
    choices: [recorded, proven]
    default: proven
  unit_file:
    description: The release's unit file; its C([Service]) settings (less start, stop and restart ones) are passed on.
    type: path
    required: true
  script:
    description: C(interconnect_proof.py) on the host (the collection's C(pcie.py) beside it).
    type: path
    required: true
  python:
    description: The engine venv's python (it needs torch with NCCL).
    type: str
    required: true
  world_size:
    description: Ranks, one per GPU of this host in the profile's tensor-parallel group.
    type: int
    required: true
  gpus:
    description: nvidia-smi indices of those GPUs (MIG check); the ranks use CUDA devices 0..N-1 as the engine does.
    type: list
    elements: str
    default: []
  identity:
    description: What else the proof depends on, hashed into the key (driver version, GPU uuids, engine version).
    type: dict
    default: {}
  records_dir:
    description: Where proofs are recorded, one JSON file per key.
    type: path
    required: true
  release:
    description: The release on whose behalf the proof runs, recorded as the one that proved it.
    type: str
    required: true
  timeout_s:
    description: Hard limit of the proof itself; the transient unit is stopped 30 s after it (C(RuntimeMaxSec=)).
    type: int
    default: 60
  sizes_mib:
    description: All-reduce sizes in MiB.
    type: list
    elements: float
    default: [1, 64, 256]
  backend:
    description: C(nccl) on GPUs; C(gloo) only for tests on hosts without GPUs.
    type: str
    choices: [nccl, gloo]
    default: nccl
  nvidia_smi:
    description: nvidia-smi the proof runs for the MIG check and the diagnostics.
    type: str
    default: nvidia-smi
  systemd_run:
    description: systemd-run to use.
    type: str
    default: systemd-run
  engine:
    description: The engine's name (the roster's), as the report and the record give it.
    type: str
    default: none
  engine_model:
    description:
      - The engine's model on the host (its role's C(files/interconnect_engine.py), which C(engine_service) copies
        there) - the NCCL/CUDA variables the engine sets in its own process before its first NCCL call, which the
        ranks apply, and the environment switches that turn on its own peer-to-peer all-reduce.
      - Empty - no engine settings are applied. Its content is hashed into the key.
    type: path
    default: ""
  engine_env_prefixes:
    description: The engine's own environment variable prefixes (the roster's C(env_prefixes)), keyed and reported
      beside C(NCCL_*), C(CUDA_*), C(TORCH_NCCL_*) and C(NVIDIA_*).
    type: list
    elements: str
    default: []
  engine_flags:
    description: The profile's engine switches that change those settings (the engine model's C(FLAGS); SGLang's are
      C(enable-symm-mem) and C(enable-nccl-nvls)).
    type: list
    elements: str
    default: []
  custom_all_reduce:
    description: The profile runs the engine's custom all-reduce (no C(disable-custom-all-reduce)).
    type: bool
    default: false
  fabric_sources:
    description:
      - Where the fabric facts are read (tests point them at fixture files) - C(cmdline), C(boot_id) (files),
        C(iommu_groups) (directory) and C(lspci) (the program, run as C(lspci -vvv)).
    type: dict
    default: {}
notes:
  - Check mode looks the record up and says whether the proof would run; it never runs it.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - blackwell.serving.attributes
seealso:
  - module: blackwell.serving.pcie_facts
"""

EXAMPLES = r"""
- name: Prove the interconnect as sglang.service would run it
  interconnect_proof:
    unit_file: /var/lib/llm-serving/releases/sglang-0123456789ab/sglang.service
    script: /usr/local/libexec/llm-serving/interconnect_proof.py
    python: /opt/sglang/venv/bin/python
    world_size: 8
    gpus: ["0", "1", "2", "3", "4", "5", "6", "7"]
    identity: {driver_version: 580.105.08, gpus: ["GPU-..."], engine: sglang 0.5.23}
    records_dir: /var/lib/llm-serving/interconnect
    release: sglang-0123456789ab
    engine: sglang
    engine_model: /usr/local/libexec/llm-serving/interconnect_engine_sglang.py
    engine_env_prefixes: [SGLANG_]
"""

RETURN = r"""
key:
  description: The record key (16 hex digits).
  returned: always
  type: str
environment:
  description: The NCCL/CUDA variables and the engine's own (O(engine_env_prefixes)) the unit gives the engine (part of
    the key).
  returned: always
  type: dict
fabric:
  description: The fabric facts read now (part of the key) - boot_id, cmdline, iommu_mode, acs_redirecting.
  returned: always
  type: dict
proven:
  description: Whether a proof for the key is recorded (now or before).
  returned: always
  type: bool
ran:
  description: Whether the proof ran in this call.
  returned: always
  type: bool
record:
  description: The record for the key (proven_at, release, key, identity, environment, uid, user, elapsed_s, ...).
  returned: when proven
  type: dict
last:
  description: The newest record of another key, when the key has none (what changed since).
  returned: when not proven
  type: dict
differences:
  description: What differs from RV(last) (driver, GPU set, engine, world size, environment variables).
  returned: always
  type: list
  elements: str
message:
  description: One line for people.
  returned: always
  type: str
report:
  description: The proof script's JSON report.
  returned: when it ran
  type: dict
"""

import datetime
import os
import subprocess
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.host.pcie import fabric_facts
from ansible_collections.blackwell.serving.plugins.module_utils.host.unit_file import (
    read_text,
    service_settings,
    unit_environment,
)
from ansible_collections.blackwell.serving.plugins.module_utils.release.proof_record import (
    README_FIX,
    differences,
    engine_settings,
    environment_hash,
    failure_message,
    file_digest,
    find_record,
    interconnect_environment,
    newest_record,
    not_proven_message,
    parse_report,
    proof_key,
    proven_message,
    read_records,
    release_neutral,
    steps_summary,
    write_record,
)

# [Service] settings about how systemd starts, stops and restarts the engine: not for a one-shot proof.
NOT_PASSED = {"Type", "ExecStart", "ExecStartPre", "ExecStartPost", "ExecStop", "ExecStopPost", "ExecReload",
              "ExecCondition", "Restart", "RestartSec", "TimeoutStartSec", "TimeoutStopSec", "TimeoutSec",
              "RuntimeMaxSec", "KillMode", "KillSignal", "SendSIGKILL", "FinalKillSignal", "RemainAfterExit",
              "PIDFile", "RestartPreventExitStatus", "SuccessExitStatus", "WatchdogSec", "NotifyAccess"}
EXIT_GRACE_S = 30


def systemd_run_argv(params: dict[str, Any], settings: list[tuple[str, str]], unit_name: str) -> list[str]:
    argv = [params["systemd_run"], "--wait", "--pipe", "--quiet", "--collect", "--service-type=exec",
            f"--unit={unit_name}", "-p", f"RuntimeMaxSec={int(params['timeout_s']) + EXIT_GRACE_S}"]
    for key, value in settings:
        if key not in NOT_PASSED:
            argv += ["-p", f"{key}={value.replace('%%', '%')}"]
    argv += ["--", params["python"], params["script"], "--world-size", str(params["world_size"]),
             "--backend", params["backend"], "--timeout-s", str(params["timeout_s"]),
             "--sizes-mib", ",".join(f"{float(m):g}" for m in params["sizes_mib"]),
             "--nvidia-smi", params["nvidia_smi"], "--engine", params["engine"]]
    if params["engine_model"]:
        argv += ["--engine-model", params["engine_model"]]
    if params["engine_env_prefixes"]:
        argv += ["--env-prefixes", ",".join(params["engine_env_prefixes"])]
    if params["engine_flags"]:
        argv += ["--engine-flags", ",".join(params["engine_flags"])]
    if params["custom_all_reduce"]:
        argv.append("--custom-all-reduce")
    if params["gpus"]:
        argv += ["--gpus", ",".join(params["gpus"])]
    return argv


def record_of(report: dict[str, Any], key: str, params: dict[str, Any], environment: dict[str, str],
              fabric: dict[str, Any]) -> dict:
    largest = [r for rank in report.get("ranks", [])[:1] for r in rank.get("results", [])]
    first = (report.get("ranks") or [{}])[0]
    return {"engine_settings": engine_of(params), "engine_environment": report.get("engine_environment"),
            "steps": first.get("steps", []), "nccl": first.get("nccl"), "torch": first.get("torch"),
            "script": file_digest(params["script"]),
            "key": key, "proven_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "release": params["release"], "identity": params["identity"], "world_size": params["world_size"],
            "backend": params["backend"], "python": params["python"], "gpus": params["gpus"],
            "environment": environment, "environment_hash": environment_hash(environment), "fabric": fabric,
            "uid": report.get("uid"), "user": report.get("user"), "elapsed_s": report.get("elapsed_s"),
            "results": largest, "test_double": report.get("test_double")}


def engine_of(params: dict[str, Any]) -> dict[str, Any]:
    model = file_digest(params["engine_model"]) if params["engine_model"] else None
    return engine_settings(params["engine"], params["engine_flags"], params["custom_all_reduce"], model=model)


def run_proof(module: AnsibleModule, argv: list[str], unit_name: str) -> tuple[int, str, str]:
    limit = int(module.params["timeout_s"]) + EXIT_GRACE_S + 15
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=limit, check=False,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        subprocess.run(["systemctl", "stop", unit_name], capture_output=True, check=False, timeout=60)
        module.fail_json(msg=f"interconnect proof FAILED: {unit_name} did not end within {limit} s and was stopped; "
                             f"Fix: {README_FIX}", ran=True)
    except OSError as exc:
        module.fail_json(msg=f"interconnect proof could not start: {exc}", ran=False)
    return proc.returncode, proc.stdout, proc.stderr


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["recorded", "proven"], "default": "proven"},
            "unit_file": {"type": "path", "required": True},
            "script": {"type": "path", "required": True},
            "python": {"type": "str", "required": True},
            "world_size": {"type": "int", "required": True},
            "gpus": {"type": "list", "elements": "str", "default": []},
            "identity": {"type": "dict", "default": {}},
            "records_dir": {"type": "path", "required": True},
            "release": {"type": "str", "required": True},
            "timeout_s": {"type": "int", "default": 60},
            "sizes_mib": {"type": "list", "elements": "float", "default": [1, 64, 256]},
            "backend": {"type": "str", "choices": ["nccl", "gloo"], "default": "nccl"},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "systemd_run": {"type": "str", "default": "systemd-run"},
            "fabric_sources": {"type": "dict", "default": {}},
            "engine": {"type": "str", "default": "none"},
            "engine_model": {"type": "path", "default": ""},
            "engine_env_prefixes": {"type": "list", "elements": "str", "default": []},
            "engine_flags": {"type": "list", "elements": "str", "default": []},
            "custom_all_reduce": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    unit_text = read_text(params["unit_file"])
    if unit_text is None:
        module.fail_json(msg=f"the unit file {params['unit_file']} cannot be read")
    settings = service_settings(unit_text)
    try:
        environment = interconnect_environment(unit_environment(settings), params["engine_env_prefixes"])
    except OSError as exc:
        module.fail_json(msg=str(exc))
    unit_environment_as_run, environment = environment, release_neutral(environment,
                                                                        os.path.dirname(params["unit_file"]))
    fabric = fabric_facts(params["fabric_sources"])
    engine, script = engine_of(params), file_digest(params["script"])
    key = proof_key(params["identity"], params["world_size"], params["backend"], params["python"], environment,
                    fabric=fabric, engine=engine, script=script)
    records = read_records(params["records_dir"])
    record = find_record(records, key)
    result: dict[str, Any] = {"changed": False, "key": key, "environment": environment, "fabric": fabric,
                              "ran": False}
    if record:
        module.exit_json(**result, proven=True, record=record, differences=[], message=proven_message(record))
    last = newest_record(records)
    found = differences(last, params["identity"], params["world_size"], params["python"], environment,
                        fabric=fabric, engine=engine, script=script)
    result.update(proven=False, last=last, differences=found, message=not_proven_message(last, found))
    if params["state"] == "recorded":
        module.exit_json(**result)
    unit_name = os.path.basename(params["unit_file"]).rsplit(".", 1)[0] + "-interconnect-proof"
    if module.check_mode:
        module.exit_json(**{**result, "changed": True,
                            "message": result["message"] + f"; would run the proof as {unit_name}"})
    rc, stdout, stderr = run_proof(module, systemd_run_argv(params, settings, unit_name), unit_name)
    report = parse_report(stdout)
    if rc != 0 or not report or not report.get("ok"):
        module.fail_json(msg=failure_message(report, rc, stderr, unit_name), report=report, key=key,
                         environment=environment, ran=True, proven=False)
    seen = interconnect_environment(report.get("environment") or {}, params["engine_env_prefixes"])
    if seen != unit_environment_as_run:
        module.fail_json(msg=f"interconnect proof ran with another NCCL/CUDA/engine environment than "
                             f"{os.path.basename(params['unit_file'])} "
                             f"gives the engine: {seen} instead of {unit_environment_as_run}; not recorded",
                         report=report,
                         key=key, environment=environment, ran=True, proven=False)
    new = record_of(report, key, params, environment, fabric)
    write_record(params["records_dir"], new)
    module.exit_json(changed=True, key=key, environment=environment, ran=True, proven=True, record=new,
                     differences=found, report=report,
                     message=f"interconnect PROVEN: {report.get('world_size')} ranks as uid {report.get('uid')} "
                             f"({report.get('user')}), environment hash {report.get('environment_hash')}, "
                             f"{report.get('elapsed_s')} s; {steps_summary(report)}; "
                             f"recorded as {key} by release {params['release']}")


if __name__ == "__main__":
    main()
