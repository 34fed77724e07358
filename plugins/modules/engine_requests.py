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
    looked for), and the response headers as top-level keys.
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
import time
import urllib.error
import urllib.request
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.secrets.redact import secret_forms
from ansible_collections.blackwell.serving.plugins.module_utils.secrets.unit_secrets import (
    UnitSecretsError,
    unit_secrets,
)


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


def send(base_url: str, headers: dict[str, str], request: dict[str, Any], secrets: list[str] | None = None
         ) -> dict[str, Any]:
    url = base_url.rstrip("/") + request["path"]
    data = None
    send_headers = dict(headers) if request["auth"] else {}
    if request.get("body") is not None:
        data = json.dumps(request["body"]).encode()
        send_headers["Content-Type"] = "application/json"
    http = urllib.request.Request(url, data=data, method=request["method"], headers=send_headers)
    start = time.monotonic()
    answer: dict[str, Any] = {"url": url, "skipped": False}
    try:
        with urllib.request.urlopen(http, timeout=request["timeout"]) as response:
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
    results: dict[str, Any] = {}
    stopped = ""
    for request in module.params["requests"]:
        if stopped:
            results[request["name"]] = {"skipped": True, "status": None, "json": None,
                                        "msg": f"not sent: {stopped} answered unexpectedly"}
            continue
        answer = send(module.params["base_url"], module.params["headers"], request, secrets)
        results[request["name"]] = answer
        if request["expect"] and answer["status"] not in request["expect"]:
            stopped = request["name"]
    module.exit_json(changed=False, results=results, secrets_looked_for=len(set(secrets)),
                     unit_secrets_found=len(set(of_unit)))


if __name__ == "__main__":
    main()
