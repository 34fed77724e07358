"""verify's gate on what the engine publishes and who may reach its admin routes: engine_requests searches every
answer for every secret of the engine (the key it sent, the API key, and the secrets the unit gives the engine, read on
the host: SGLang's admin key lives in its config file), and the no-key probe asks the admin routes whether an API key
is set or not (plugins/filter/route_probes.py)."""

from __future__ import annotations

import base64
import importlib.util
import json
import sys
from pathlib import Path
from typing import ClassVar

import pytest

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "tests"))
from module_utils_loader import load_library_module, load_module_util, run_library_module_file  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "doubles"))
from json_http_double import JsonRoute, serving  # noqa: E402

engine_requests = load_library_module("engine_requests")
unit_secrets = load_module_util("secrets.unit_secrets")
spec = importlib.util.spec_from_file_location("route_probes", REPO / "plugins" / "filter" / "route_probes.py")
route_probes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(route_probes)

API_KEY, ADMIN_KEY = "sk-verify-'q\"Zq7", "admin-verify-Kd3-0123456789"


# --- the answer holds a secret, whatever key was sent ----------------------------------------------------------------
@pytest.mark.parametrize("form", [ADMIN_KEY, json.dumps(ADMIN_KEY)[1:-1], repr(ADMIN_KEY)[1:-1],
                                  base64.b64encode(ADMIN_KEY.encode()).decode()])
def test_an_answer_holding_the_admin_key_in_any_form_holds_a_secret(form: str) -> None:
    body = json.dumps({"port": 30000, "launch_command": f"x {form} y"}).encode()
    assert engine_requests.holds_secret(body, [API_KEY, ADMIN_KEY])
    assert not engine_requests.holds_secret(b'{"api_key": "<redacted>", "admin_api_key": "<redacted>"}',
                                            [API_KEY, ADMIN_KEY])
    assert not engine_requests.holds_secret(body, [])


class ServerInfo(JsonRoute):
    """/server_info as SGLang 0.5.23 alone answers it: its arguments, both keys included, to whoever it serves."""

    echoed: ClassVar[dict] = {}

    def answer(self, body: bytes) -> tuple[int, dict]:
        return 200, {"api_key": self.echoed.get("api_key"), "admin_api_key": self.echoed.get("admin_api_key"),
                     "port": 30000}


@pytest.fixture
def server_info():
    with serving(ServerInfo) as base_url:
        yield base_url, ServerInfo.echoed


@pytest.mark.parametrize(("echoed", "sent", "holds"), [
    ({"api_key": None, "admin_api_key": ADMIN_KEY}, None, True),  # no API key set: the admin key to anyone
    ({"api_key": API_KEY, "admin_api_key": ADMIN_KEY}, API_KEY, True),
    ({"api_key": "<redacted>", "admin_api_key": ADMIN_KEY}, API_KEY, True),  # the API key blanked, the admin key not
    ({"api_key": "<redacted>", "admin_api_key": "<redacted>"}, API_KEY, False),
    ({"api_key": None, "admin_api_key": "<redacted>"}, None, False),
])
def test_the_server_info_check_finds_any_secret_whatever_key_was_sent(server_info, echoed: dict, sent: str | None,
                                                                       holds: bool) -> None:
    base_url, state = server_info
    state.clear()
    state.update(echoed)
    headers = {"Authorization": f"Bearer {sent}"} if sent else {}
    request = {"name": "server_info", "path": "/server_info", "method": "GET", "auth": True, "timeout": 5,
               "keep_json": ["port"]}
    answer = engine_requests.send(base_url, headers, request, [secret for secret in (API_KEY, ADMIN_KEY)])
    assert answer["status"] == 200 and answer["holds_secrets"] is holds
    assert answer["json"] == {"port": 30000}


def test_the_module_reports_how_many_secrets_it_looked_for_and_never_their_values(server_info, tmp_path) -> None:
    base_url, state = server_info
    state.clear()
    state.update({"admin_api_key": ADMIN_KEY})
    result = run_library_module_file("engine_requests", tmp_path, {
        "base_url": base_url, "secrets": [ADMIN_KEY, ""], "secrets_of_unit": "", "secret_flags": ["api-key"],
        "requests": [{"name": "server_info", "path": "/server_info"}]})
    assert result["results"]["server_info"]["holds_secrets"] is True
    assert result["secrets_looked_for"] == 1 and result["unit_secrets_found"] == 0
    assert ADMIN_KEY not in json.dumps({k: v for k, v in result.items() if k != "invocation"})


def test_the_unit_secrets_are_looked_for_and_counted(server_info, monkeypatch, capsys) -> None:
    """No API key sent or given: the admin key the unit gives the engine is still found in the answer, and counted
    (verify asks the admin routes without a key when the engine holds one)."""
    from ansible.module_utils.testing import patch_module_args

    base_url, state = server_info
    state.clear()
    state.update({"admin_api_key": ADMIN_KEY})
    seen: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(engine_requests, "unit_secrets", lambda unit, flags: seen.append((unit, flags)) or [ADMIN_KEY])
    args = {"base_url": base_url, "secrets_of_unit": "sglang.service", "secret_flags": ["api-key", "admin-api-key"],
            "requests": [{"name": "server_info", "path": "/server_info"}]}
    with patch_module_args(args), pytest.raises(SystemExit):
        engine_requests.main()
    result = json.loads(capsys.readouterr().out)
    assert seen == [("sglang.service", ["api-key", "admin-api-key"])]
    assert result["results"]["server_info"]["holds_secrets"] is True and result["unit_secrets_found"] == 1
    assert ADMIN_KEY not in json.dumps({k: v for k, v in result.items() if k != "invocation"})


def test_a_unit_whose_files_cannot_be_read_fails_the_module(monkeypatch, capsys) -> None:
    from ansible.module_utils.testing import patch_module_args

    def unreadable(unit: str, flags: list[str]) -> list[str]:
        raise unit_secrets.UnitSecretsError("the unit's config file /x/config.yaml cannot be read")

    monkeypatch.setattr(engine_requests, "unit_secrets", unreadable)
    monkeypatch.setattr(engine_requests, "UnitSecretsError", unit_secrets.UnitSecretsError)
    with patch_module_args({"base_url": "http://127.0.0.1:9", "secrets_of_unit": "sglang.service",
                            "requests": [{"name": "models", "path": "/v1/models"}]}), pytest.raises(SystemExit):
        engine_requests.main()
    result = json.loads(capsys.readouterr().out)
    assert result["failed"] is True and "cannot read the secrets of sglang.service" in result["msg"]


# --- the unit's secrets ---------------------------------------------------------------------------------------------
SGLANG_UNIT = """[Unit]
Description=SGLang
[Service]
User=sglang
Environment="PYTHONPATH=/var/lib/llm-serving/releases/r1" SGLANG_LOGGING_CONFIG_PATH=/x/logging.json
ExecStart=/opt/sglang/envs/e1/bin/sglang serve --config /var/lib/llm-serving/releases/r1/config.yaml
"""
SGLANG_CONFIG = f"""model-path: "/srv/models/kimi"
port: 30000
api-key: {json.dumps(API_KEY)}
admin-api-key: {json.dumps(ADMIN_KEY)}
"""
VLLM_UNIT = """[Service]
LoadCredential=api-key:/var/lib/llm-serving/releases/r2/api-key
ExecStart=/opt/vllm/venv/bin/vllm serve /srv/models/kimi --port 8000 --middleware bws_vllm_auth.RequireApiKey
"""
ENV_FILE_UNIT = """[Service]
EnvironmentFile=/etc/engine/engine.env
EnvironmentFile=-/etc/engine/optional.env
ExecStart=/opt/engine/bin/engine serve --port 8000
"""


def reader(files: dict[str, str]):
    return files.get


def test_the_admin_key_and_the_api_key_come_from_the_config_file_the_unit_names() -> None:
    files = {"/var/lib/llm-serving/releases/r1/config.yaml": SGLANG_CONFIG}
    found = unit_secrets.unit_text_secrets(SGLANG_UNIT, ["api-key", "admin-api-key"], reader(files))
    assert found == sorted([API_KEY, ADMIN_KEY])


def test_the_api_key_is_the_whole_credential_file_the_unit_loads() -> None:
    files = {"/var/lib/llm-serving/releases/r2/api-key": API_KEY}
    assert unit_secrets.unit_text_secrets(VLLM_UNIT, ["api-key"], reader(files)) == [API_KEY]
    files = {"/var/lib/llm-serving/releases/r2/api-key": API_KEY + "\n"}
    assert unit_secrets.unit_text_secrets(VLLM_UNIT, ["api-key"], reader(files)) == [API_KEY]


def test_only_credentials_named_for_a_secret_flag_are_read() -> None:
    unit = ("[Service]\nLoadCredential=tls-cert:/etc/engine/cert.pem\nLoadCredential=admin_api_key:/etc/engine/admin\n"
            "ExecStart=/bin/engine\n")
    files = {"/etc/engine/admin": ADMIN_KEY}
    assert unit_secrets.unit_text_secrets(unit, ["admin-api-key"], reader(files)) == [ADMIN_KEY]


def test_a_secret_credential_that_cannot_be_read_here_is_an_error() -> None:
    """Unread, its key would go unlooked-for: a missing file, and an id systemd finds in its credential stores."""
    with pytest.raises(unit_secrets.UnitSecretsError, match=r"credential api-key \(/var/lib/\S+/r2/api-key\)"):
        unit_secrets.unit_text_secrets(VLLM_UNIT, ["api-key"], reader({}))
    with pytest.raises(unit_secrets.UnitSecretsError, match=r"credential api-key \(api-key\)"):
        unit_secrets.unit_text_secrets("[Service]\nLoadCredential=api-key\n", ["api-key"], reader({}))


def test_the_api_key_comes_from_the_units_environment_files() -> None:
    files = {"/etc/engine/engine.env": f"OTHER=1\nVLLM_API_KEY={API_KEY}\n", "/etc/engine/optional.env": "A_TOKEN=x\n"}
    assert unit_secrets.unit_text_secrets(ENV_FILE_UNIT, ["api-key"], reader(files)) == [API_KEY]


def test_flags_on_the_command_line_count_in_either_spelling() -> None:
    unit = "[Service]\nExecStart=/bin/engine serve --api-key one --admin-api-key=two --port 1\n"
    assert unit_secrets.unit_text_secrets(unit, ["api-key", "admin-api-key"], reader({})) == ["one", "two"]


def test_a_config_file_the_unit_names_but_no_one_can_read_is_an_error() -> None:
    with pytest.raises(unit_secrets.UnitSecretsError, match=r"config\.yaml cannot be read"):
        unit_secrets.unit_text_secrets(SGLANG_UNIT, ["api-key"], reader({}))
    with pytest.raises(unit_secrets.UnitSecretsError, match=r"/etc/engine/engine\.env"):
        unit_secrets.unit_text_secrets(ENV_FILE_UNIT, ["api-key"], reader({}))


def test_no_unit_or_no_systemd_gives_no_secrets() -> None:
    assert unit_secrets.unit_secrets("", ["api-key"]) == []
    assert unit_secrets.unit_secrets("no-such-unit-of-the-tests.service", ["api-key"]) == []


def test_a_null_or_empty_key_is_no_secret() -> None:
    files = {"/var/lib/llm-serving/releases/r1/config.yaml": 'api-key: null\nadmin-api-key: ""\n'}
    assert unit_secrets.unit_text_secrets(SGLANG_UNIT, ["api-key", "admin-api-key"], reader(files)) == []


# --- the no-key probe of the admin routes ---------------------------------------------------------------------------
ADMIN = ["/abort_request", "/update_weights_from_disk", "/pause_generation"]


def test_without_an_api_key_the_admin_routes_of_the_table_are_asked() -> None:
    table = {"status": 200, "json": {"paths": {"/abort_request": {"post": {}}, "/v1/chat/completions": {"post": {}},
                                               "/pause_generation": {"get": {}, "post": {}}}}}
    probes = route_probes.admin_route_probes(table, ADMIN, 30)
    assert [probe["path"] for probe in probes] == ["/abort_request", "/pause_generation"]
    assert all(probe["auth"] is False and probe["method"] == "POST" and probe["body"] == route_probes.PROBE_BODY
               for probe in probes)


def test_without_a_route_table_every_admin_route_is_asked() -> None:
    for table in ({"status": 401}, {}, {"status": 200, "json": {"paths": []}}):
        assert [p["path"] for p in route_probes.admin_route_probes(table, ADMIN, 5)] == sorted(ADMIN)


def test_with_an_api_key_the_admin_routes_join_the_table_and_the_generating_routes() -> None:
    table = {"status": 200, "json": {"paths": {"/v1/chat/completions": {"post": {}}}}}
    probes = route_probes.unauthenticated_route_probes(table, [], ["/generate", *ADMIN], 5)
    assert [p["path"] for p in probes] == sorted(["/generate", "/v1/chat/completions", *ADMIN])


def test_the_sglang_role_lists_its_admin_routes_for_the_probe() -> None:
    """The roster's admin_routes of SGLang (meta/engines.yml), which verify asks (the contract test checks them against
    the real app)."""
    import yaml

    listed = yaml.safe_load((REPO / "meta" / "engines.yml").read_text())["engines"]["sglang"]["admin_routes"]
    assert "/abort_request" in listed and "/update_weights_from_disk" in listed and listed == sorted(set(listed))
    assert not [path for path in listed if "{" in path or path.startswith(("/health", "/ready", "/metrics"))]
