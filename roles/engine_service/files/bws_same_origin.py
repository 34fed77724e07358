"""Who may drive an engine that has no API key: requests named for the engine itself, from its own origin.

An engine without a key (the roles allow that on loopback only) serves every route to whoever reaches its port. A web
page in a browser on the same machine reaches it too: by DNS rebinding (a name of the page's that resolves to
127.0.0.1, so the request's `Host` is the page's name) or across origins (the page's `Origin`, which the engines'
CORS settings answer: SGLang 0.5.23 reflects every origin with credentials, `srt/entrypoints/http_server.py`; vLLM
0.33.0 allows `*` without credentials, `entrypoints/serve/middleware/register.py`). A request is the engine's own
when its `Host` is a loopback name or the listen address (bare or with the listen port) and it has no `Origin` or the
engine's own (http(s), one of those names, the listen port). Both engines' keyless guards decide with these rules:
SGLang's plugin (roles/sglang/files/bws_sglang_guard.py, KeylessGuard) and vLLM's middleware
(roles/vllm/files/bws_vllm_auth.py, SameOriginOnly).

Installed by the engine roles in the release directory (on the unit's PYTHONPATH); the standard library only.
"""

from __future__ import annotations

import json
import urllib.parse

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header's name (lower case, IPv6 without brackets) and port; None when it is not one."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    elif value.count(":") == 1:
        name, _, port_text = value.partition(":")
    else:
        name, port_text = value, None  # a bare name, or a bare IPv6 address
    if port_text is None:
        return (name, None) if name else None
    if not port_text.isdigit():
        return None
    return (name, int(port_text)) if name else None


def allowed_names(listen_host: str) -> frozenset[str]:
    """The loopback names and the listen address (lower case, IPv6 without brackets)."""
    return LOOPBACK_NAMES | ({listen_host.strip("[]").lower()} if listen_host else set())


def host_allowed(value: str | None, listen_host: str, port: int) -> bool:
    """A loopback name or the listen address, bare or with the listen port. No Host at all (HTTP/1.0) is no
    browser's request and passes."""
    if value is None:
        return True
    split = split_host(value)
    return split is not None and split[0] in allowed_names(listen_host) and split[1] in (None, port)


def origin_allowed(value: str, listen_host: str, port: int) -> bool:
    """The engine's own origin: http(s), a loopback name or the listen address, the listen port. `null` (a sandboxed
    or file page) and every other origin are foreign."""
    try:
        origin = urllib.parse.urlsplit(value.strip())
        origin_port = origin.port or {"http": 80, "https": 443}.get(origin.scheme)
    except ValueError:
        return False
    return (origin.scheme in ("http", "https") and (origin.hostname or "") in allowed_names(listen_host)
            and origin_port == port)


def same_origin(headers: dict[str, str], listen_host: str, port: int) -> bool:
    """Whether a request (its headers, names in lower case) is the engine's own: its Host allowed and, when it has an
    Origin, that origin the engine's."""
    return host_allowed(headers.get("host"), listen_host, port) and (
        "origin" not in headers or origin_allowed(headers["origin"], listen_host, port))


async def refuse(scope: dict, receive, send, status: int, content: dict) -> None:
    """Answer an ASGI request the guard refuses: an HTTP request with `status` and `content` as JSON, a WebSocket
    handshake by closing it before accepting it (which the server answers 403), with code 1008 (policy)."""
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
