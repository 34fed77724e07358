"""TEST DOUBLE: a local HTTP server that answers JSON, for the unit tests of modules that call an engine's routes.

``JsonRoute`` is a request handler whose subclasses say what to answer (``answer``: a status and a JSON-able body,
or None never to answer: a hang); ``serving(handler)`` runs one on 127.0.0.1 in a thread for the ``with`` block and
yields its base URL.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonRoute(BaseHTTPRequestHandler):
    """Answers every GET and POST with what ``answer`` returns; logs nothing."""

    def answer(self, body: bytes) -> tuple[int, Any] | None:  # pragma: no cover - subclasses say it
        raise NotImplementedError

    def _reply(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        answered = self.answer(body)
        if answered is None:
            threading.Event().wait()  # never answers: a handler that hangs
        status, document = answered
        payload = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _reply  # noqa: N815 - http.server's names

    def log_message(self, *args: object) -> None:
        return None


@contextlib.contextmanager
def serving(handler: type[JsonRoute]) -> Iterator[str]:
    """Serve `handler` on a free local port for the block; its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
