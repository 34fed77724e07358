#!/usr/bin/python
"""Ansible module: everything a deploy checks on the host before it touches what serves, in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_preflight
short_description: Check a host before a deploy touches what serves - GPUs, weights, port
description:
  - One round trip for the host side of a deploy's preflight. Each check runs only when asked for; every check
    that fails is named in C(msg), so one run says everything that must be fixed. Nothing is changed, stopped,
    signalled or removed, in check mode or not.
  - I(gpu_facts) reads the GPUs as the gpu_facts module does (nvidia-smi under a timeout, MIG mode included);
    the deploy's assertions on count, driver branch, compute capability and MIG use the returned C(gpus).
  - Foreign processes holding the GPUs, and GPUs left wedged, are the gpu_release module's report-only check.
  - I(model_paths) must be complete model directories (the model_check module's rules).
  - I(port) must be free or held by one of I(port_allowed_units).
options:
  gpu_facts:
    description: Read the GPUs (index, uuid, driver version, compute capability, MIG mode).
    type: bool
    default: false
  nvidia_smi:
    description: nvidia-smi to run (name in PATH or a path), for I(gpu_facts).
    type: str
    default: nvidia-smi
  driver_proc_dir:
    description: The NVIDIA driver's C(/proc) directory, for I(gpu_facts).
    type: path
    default: /proc/driver/nvidia
  nvidia_smi_timeout_s:
    description: Seconds after which one nvidia-smi call of I(gpu_facts) is killed (the check then fails saying so).
    type: int
    default: 30
  model_paths:
    description: Model directories that must be complete.
    type: list
    elements: path
    default: []
  port:
    description: TCP port the release listens on; 0 skips the check.
    type: int
    default: 0
  port_allowed_units:
    description: Units that may hold I(port) (the engine units a switch stops).
    type: list
    elements: str
    default: []
notes:
  - Supports check mode (it only reads). Standard library only.
author: the blackwell-llm-serving authors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Preflight | the host is ready for the release
  engine_preflight:
    gpu_facts: true
    model_paths: [/srv/models/moonshotai/Kimi-K2.5, /srv/models/AQ-MedAI/Kimi-K25-eagle3]
    port: 30000
    port_allowed_units: [sglang.service, vllm.service]
  register: preflight
"""

RETURN = r"""
gpus:
  description: With I(gpu_facts), the GPUs as the gpu_facts module returns them (mig_mode included).
  type: list
  elements: dict
  returned: always
models:
  description: Per model path - path, complete, msg, problems.
  type: list
  elements: dict
  returned: always
port:
  description: With I(port) - free, listeners, strangers.
  type: dict
  returned: always
problems:
  description: One line per failed check; the task fails when there is any.
  type: list
  elements: str
  returned: always
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.host.port import port_report, stranger_message
from ansible_collections.blackwell.serving.plugins.module_utils.model.store import check_model_dir
from ansible_collections.blackwell.serving.plugins.module_utils.nvidia.smi import NvidiaError, read_gpu_facts


def model_problems(paths: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    models = [{"path": path, **check_model_dir(path, require_index=False)} for path in paths]
    return models, [m["msg"] for m in models if not m["complete"]]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "gpu_facts": {"type": "bool", "default": False},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "driver_proc_dir": {"type": "path", "default": "/proc/driver/nvidia"},
            "nvidia_smi_timeout_s": {"type": "int", "default": 30},
            "model_paths": {"type": "list", "elements": "path", "default": []},
            "port": {"type": "int", "default": 0},
            "port_allowed_units": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    problems: list[str] = []
    gpus: list[dict[str, Any]] = []
    if p["gpu_facts"]:
        try:
            gpus = read_gpu_facts(p["nvidia_smi"], p["driver_proc_dir"], p["nvidia_smi_timeout_s"], mig=True)["gpus"]
        except NvidiaError as exc:
            problems.append(str(exc))
    models, found = model_problems(p["model_paths"])
    problems += found
    port: dict[str, Any] = {}
    if p["port"]:
        try:
            port = port_report(p["port"], p["port_allowed_units"])
        except ValueError as exc:
            module.fail_json(msg=str(exc))
        if port["strangers"]:
            problems.append(stranger_message(p["port"], port["strangers"]))
    result = {"changed": False, "gpus": gpus, "models": models, "port": port, "problems": problems}
    if problems:
        module.fail_json(msg="Preflight: " + " | ".join(problems), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
