"""SGLang's abort of what is still in flight (roles/sglang/files/bws_sglang_abort.py, which the sglang role's drain
entry point runs on the host): the unit's `sglang serve --config FILE` (its command line as engine_drain reads it from
the unit file, module_utils/host/unit_file.py), the config's address and admin key, one
POST /abort_request {"abort_all": true}; other units are left to their own stop."""

from __future__ import annotations

import importlib.util
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tests.module_utils_loader import load_module_util

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bws_sglang_abort", REPO / "roles/sglang/files/bws_sglang_abort.py")
abort = importlib.util.module_from_spec(spec)
spec.loader.exec_module(abort)
unit_file = load_module_util("host.unit_file")


@pytest.fixture
def engine():
    """A stand-in for SGLang's HTTP server that records the requests it was sent and answers 200."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": json.loads(body)})
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], seen
    server.shutdown()


def unit(exec_start: str) -> list[str]:
    """The command line engine_drain hands the program: the unit's ExecStart= as the shared unit reader splits it."""
    text = f"[Unit]\nDescription=x\n[Service]\nExecStart={exec_start}\n"
    return unit_file.exec_start_argv(unit_file.service_settings(text))


def test_the_admin_key_of_the_units_config_aborts_everything_in_flight(tmp_path, engine) -> None:
    port, seen = engine
    config = tmp_path / "config.yaml"
    config.write_text(f'---\nhost: "0.0.0.0"\nport: {port}\napi-key: "sk-api"\nadmin-api-key: "adm-1%x"\n')
    said = abort.abort_in_flight("sglang.service", unit(f"/opt/sglang/venv/bin/sglang serve --config {config}"))
    assert said == "aborted them (POST /abort_request abort_all: HTTP 200); the stop follows"
    assert seen == [{"path": "/abort_request", "auth": "Bearer adm-1%x", "body": {"abort_all": True}}]


def test_systemd_escapes_are_undone_and_without_an_admin_key_the_api_key_is_sent(tmp_path, engine) -> None:
    port, seen = engine
    config = tmp_path / "my%config.yaml"
    config.write_text(f'port: {port}\napi-key: "sk-only"\n')
    abort.abort_in_flight("sglang.service",
                          unit(f"/opt/sglang/venv/bin/sglang serve --config {str(config).replace('%', '%%')}"))
    assert seen[0]["auth"] == "Bearer sk-only"


def test_a_unit_that_runs_something_else_is_left_to_its_own_stop() -> None:
    argv = unit("/opt/vllm/venv/bin/vllm serve /models/m --port 8000")
    assert abort.abort_in_flight("x.service", argv) == ("x.service does not run `sglang serve --config`: its own "
                                                            "stop applies")


def test_an_engine_that_does_not_answer_is_said(tmp_path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("host: 127.0.0.1\nport: 1\n")
    argv = unit(f"/v/bin/sglang serve --config {config}")
    assert "POST /abort_request abort_all: not answered" in abort.abort_in_flight("sglang.service", argv)


def test_the_command_line_fails_when_the_units_config_cannot_be_read(tmp_path, capsys) -> None:
    argv = json.dumps(["/v/bin/sglang", "serve", "--config", str(tmp_path / "gone.yaml")])
    assert abort.main(["--unit", "sglang.service", "--exec-start", argv]) == 1
    assert "cannot read what sglang.service runs" in capsys.readouterr().err


@pytest.mark.parametrize(("host", "url"), [("::1", "http://[::1]:30000/abort_request"),
                                           ("", "http://127.0.0.1:30000/abort_request"),
                                           ("10.0.0.5", "http://10.0.0.5:30000/abort_request")])
def test_the_abort_goes_where_sglang_listens(host, url) -> None:
    assert abort.abort_url({"host": host}) == url
