"""No WebSocket library enters SGLang's locked venv without a guard for it.

SGLang 0.5.23's key middleware passes every scope that is not HTTP (sglang/srt/utils/auth.py add_api_key_middleware:
`if scope["type"] != "http"`), and its app has a WebSocket route, /v1/realtime (srt/entrypoints/http_server.py). uvicorn
serves WebSockets only with a WebSocket library installed (websockets or wsproto: uvicorn/config.py, ws "auto"); the
pinned lock has neither, so today the route is unreachable. The day one enters the lock, every WebSocket route would
serve without a key unless the release's guard plugin (roles/sglang/files/bws_sglang_guard.py) refuses a WebSocket
without it: this test fails then, unless the guard does.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
LOCKS = sorted((REPO / "roles" / "sglang" / "locks").glob("sglang-*.yml"))
WEBSOCKET_LIBRARIES = frozenset({"websockets", "wsproto"})
KEY = "sk-websocket-lock-Zq7"


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def requirement_names(lock: Path) -> set[str]:
    """The normalised project names of the lock's `requirements` (what the host venv installs)."""
    names = set()
    for requirement in yaml.safe_load(lock.read_text(encoding="utf-8"))["requirements"]:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", str(requirement))
        if match:
            names.add(re.sub(r"[-_.]+", "-", match.group(1)).lower())
    return names


def guard_closes_an_unkeyed_websocket() -> bool:
    """Whether the release's guard, as SGLang runs it, closes a WebSocket that lacks the key (with a key set) and a
    cross-origin one (without a key set), and passes one with the key."""
    load(REPO / "roles" / "sglang" / "files" / "bws_sglang_logging.py")
    load(REPO / "roles" / "engine_service" / "files" / "bws_same_origin.py")
    guard = load(REPO / "roles" / "sglang" / "files" / "bws_sglang_guard.py")

    def outcome(api_key: str | None, headers: list[tuple[bytes, bytes]]) -> str:
        sent: list[dict] = []

        async def app(scope, receive, send) -> None:
            sent.append({"type": "passed"})

        async def receive() -> dict:
            return {"type": "websocket.connect"}

        async def send(message: dict) -> None:
            sent.append(message)

        settings = guard.Settings(api_key=api_key, admin_api_key="admin-x", host="127.0.0.1", port=30000)
        middleware = guard.KeylessGuard(app, fastapi_app=type("App", (), {"routes": []})(), settings=lambda: settings)
        scope = {"type": "websocket", "path": "/v1/realtime", "headers": [(b"host", b"127.0.0.1:30000"), *headers]}
        asyncio.run(middleware(scope, receive, send))
        return sent[0]["type"] if sent else "nothing"

    return (outcome(KEY, []) == "websocket.close"
            and outcome(KEY, [(b"authorization", f"Bearer {KEY}".encode())]) == "passed"
            and outcome(None, [(b"origin", b"http://evil.example")]) == "websocket.close")


def unguarded_websocket_libraries(lock: Path, guarded: bool) -> list[str]:
    return [] if guarded else sorted(WEBSOCKET_LIBRARIES & requirement_names(lock))


def test_the_locks_are_read() -> None:
    assert LOCKS, "no SGLang lock under roles/sglang/locks"
    for lock in LOCKS:
        assert {"uvicorn", "fastapi", "starlette", "h11"} <= requirement_names(lock), lock.name


@pytest.mark.parametrize("lock", LOCKS, ids=[lock.name for lock in LOCKS])
def test_no_websocket_library_in_sglangs_lock_without_a_guard_for_it(lock: Path) -> None:
    present = sorted(WEBSOCKET_LIBRARIES & requirement_names(lock))
    unguarded = unguarded_websocket_libraries(lock, guard_closes_an_unkeyed_websocket() if present else False)
    assert unguarded == [], (
        f"{', '.join(unguarded)} entered {lock.name}: uvicorn now serves WebSockets, and SGLang's key middleware "
        "passes every WebSocket scope (sglang/srt/utils/auth.py), so /v1/realtime would serve without the key. The "
        "guard plugin (roles/sglang/files/bws_sglang_guard.py, KeylessGuard) must refuse a WebSocket without the key "
        "first.")


def test_the_rule_fails_a_lock_with_a_websocket_library_and_no_guard(tmp_path: Path) -> None:
    lock = tmp_path / "sglang-9.9.9.yml"
    lock.write_text("requirements:\n  - uvicorn==0.54.0\n  - websockets==15.0\n  - WSProto==1.2.0\n", encoding="utf-8")
    assert unguarded_websocket_libraries(lock, guarded=False) == ["websockets", "wsproto"]
    assert unguarded_websocket_libraries(lock, guarded=True) == []


def test_the_guard_closes_a_websocket_without_the_key() -> None:
    assert guard_closes_an_unkeyed_websocket()
