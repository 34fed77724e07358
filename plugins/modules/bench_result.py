#!/usr/bin/python
"""Ansible module: read a benchmark client's result file on the host and return only the fields verify uses."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_result
short_description: Read an engine benchmark client's result on the host, keeping an allow-list of fields
description:
  - Reads the result file that SGLang's C(sglang.bench_serving) (one JSON line appended per run, the last
    line being this run) or vLLM's C(vllm bench serve) (one JSON document) wrote, on the host it runs on.
  - Returns only the fields in I(fields), each a number, null or a short one-line string (the workload the client
    says it ran). Everything else stays on the host. The clients' result
    holds raw upstream payloads - SGLang's client saves the whole C(/server_info) reply, which carries the
    server arguments with the API key (C(sglang/benchmark/serving.py) of SGLang 0.5.23), so reading the
    file with C(slurp) would put the key into the play's results, ansible-runner's events and the report's
    C(inputs.json) on the controller.
  - Names of the fields it dropped are returned (names only, never values).
  - Read-only; runs the same in check mode.
options:
  path:
    description: The result file.
    type: path
    required: true
  format:
    description: C(jsonl) (the last non-empty line is the result) or C(json) (the whole file is).
    type: str
    choices: [jsonl, json]
    required: true
  fields:
    description:
      - The fields to keep. Only numbers, null and strings of at most 128 printable characters are kept; a
        listed field holding anything else is dropped and named in I(dropped).
    type: list
    elements: str
    default: [output_throughput, completed, duration, total_output_tokens, request_throughput, mean_ttft_ms,
              median_ttft_ms, p99_ttft_ms, mean_itl_ms, median_itl_ms, p99_itl_ms, mean_tpot_ms, p99_tpot_ms,
              spec_decode_acceptance_rate, accept_length, backend, dataset_name, max_concurrency,
              sharegpt_output_len, random_input_len, random_output_len]
author: the blackwell-llm-serving authors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the result of SGLang's benchmark client
  bench_result:
    path: /var/tmp/verify/bench-c1.jsonl
    format: jsonl
  register: bench
"""

RETURN = r"""
result:
  description: The kept fields of the result, each a number, null or a short string.
  type: dict
  returned: success
  sample: {"completed": 8, "output_throughput": 812.4, "accept_length": 2.1}
dropped:
  description: Names of the result's fields that were not kept (values never leave the host).
  type: list
  elements: str
  returned: success
  sample: ["server_info", "generated_texts", "backend"]
"""

import json
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

# What the report uses (plugins/plugin_utils/verify_report.py) and the workload the client says it ran.
DEFAULT_FIELDS = ["output_throughput", "completed", "duration", "total_output_tokens", "request_throughput",
                  "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
                  "mean_tpot_ms", "p99_tpot_ms", "spec_decode_acceptance_rate", "accept_length", "backend",
                  "dataset_name", "max_concurrency", "sharegpt_output_len", "random_input_len", "random_output_len"]
MAX_STRING = 128


class ResultError(ValueError):
    """The file is missing, empty or not the JSON the client writes."""


def read_document(path: Path, fmt: str) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ResultError(f"cannot read the benchmark result {path}: {exc.strerror or exc}") from None
    if fmt == "jsonl":
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            raise ResultError(f"the benchmark result {path} is empty: the client wrote no result line")
        text = lines[-1]
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ResultError(f"the benchmark result {path} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(document, dict):
        raise ResultError(f"the benchmark result {path} is a JSON {type(document).__name__}, not an object")
    return document


def is_plain(value: object) -> bool:
    """A number, null or a short printable string: a value, not a payload."""
    if isinstance(value, str):
        return len(value) <= MAX_STRING and value.isprintable()
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def keep_plain(document: dict, fields: list[str]) -> tuple[dict, list[str]]:
    """The listed fields with plain values, and the names of every field that was left out."""
    kept = {name: document[name] for name in fields if name in document and is_plain(document[name])}
    dropped = sorted(str(name) for name in document if name not in kept)
    return kept, dropped


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "format": {"type": "str", "choices": ["jsonl", "json"], "required": True},
            "fields": {"type": "list", "elements": "str", "default": DEFAULT_FIELDS},
        },
        supports_check_mode=True,
    )
    try:
        document = read_document(Path(module.params["path"]), module.params["format"])
    except ResultError as exc:
        module.fail_json(msg=str(exc))
    kept, dropped = keep_plain(document, module.params["fields"])
    module.exit_json(changed=False, result=kept, dropped=dropped)


if __name__ == "__main__":
    main()
