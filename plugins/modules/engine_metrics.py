#!/usr/bin/python
"""Ansible module: scrape an engine's Prometheus /metrics on the host and sum samples by metric name."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_metrics
short_description: Scrape an inference engine's Prometheus metrics and return counters summed by name
description:
  - Fetches I(url) (an SGLang or vLLM C(/metrics) endpoint) from the host it runs on and parses the
    Prometheus text exposition format with the standard library only.
  - Every sample of a metric is summed over its label sets (tensor-parallel ranks, engines, positions),
    so C(sglang:generation_tokens_total) is one number for the whole server.
  - Two scrapes around a benchmark give counter deltas over that window; the acceptance math lives in
    C(plugins/module_utils/engine/metrics.py) (see the verify role).
  - A C(/metrics) that answers 404 (SGLang without C(--enable-metrics)) is not an error. The result has
    I(available=false) so the caller can say that acceptance was not measured.
  - Read-only; runs the same in check mode.
options:
  url:
    description: Metrics URL, for example C(http://127.0.0.1:30000/metrics)
    type: str
    required: true
  prefixes:
    description: Keep only metrics whose name starts with one of these (the verify role passes the engine's roster
      C(metrics.prefix)). An empty list keeps everything.
    type: list
    elements: str
    required: true
  api_key:
    description:
      - Sent as C(Authorization Bearer) when set. Both engines serve C(/metrics) without the key; this is
        for a reverse proxy in front of them.
    type: str
  timeout_s:
    description: Timeout of the request, in seconds.
    type: float
    default: 30
author: the blackwell-llm-serving authors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Counters before the benchmark
  engine_metrics:
    url: http://127.0.0.1:30000/metrics
  register: before
"""

RETURN = r"""
available:
  description: Whether the endpoint served metrics (false on HTTP 404).
  type: bool
  returned: always
status:
  description: HTTP status of the response.
  type: int
  returned: always
counters:
  description: Metric name to the sum of its samples over all label sets (counters and gauges alike).
  type: dict
  returned: always
  sample: {"sglang:generation_tokens_total": 1234.0, "sglang:spec_verify_calls_total": 567.0}
test_double:
  description: True when the response carried the X-Engine-Test-Double header (the engine test double).
  type: bool
  returned: always
"""

import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.engine.metrics import (
    MetricsError,
    parse_prometheus_text,
    select_metrics,
)


def fetch(url: str, api_key: str | None, timeout_s: float) -> tuple[int, str, bool]:
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read().decode("utf-8", errors="replace")
            return response.status, body, response.headers.get("X-Engine-Test-Double") is not None
    except urllib.error.HTTPError as exc:
        return exc.code, "", exc.headers.get("X-Engine-Test-Double") is not None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "prefixes": {"type": "list", "elements": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "timeout_s": {"type": "float", "default": 30.0},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        status, body, test_double = fetch(params["url"], params["api_key"], params["timeout_s"])
    except (urllib.error.URLError, OSError, ValueError) as exc:
        module.fail_json(msg=f"cannot scrape {params['url']}: {exc}", available=False, counters={})
    if status == 404:
        module.exit_json(changed=False, available=False, status=status, counters={}, test_double=test_double)
    if status != 200:
        module.fail_json(msg=f"{params['url']} answered HTTP {status}", available=False, status=status,
                         counters={}, test_double=test_double)
    try:
        counters = select_metrics(parse_prometheus_text(body), params["prefixes"])
    except MetricsError as exc:
        module.fail_json(msg=f"{params['url']} is not Prometheus text: {exc}", available=False,
                         status=status, counters={}, test_double=test_double)
    module.exit_json(changed=False, available=True, status=status, counters=counters, test_double=test_double)


if __name__ == "__main__":
    main()
