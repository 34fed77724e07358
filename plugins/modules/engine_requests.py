#!/usr/bin/python
"""Ansible module: a few HTTP requests to an engine's API in one call, answered as ansible.builtin.uri answers."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_requests
short_description: Send a few HTTP requests to an inference engine's API in one call
description:
  - Sends I(requests) in order to I(base_url) from the host (the engines listen on its loopback) and returns each
    answer the way M(ansible.builtin.uri) does - C(status) (-1 when there was none), C(msg), C(json) when the body
    is JSON, and every response header as a top-level key (lower case, C(-) as C(_)). Verify's readiness and smoke
    checks are one round trip instead of four.
  - A request whose status is not in its I(expect) stops the sequence; the requests after it are returned with
    C(skipped) true, so a broken endpoint is not also asked for a generation that can take minutes to time out.
  - Each request has its own timeout; one that ends without an answer has C(status) -1 and a C(msg) that says
    C(timed out).
  - With I(compile_unit), a request's timeout runs from the later of its start and the last progress of a compiler
    in that unit's cgroup (a process named as a compiler - ninja, nvcc, cicc, ptxas, cc1plus, gcc ... - whose CPU
    time or bytes written grew since the last look, every 0.25 s; an idle compiler is not progress). An engine
    builds kernels on first use, silently, inside the request that first needs them (with EAGLE-3 speculation
    SGLang's first sampled request builds FlashInfer's C(sampling) module and SGLang's
    C(tree_speculative_sampling_target_only), 90-110 s on 16 cores); such a request fails only when its timeout
    has passed since the compilers stopped working, so a long compile passes and a hang after it still fails.
  - I(headers) (the API key) is never logged. I(keep_json) keeps only some top-level keys of an answer (SGLang's
    C(/server_info) echoes its launch command, API key included).
  - Each answer says whether its body holds a secret (C(holds_secrets)) - the bearer token its request sent, any of
    I(secrets), or any secret the unit I(secrets_of_unit) gives its engine (the values of I(secret_flags) on its
    command line, in the C(--config) file it names and in its environment), read on the host - as it is, JSON- or
    repr-escaped or base64-encoded. So a reply that publishes the engine's admin key is found whichever key the
    request sent, or none.
  - The requests are sent in check mode too (they read the endpoint; a smoke completion changes nothing there).
options:
  base_url:
    description: Endpoint, for example C(http://127.0.0.1:30000).
    type: str
    required: true
  headers:
    description: Headers of the requests with I(auth) true (C(Authorization)); never logged.
    type: dict
    default: {}
  requests:
    description: The requests, sent in this order.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Key of this answer in C(results).
        type: str
        required: true
      path:
        description: Path under I(base_url), for example C(/v1/models).
        type: str
        required: true
      method:
        description: HTTP method.
        type: str
        default: GET
        choices: [GET, POST]
      body:
        description: JSON body (sent with C(Content-Type application/json)).
        type: raw
      auth:
        description: Send I(headers).
        type: bool
        default: true
      timeout:
        description: Seconds to wait for an answer.
        type: float
        default: 30
      expect:
        description: Statuses after which the sequence goes on; empty accepts any.
        type: list
        elements: int
        default: []
      keep_json:
        description: Keep only these top-level keys of a JSON answer; empty keeps all.
        type: list
        elements: str
        default: []
  compile_unit:
    description:
      - A systemd unit whose compilers at work extend each request's timeout (see above); empty, or a unit without a
        control group here, extends none (the answer's C(compilers.problem) says why).
    type: str
    default: ""
  secrets:
    description: Values no answer may hold (C(holds_secrets)); never logged.
    type: list
    elements: str
    default: []
  secrets_of_unit:
    description:
      - A systemd unit whose engine's secrets no answer may hold either, read from the unit systemd loaded on the
        host (and masked in the module's result, as I(secrets) are); empty, or a unit systemd does not know here,
        adds none. A file the unit names that cannot be read fails the module.
    type: str
    default: ""
  secret_flags:
    description: The engine's flags that carry secrets (the engine roster's C(secret_flags)), for I(secrets_of_unit).
    type: list
    elements: str
    default: []
notes:
  - Standard library only.
author: the blackwell-llm-serving authors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Models, server info and one completion
  engine_requests:
    base_url: http://127.0.0.1:30000
    headers: {Authorization: "Bearer {{ api_key }}"}
    requests:
      - {name: models, path: /v1/models, expect: [200]}
      - {name: server_info, path: /server_info, keep_json: [version]}
      - name: smoke
        path: /v1/chat/completions
        method: POST
        body: {model: kimi, messages: [{role: user, content: "What is 2 + 3?"}], max_tokens: 16}
        timeout: 120
  register: api
  no_log: true
"""

RETURN = r"""
results:
  description: >-
    The answer per request name - status, msg, json, elapsed_s, skipped, url, echoes_credentials (whether the
    body holds the bearer token the request sent), holds_secrets (whether it holds that token or any other secret
    looked for), and the response headers as top-level keys. With I(compile_unit) also compile_wait_s (how long the
    request waited on compilers - from the first compiler progress seen during it to the last; 0 when none) and
    compilers (C(seen), C(first_seen_s) and C(last_progress_s) from the request's start, C(compile_s), C(cpu_s),
    C(processes), C(names), C(extended_s) - how far its bound moved past its own timeout - and C(problem)).
  type: dict
  returned: always
secrets_looked_for:
  description: How many secret values the answers were searched for, besides each request's own token.
  type: int
  returned: always
unit_secrets_found:
  description: >-
    How many of them the unit I(secrets_of_unit) gives its engine besides I(secrets) (with no API key among
    I(secrets): whether the engine holds a key of its own, such as SGLang's admin key).
  type: int
  returned: always
"""

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.engine.progress import Compilers, UnitView
from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import unit_properties
from ansible_collections.blackwell.serving.plugins.module_utils.secrets.redact import secret_forms
from ansible_collections.blackwell.serving.plugins.module_utils.secrets.unit_secrets import (
    UnitSecretsError,
    unit_secrets,
)

# How often a request that waits looks at the unit's compilers: a request fails at most this much after its bound
# (against the 10 % of a smoke timeout of a few seconds).
COMPILER_LOOK_S = 0.25
SYSTEMD_READ_S = 5.0


class CompileWatch:
    """The compilers of a unit's cgroup (progress.Compilers), read while a request waits."""

    def __init__(self, unit: str) -> None:
        self.unit = unit
        self.control_group = ""
        self.problem: str | None = None
        if not unit:
            self.problem = "no compile_unit given"
            return
        # an empty answer where systemd does not run here or does not answer in time
        self.control_group = unit_properties(unit, ("ControlGroup",), timeout=SYSTEMD_READ_S).get("ControlGroup", "")
        if not self.control_group:
            self.problem = f"{unit} has no control group here (it does not run)"

    @property
    def usable(self) -> bool:
        return self.problem is None

    def start(self, now: float) -> Compilers:
        compilers = Compilers(now)
        compilers.sample(now, UnitView(self.control_group), COMPILER_LOOK_S)  # the baseline
        return compilers


def header_keys(headers: Any) -> dict[str, str]:
    return {k.lower().replace("-", "_"): v for k, v in (headers or {}).items()}


def parsed(body: bytes, keep: list[str]) -> Any:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if keep and isinstance(value, dict):
        value = {k: value[k] for k in keep if k in value}
    return value


def exchange(http: urllib.request.Request, timeout: float | None, answer: dict[str, Any]) -> bytes:
    """Send one request; its status, msg and headers into `answer`; the body."""
    try:
        with urllib.request.urlopen(http, timeout=timeout) as response:
            body = response.read()
            answer.update(status=response.status, msg=f"OK ({len(body)} bytes)", **header_keys(response.headers))
    except urllib.error.HTTPError as error:
        body = error.read() if error.fp else b""
        answer.update(status=error.code, msg=f"HTTP Error {error.code}: {error.reason}", **header_keys(error.headers))
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        timed_out = isinstance(reason, (socket.timeout, TimeoutError)) or "timed out" in str(reason)
        body = b""
        answer.update(status=-1, msg=f"Request failed: {'timed out' if timed_out else reason}")
    return body


def exchange_watching_compilers(http: urllib.request.Request, timeout: float, answer: dict[str, Any],
                                watch: CompileWatch) -> bytes:
    """Send one request whose bound is `timeout` from the later of its start and the last compiler progress.

    The request runs in a thread without a socket timeout (a compile inside it sends nothing for minutes); this
    thread looks at the compilers every COMPILER_LOOK_S and gives up when the bound has passed, leaving the
    connection to end with the module."""
    start = time.monotonic()
    compilers = watch.start(start)
    done = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["body"] = exchange(http, None, box.setdefault("answer", {}))
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    bound = start + timeout
    while not done.wait(max(0.0, min(COMPILER_LOOK_S, bound - time.monotonic()))):
        now = time.monotonic()
        view = UnitView(watch.control_group)  # its processes read afresh at each look
        if compilers.sample(now, view, COMPILER_LOOK_S):
            bound = max(bound, now + timeout)
        if now >= bound:
            break
    now = time.monotonic()
    report = compilers.compile_report(start, now)
    first_work = compilers.compile.first_work
    report.update(extended_s=round(max(0.0, bound - (start + timeout)), 3), problem=None)
    answer["compilers"] = report
    answer["compile_wait_s"] = round(compilers.compile.last_progress - first_work, 3) \
        if compilers.compile.last_progress is not None and first_work is not None else 0.0
    if done.is_set():
        answer.update(box["answer"])
        return box.get("body", b"")
    answer.update(status=-1, msg=f"Request failed: timed out ({timeout:g} s after "
                                 f"{'the last compiler progress' if report['extended_s'] else 'its start'})")
    return b""


def send(base_url: str, headers: dict[str, str], request: dict[str, Any], secrets: list[str] | None = None,
         watch: CompileWatch | None = None) -> dict[str, Any]:
    url = base_url.rstrip("/") + request["path"]
    data = None
    send_headers = dict(headers) if request["auth"] else {}
    if request.get("body") is not None:
        data = json.dumps(request["body"]).encode()
        send_headers["Content-Type"] = "application/json"
    http = urllib.request.Request(url, data=data, method=request["method"], headers=send_headers)
    start = time.monotonic()
    answer: dict[str, Any] = {"url": url, "skipped": False}
    if watch is not None and watch.usable:
        body = exchange_watching_compilers(http, request["timeout"], answer, watch)
    else:
        body = exchange(http, request["timeout"], answer)
        if watch is not None:
            answer.update(compile_wait_s=0.0, compilers={"seen": False, "problem": watch.problem})
    answer["elapsed_s"] = round(time.monotonic() - start, 3)
    answer["echoes_credentials"] = echoes_credentials(body, send_headers)
    answer["holds_secrets"] = answer["echoes_credentials"] or holds_secret(body, secrets or [])
    answer["json"] = parsed(body, request["keep_json"]) if body else None
    return answer


def echoes_credentials(body: bytes, sent_headers: dict[str, str]) -> bool:
    """Whether the answer holds the bearer token the request sent, as it is or JSON-escaped (SGLang's /server_info
    returns its api_key unless the release's key guard runs)."""
    scheme, _, token = sent_headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    text = body.decode("utf-8", errors="replace")
    return token in text or json.dumps(token)[1:-1] in text


def holds_secret(body: bytes, secrets: list[str]) -> bool:
    """Whether the answer holds any of the secrets in any form a reply or log carries one (secrets/redact.py)."""
    text = body.decode("utf-8", errors="replace")
    return any(form in text for secret in secrets if secret for form in secret_forms(secret))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "headers": {"type": "dict", "default": {}, "no_log": True},
            "requests": {"type": "list", "elements": "dict", "required": True, "options": {
                "name": {"type": "str", "required": True},
                "path": {"type": "str", "required": True},
                "method": {"type": "str", "default": "GET", "choices": ["GET", "POST"]},
                "body": {"type": "raw"},
                "auth": {"type": "bool", "default": True},
                "timeout": {"type": "float", "default": 30},
                "expect": {"type": "list", "elements": "int", "default": []},
                "keep_json": {"type": "list", "elements": "str", "default": []},
            }},
            "compile_unit": {"type": "str", "default": ""},
            "secrets": {"type": "list", "elements": "str", "default": [], "no_log": True},
            "secrets_of_unit": {"type": "str", "default": "", "no_log": False},
            "secret_flags": {"type": "list", "elements": "str", "default": [], "no_log": False},
        },
        supports_check_mode=True,
    )
    secrets = [secret for secret in module.params["secrets"] if secret]
    try:
        of_unit = [secret for secret in unit_secrets(module.params["secrets_of_unit"], module.params["secret_flags"])
                   if secret not in secrets]
        secrets += of_unit
        module.no_log_values.update(of_unit)  # masked wherever the module's result would show one
    except UnitSecretsError as error:
        module.fail_json(msg=f"cannot read the secrets of {module.params['secrets_of_unit']}, so its answers cannot "
                             f"be searched for them: {error}")
    watch = CompileWatch(module.params["compile_unit"]) if module.params["compile_unit"] else None
    results: dict[str, Any] = {}
    stopped = ""
    for request in module.params["requests"]:
        if stopped:
            results[request["name"]] = {"skipped": True, "status": None, "json": None,
                                        "msg": f"not sent: {stopped} answered unexpectedly"}
            continue
        answer = send(module.params["base_url"], module.params["headers"], request, secrets, watch)
        results[request["name"]] = answer
        if request["expect"] and answer["status"] not in request["expect"]:
            stopped = request["name"]
    module.exit_json(changed=False, results=results, secrets_looked_for=len(set(secrets)),
                     unit_secrets_found=len(set(of_unit)))


if __name__ == "__main__":
    main()
