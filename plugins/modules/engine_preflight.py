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
  memory_fit:
    description:
      - With I(gpu_facts), whether the weights of I(model_paths) (target first) and the KV cache of one full context
        fit each of the first C(gpus_per_node) GPUs of O(memory_fit.layout), computed from the checkpoint (its
        safetensors headers and C(config.json)) and the layout. Unset skips it. A checkpoint without safetensors or
        a config is not computed (C(memory_fit.computed) false).
    type: dict
    suboptions:
      layout:
        description: The profile's layout (the filter C(blackwell.serving.parallel_layout)).
        type: dict
        required: true
      context_length:
        description: Tokens of one full request; 0 reads C(max_position_embeddings) from the checkpoint.
        type: int
        required: true
      fraction:
        description: The share of each GPU's memory the engine takes for weights and KV cache.
        type: float
        required: true
      kv_bytes:
        description: Bytes of one KV cache value (2 for bf16, 1 for fp8).
        type: int
        default: 2
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
memory_fit:
  description: >-
    With I(memory_fit) - computed, fits, message, weights_gib, kv_gib, needed_gib, budget_gib (per GPU).
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
from ansible_collections.blackwell.serving.plugins.module_utils.model.fit import FitError, fit_message, memory_fit
from ansible_collections.blackwell.serving.plugins.module_utils.model.store import check_model_dir
from ansible_collections.blackwell.serving.plugins.module_utils.nvidia.smi import NvidiaError, read_gpu_facts


def model_problems(paths: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    models = [{"path": path, **check_model_dir(path, require_index=False)} for path in paths]
    return models, [m["msg"] for m in models if not m["complete"]]


def fit_report(request: dict[str, Any], model_paths: list[str], gpus: list[dict[str, Any]]) -> tuple[dict, list]:
    """The memory-fit verdict on the GPUs the layout uses (the smallest of them), and its problem if any."""
    layout = request["layout"]
    used = gpus[:int(layout["gpus_per_node"])]
    if not used or not model_paths:
        return {"computed": False, "message": "memory fit not computed: no GPUs read or no model path"}, []
    try:
        fit = memory_fit(model_paths, {k: int(v) for k, v in layout.items()}, request["context_length"],
                         min(int(gpu["memory_total_mib"]) for gpu in used), request["fraction"],
                         kv_bytes=request["kv_bytes"])
    except (FitError, KeyError, TypeError, ValueError) as exc:
        return {"computed": False, "message": f"memory fit not computed: {exc}"}, [f"memory fit: {exc}"]
    if fit is None:
        return {"computed": False, "message": f"memory fit not computed: {model_paths[0]} has no safetensors "
                "weights or no config.json"}, []
    report = {"computed": True, "fits": fit.fits, "message": fit_message(fit),
              **{key: round(getattr(fit, key), 2) for key in ("weights_gib", "kv_gib", "needed_gib", "budget_gib")}}
    return report, [] if fit.fits else [f"memory fit: {report['message']}"]


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
            "memory_fit": {"type": "dict", "options": {
                "layout": {"type": "dict", "required": True},
                "context_length": {"type": "int", "required": True},
                "fraction": {"type": "float", "required": True},
                "kv_bytes": {"type": "int", "default": 2},
            }},
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
    fit: dict[str, Any] = {}
    if p["memory_fit"] and not found:  # incomplete weights are named above; their headers would say less
        fit, unfit = fit_report(p["memory_fit"], p["model_paths"], gpus)
        problems += unfit
    result = {"changed": False, "gpus": gpus, "models": models, "port": port, "memory_fit": fit,
              "problems": problems}
    if problems:
        module.fail_json(msg="Preflight: " + " | ".join(problems), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
