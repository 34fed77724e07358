"""engine_noop (the deploy's fast path) on a scratch host: a finished deploy's stamp, then each kind of drift the
issue names - the deploy's inputs, a file of the release or its unit edited by hand, the venv's or the kernel cache's
stamp, a failed deploy since, a stopped or unhealthy engine, a second engine unit enabled - each one says why the
deploy must take the full path; nothing differs: a no-op, proven in one call."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from tests.module_utils_loader import load_library_module

engine_noop = load_library_module("engine_noop")
from ansible.module_utils.testing import patch_module_args  # noqa: E402

RELEASE = "sglang-7222bd6d61dd"
UNITS = ["sglang.service", "vllm.service"]
BOOT = "llm-serving-boot.service"


class Health(http.server.BaseHTTPRequestHandler):
    code = 200

    def do_GET(self) -> None:
        self.send_response(self.code)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def host(tmp_path):
    """A host as a finished deploy leaves it: state.json, the release, its unit in /etc, the boot unit's files, the
    venv's stamp and a kernel cache stamp; a /health that answers; systemd as a stand-in (all as it should be)."""
    handler = type("H", (Health,), {"code": 200})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state, etc, venv = tmp_path / "state", tmp_path / "etc", tmp_path / "venv"
    release_dir = state / "releases" / RELEASE
    release_dir.mkdir(parents=True)
    etc.mkdir()
    venv.mkdir()
    (state / "state.json").write_text(json.dumps({"current": RELEASE, "previous": None, "status": "serving"}))
    (release_dir / "release.json").write_text(json.dumps({
        "unit": "sglang.service", "venv": str(venv),
        "health_url": f"http://127.0.0.1:{server.server_address[1]}/health"}))
    (release_dir / "config.yaml").write_text("api-key: k\nmem-fraction-static: 0.9\n")
    (release_dir / "sglang.service").write_text("[Service]\nExecStart=/bin/true\n")
    (etc / "sglang.service").write_text("[Service]\nExecStart=/bin/true\n")
    (etc / BOOT).write_text("[Service]\n")
    (venv / "python-env.json").write_text('{"id": "venv"}')
    (tmp_path / "toolchain.json").write_text('{"nvcc": "12.9"}')
    units = {"sglang.service": {"ActiveState": "active", "UnitFileState": "disabled"},
             "vllm.service": {"ActiveState": "inactive", "UnitFileState": "disabled"},
             BOOT: {"ActiveState": "inactive", "UnitFileState": "enabled"}}
    yield {"tmp": tmp_path, "state": state, "etc": etc, "venv": venv, "release_dir": release_dir, "units": units,
           "handler": handler}
    server.shutdown()
    server.server_close()


def run(h, capsys, monkeypatch, **args) -> dict:
    monkeypatch.setattr(engine_noop, "systemctl_here", lambda: "/bin/systemctl")
    monkeypatch.setattr(engine_noop, "show_units", lambda names, *a, **k: {n: h["units"].get(n, {}) for n in names})
    params = {"state_dir": str(h["state"]), "fingerprint": "f" * 64, "units": UNITS, "unit_dir": str(h["etc"]),
              "trial_unit_dir": str(h["tmp"] / "run"), "boot_files": [str(h["etc"] / BOOT)],
              "paths": [str(h["tmp"] / "toolchain.json")], **args}
    with patch_module_args(params), pytest.raises(SystemExit) as exc:
        engine_noop.main()
    out = capsys.readouterr().out
    assert exc.value.code == 0, out
    return json.loads(out)


def recorded(h, capsys, monkeypatch) -> None:
    result = run(h, capsys, monkeypatch, action="record")
    assert result["changed"] is True and result["release_id"] == RELEASE
    stamp = h["state"] / "deployed.json"
    assert oct(stamp.stat().st_mode & 0o777) == "0o600"
    assert "api-key: k" not in stamp.read_text() and str(h["release_dir"] / "config.yaml") in stamp.read_text()
    assert run(h, capsys, monkeypatch, action="record")["changed"] is False, "the same stamp again changes nothing"


def test_a_host_that_serves_exactly_the_deploy_is_a_noop_in_one_call(host, capsys, monkeypatch):
    recorded(host, capsys, monkeypatch)
    result = run(host, capsys, monkeypatch)
    assert result["noop"] is True and result["drift"] == [] and result["changed"] is False
    assert result["release_id"] == RELEASE and isinstance(result["health_ms"], int)


def test_without_a_stamp_the_deploy_takes_the_full_path(host, capsys, monkeypatch):
    result = run(host, capsys, monkeypatch)
    assert result["noop"] is False and result["drift"] == ["no deploy stamp (no deploy of this version finished here)"]


DRIFTS = {
    "another input": (lambda h: None, {"fingerprint": "0" * 64}, "the deploy's inputs differ from the last one's"),
    "config edited": (lambda h: (h["release_dir"] / "config.yaml").write_text("mem-fraction-static: 0.5\n"), {},
                      "config.yaml changed"),
    "unit edited in /etc": (lambda h: (h["etc"] / "sglang.service").write_text("[Service]\nUser=root\n"), {},
                            "etc/sglang.service changed"),
    "venv stamp": (lambda h: (h["venv"] / "python-env.json").write_text('{"id": "other"}'), {},
                   "venv/python-env.json changed"),
    "kernel cache stamp gone": (lambda h: (h["tmp"] / "toolchain.json").unlink(), {}, "toolchain.json is gone"),
    "a failed deploy since": (lambda h: (h["state"] / "state.json").write_text(json.dumps(
        {"current": RELEASE, "previous": None, "status": "serving", "failed": "sglang-000000000bad"})), {},
        "a deploy of sglang-000000000bad failed since"),
    "teardown": (lambda h: (h["state"] / "state.json").write_text(json.dumps(
        {"current": RELEASE, "previous": None, "status": "stopped"})), {}, f"state.json says stopped {RELEASE}"),
    "engine stopped": (lambda h: h["units"]["sglang.service"].update(ActiveState="inactive"), {},
                       "sglang.service is inactive, not active"),
    "another engine enabled": (lambda h: h["units"]["vllm.service"].update(UnitFileState="enabled"), {},
                               "vllm.service is enabled"),
    "boot unit disabled": (lambda h: h["units"][BOOT].update(UnitFileState="disabled"), {},
                           f"{BOOT} is not enabled"),
    "on trial": (lambda h: ((h["tmp"] / "run").mkdir(), (h["tmp"] / "run" / "sglang.service").write_text("")), {},
                 "sglang.service runs on trial"),
    "unhealthy": (lambda h: setattr(h["handler"], "code", 503), {}, "/health) answered 503"),
}


@pytest.mark.parametrize("case", list(DRIFTS))
def test_each_drift_sends_the_deploy_down_the_full_path_and_says_why(host, capsys, monkeypatch, case):
    recorded(host, capsys, monkeypatch)
    drift, args, said = DRIFTS[case]
    drift(host)
    result = run(host, capsys, monkeypatch, **args)
    assert result["noop"] is False and result["changed"] is False
    assert any(said in line for line in result["drift"]), result["drift"]


def test_record_refuses_when_no_release_serves(host, capsys, monkeypatch):
    (host["state"] / "state.json").write_text(json.dumps({"current": RELEASE, "status": "switching"}))
    monkeypatch.setattr(engine_noop, "systemctl_here", lambda: None)
    params = {"state_dir": str(host["state"]), "fingerprint": "f", "units": UNITS, "action": "record"}
    with patch_module_args(params), pytest.raises(SystemExit) as exc:
        engine_noop.main()
    out = json.loads(capsys.readouterr().out)
    assert exc.value.code == 1 and "cannot record the deploy: state.json does not say a release serves" in out["msg"]
    assert not (host["state"] / "deployed.json").exists()

