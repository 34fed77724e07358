"""engine_status (status.yml) on a scratch release tree: a state dir with releases, state.json good, truncated,
missing or naming a release that is not there, a local /health that answers 200, 503 or too late, no nvidia-smi or a
replaying one, and systemd as a stand-in answers. The result says what serves, never a secret, never `changed`."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.module_utils_loader import load_library_module, load_module_util

engine_status = load_library_module("engine_status")
status_util = load_module_util("release.status")
from ansible.module_utils.testing import patch_module_args  # noqa: E402

SECRET = "sk-never-in-the-result-4711"
UNITS = ["sglang.service", "vllm.service"]


class Health(http.server.BaseHTTPRequestHandler):
    """/health answers `code` after `delay_s`; any other path 404."""

    code = 200
    delay_s = 0.0

    def do_GET(self) -> None:
        time.sleep(self.delay_s)
        self.send_response(self.code if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def health():
    """A local engine front end: yields a function that sets its answer and returns its health URL."""
    handler = type("H", (Health,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def answer(code: int = 200, delay_s: float = 0.0) -> str:
        handler.code, handler.delay_s = code, delay_s
        return f"http://127.0.0.1:{server.server_address[1]}/health"

    yield answer
    server.shutdown()
    server.server_close()


def release(state_dir: Path, release_id: str, health_url: str = "http://127.0.0.1:9/health", mtime: float = 0,
            **fields) -> Path:
    """A release directory as a deploy writes it: release.json (with a command line that holds a key, as a careless
    one could), config.yaml and an environment file with the key."""
    directory = state_dir / "releases" / release_id
    directory.mkdir(parents=True)
    metadata = {"id": release_id, "engine": "sglang", "engine_version": "0.5.23", "profile": "kimi",
                "unit": "sglang.service", "port": 30000, "health_url": health_url,
                "exec_start": ["/opt/sglang/bin/python", "-m", "sglang.launch_server", "--api-key", SECRET], **fields}
    (directory / "release.json").write_text(json.dumps(metadata, indent=4) + "\n")
    (directory / "config.yaml").write_text(f"api-key: {SECRET}\nadmin-api-key: {SECRET}\n")
    (directory / "engine.env").write_text(f"SGLANG_API_KEY={SECRET}\nHF_TOKEN={SECRET}\n")
    if mtime:
        os.utime(directory, (mtime, mtime))
    return directory


def write_state(state_dir: Path, text: str) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "state.json").write_text(text)


def serving_host(state_dir: Path, health_url: str) -> None:
    release(state_dir, "sglang-old000000001", created="2026-11-30T09:00:00Z", mtime=1_000_000)
    release(state_dir, "sglang-7222bd6d61dd", health_url, created="2026-12-04T18:31:07Z", mtime=2_000_000)
    # A release written before `created` was recorded.
    release(state_dir, "vllm-0b1c2d3e4f5a", engine="vllm", engine_version="0.33.0", mtime=500_000)
    write_state(state_dir, json.dumps({"current": "sglang-7222bd6d61dd", "previous": "sglang-old000000001",
                                       "status": "serving", "failed": "sglang-f00"}, indent=4))


def run(capsys, monkeypatch, state_dir: Path, check_mode: bool = False, units: dict | None = None,
        **args) -> dict:
    """main() in this process; systemd absent unless `units` (the `systemctl show` answer by unit) is given."""
    if units is None:
        monkeypatch.setattr(engine_status, "systemctl_here", lambda: None)
    else:
        monkeypatch.setattr(engine_status, "systemctl_here", lambda: "/bin/systemctl")
        monkeypatch.setattr(engine_status, "show_units", lambda names, *a, **k: {n: units.get(n, {
            "LoadState": "not-found", "ActiveState": "inactive", "UnitFileState": ""}) for n in names})
    params = {"state_dir": str(state_dir), "units": UNITS, "nvidia_smi": str(state_dir / "no-nvidia-smi"),
              "_ansible_check_mode": check_mode, **args}
    with patch_module_args(params), pytest.raises(SystemExit) as exc:
        engine_status.main()
    out = capsys.readouterr().out
    assert exc.value.code == 0, out
    return json.loads(out)


def test_a_serving_host_says_engine_release_version_profile_created_health_and_rollback(tmp_path, health,
                                                                                        capsys, monkeypatch):
    state_dir = tmp_path / "llm-serving"
    serving_host(state_dir, health(200))
    result = run(capsys, monkeypatch, state_dir)
    assert result["changed"] is False and result["ok"] is True and result["reason"] == ""
    assert (result["state"], result["release_id"], result["engine"], result["engine_version"], result["profile"]) == (
        "serving", "sglang-7222bd6d61dd", "sglang", "0.5.23", "kimi")
    assert result["created"] == "2026-12-04T18:31:07Z"
    assert result["serving_since"] == "unknown", "no systemd here: the unit's start is not known"
    assert result["rollback"] == "sglang-old000000001" and result["failed_release"] == "sglang-f00"
    # Ansible reads a truthy `failed` in a module's result as the task's own failure: a failed release is not one.
    assert not result.get("failed")
    assert result["health"]["status"] == 200 and isinstance(result["health"]["latency_ms"], int)
    assert 0 <= result["health"]["latency_ms"] < 3000
    assert result["gpus"]["available"] is False and "nvidia-smi not found" in result["gpus"]["reason"]
    # Newest first; the old release has no recorded creation time.
    assert [(r["id"], r["created"], r["current"], r["previous"]) for r in result["releases"]] == [
        ("sglang-7222bd6d61dd", "2026-12-04T18:31:07Z", True, False),
        ("sglang-old000000001", "2026-11-30T09:00:00Z", False, True),
        ("vllm-0b1c2d3e4f5a", "unknown", False, False)]
    assert result["problems"] == []
    assert result["summary"].startswith("sglang sglang-7222bd6d61dd serving, /health 200 in ")
    assert result["summary"].endswith("rollback → sglang-old000000001")


def test_no_key_token_or_password_of_a_release_reaches_the_result(tmp_path, health, capsys, monkeypatch):
    state_dir = tmp_path / "llm-serving"
    serving_host(state_dir, health(200))
    result = run(capsys, monkeypatch, state_dir)
    text = json.dumps(result)
    assert SECRET not in text
    assert "exec_start" not in text and "config.yaml" not in text and "engine.env" not in text


def test_a_truncated_state_json_is_reported_not_raised(tmp_path, capsys, monkeypatch):
    state_dir = tmp_path / "llm-serving"
    release(state_dir, "sglang-7222bd6d61dd")
    write_state(state_dir, '{\n    "current": "sglang-7222bd6d61dd",\n    "prev')
    result = run(capsys, monkeypatch, state_dir)
    assert result["changed"] is False and result["ok"] is False and result["state"] == "unknown"
    assert result["reason"].startswith("state.json is not valid JSON: "), result["reason"]
    assert "half-written" in result["reason"] and result["problems"] == [result["reason"]]
    assert result["summary"] == f"state unreadable: {result['reason']}"
    # What is on disk is still said.
    assert [r["id"] for r in result["releases"]] == ["sglang-7222bd6d61dd"]


def test_a_state_json_that_names_a_release_without_release_json_is_broken(tmp_path, capsys, monkeypatch):
    state_dir = tmp_path / "llm-serving"
    (state_dir / "releases" / "sglang-half").mkdir(parents=True)
    write_state(state_dir, json.dumps({"current": "sglang-half", "previous": None, "status": "serving"}))
    result = run(capsys, monkeypatch, state_dir)
    assert result["ok"] is False
    assert result["reason"] == ("state.json names sglang-half as current, but its release.json is missing "
                                "(the release directory is gone or half-written)")
    assert result["releases"][0]["incomplete"] == "no release.json (incomplete)"


def test_an_unknown_status_is_broken_too(tmp_path, capsys, monkeypatch):
    state_dir = tmp_path / "llm-serving"
    write_state(state_dir, json.dumps({"current": "a", "status": "weird"}))
    result = run(capsys, monkeypatch, state_dir)
    assert result["ok"] is False and "unknown status 'weird'" in result["reason"]


def test_a_host_where_nothing_was_deployed(tmp_path, capsys, monkeypatch):
    result = run(capsys, monkeypatch, tmp_path / "nothing-here")
    assert result["ok"] is True and result["state"] == "none" and result["release_id"] is None
    assert result["releases"] == [] and result["rollback"] is None
    assert result["problems"] == ["nothing was deployed here (no state.json)"]
    assert result["summary"] == "nothing deployed (no state.json)"


def test_a_health_answer_other_than_200_and_no_answer_are_problems(tmp_path, health, capsys, monkeypatch):
    state_dir = tmp_path / "llm-serving"
    serving_host(state_dir, health(503))
    result = run(capsys, monkeypatch, state_dir)
    assert result["health"]["status"] == 503 and result["problems"] == ["/health answered 503"]
    assert "/health 503 in " in result["summary"]

    (state_dir / "releases" / "sglang-7222bd6d61dd" / "release.json").write_text(json.dumps(
        {"id": "sglang-7222bd6d61dd", "engine": "sglang", "unit": "sglang.service",
         "health_url": "http://127.0.0.1:9/health"}))
    result = run(capsys, monkeypatch, state_dir)
    assert result["health"]["status"] is None and result["health"]["latency_ms"] is None
    assert result["health"]["error"].startswith("no answer ("), result["health"]
    assert result["problems"] == [f"/health {result['health']['error']}"]


def test_a_slow_health_is_cut_at_its_timeout(tmp_path, health, capsys, monkeypatch):
    state_dir = tmp_path / "llm-serving"
    serving_host(state_dir, health(200, delay_s=2.0))
    result = run(capsys, monkeypatch, state_dir, health_timeout_s=0.3)
    assert result["health"]["status"] is None and result["health"]["error"] == "no answer within 0.3 s"
    assert result["health"]["latency_ms"] is None and result["problems"] == ["/health no answer within 0.3 s"]


def test_check_mode_reads_the_same_and_writes_nothing(tmp_path, health, capsys, monkeypatch):
    state_dir = tmp_path / "llm-serving"
    serving_host(state_dir, health(200))
    before = {p: (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else b"") for p in state_dir.rglob("*")}
    checked = run(capsys, monkeypatch, state_dir, check_mode=True)
    after = {p: (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else b"") for p in state_dir.rglob("*")}
    assert before == after
    assert checked["changed"] is False and checked["state"] == "serving" and checked["health"]["status"] == 200


def test_the_unit_says_since_when_it_serves_what_boots_and_what_else_runs(tmp_path, health, capsys, monkeypatch):
    state_dir = tmp_path / "llm-serving"
    serving_host(state_dir, health(200))
    # The module's clock is injected: now is 2026-12-04T18:40:00Z at monotonic 5000 s; the unit became active an hour
    # before, at monotonic 1400 s (systemd's ActiveEnterTimestampMonotonic, in microseconds).
    now, now_monotonic = datetime(2026, 12, 4, 18, 40, tzinfo=timezone.utc).timestamp(), 5000.0
    to_utc = status_util.monotonic_to_utc
    monkeypatch.setattr(status_util, "monotonic_to_utc",
                        lambda usec: to_utc(usec, now=now, now_monotonic=now_monotonic))
    monotonic_usec = str(int((now_monotonic - 3600) * 1e6))
    units = {"sglang.service": {"LoadState": "loaded", "ActiveState": "active", "SubState": "running",
                                "UnitFileState": "disabled", "ActiveEnterTimestampMonotonic": monotonic_usec},
             "vllm.service": {"LoadState": "loaded", "ActiveState": "inactive", "UnitFileState": "disabled"},
             "llm-serving-boot.service": {"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled"}}
    result = run(capsys, monkeypatch, state_dir, units=units)
    assert result["serving_since"] == "2026-12-04T17:40:00Z", result["serving_since"]
    assert result["unit"]["active_since"] == "2026-12-04T17:40:00Z", result["unit"]
    assert result["unit"]["active_state"] == "active"
    assert result["boot"] == {"unit": "llm-serving-boot.service", "enabled": True, "unit_file_state": "enabled",
                              "release": "sglang-7222bd6d61dd", "engine_unit": "sglang.service"}
    assert result["problems"] == []
    assert f" serving since {result['serving_since'][:16]}Z, /health 200 in " in result["summary"]

    # A host deployed before the boot unit existed (its engine unit enabled), another engine running.
    units["llm-serving-boot.service"].update(UnitFileState="disabled")
    units["sglang.service"].update(UnitFileState="enabled")
    units["vllm.service"].update(ActiveState="active")
    result = run(capsys, monkeypatch, state_dir, units=units)
    assert result["problems"] == [
        "llm-serving-boot.service is not enabled (disabled): a reboot starts sglang.service (enabled by a deploy "
        "before the boot unit existed), whatever state.json names; re-run the deploy",
        "vllm.service is active too, but the current release runs sglang.service"]
    assert result["summary"].endswith("; PROBLEMS: " + "; ".join(result["problems"]))
    # The boot unit and an engine unit enabled by hand beside it: two things would start at boot.
    units["llm-serving-boot.service"].update(UnitFileState="enabled")
    units["vllm.service"].update(ActiveState="inactive")
    assert run(capsys, monkeypatch, state_dir, units=units)["problems"] == [
        "sglang.service is enabled: a reboot would start it besides the release state.json names (re-run the "
        "deploy; it disables it)"]
    # Neither: nothing would start.
    units["llm-serving-boot.service"].update(UnitFileState="")
    units["sglang.service"].update(UnitFileState="disabled")
    assert run(capsys, monkeypatch, state_dir, units=units)["problems"] == [
        "llm-serving-boot.service is not enabled (not installed): a reboot starts no engine"]

    units["sglang.service"].update(ActiveState="failed", UnitFileState="disabled")
    units["vllm.service"].update(ActiveState="inactive")
    result = run(capsys, monkeypatch, state_dir, units=units)
    assert result["serving_since"] == "unknown" and result["problems"][0] == "sglang.service is failed, not active"


def test_a_deploy_that_did_not_finish_says_what_served_last(tmp_path, health, capsys, monkeypatch):
    state_dir = tmp_path / "llm-serving"
    serving_host(state_dir, health(200))
    write_state(state_dir, json.dumps({"current": "sglang-7222bd6d61dd", "previous": "sglang-old000000001",
                                       "status": "switching"}))
    result = run(capsys, monkeypatch, state_dir)
    assert result["ok"] is True and result["state"] == "switching"
    assert result["problems"] == ["the deploy of sglang-7222bd6d61dd did not finish (state.json says switching; the "
                                  "last release that served is sglang-old000000001): re-run that deploy"]


def test_a_rollback_target_that_is_gone_is_a_problem(tmp_path, health, capsys, monkeypatch):
    state_dir = tmp_path / "llm-serving"
    release(state_dir, "sglang-new", health(200))
    write_state(state_dir, json.dumps({"current": "sglang-new", "previous": "sglang-pruned", "status": "serving"}))
    result = run(capsys, monkeypatch, state_dir)
    assert result["problems"] == ["the rollback target sglang-pruned is not on disk"]


def replaying_nvidia_smi(tmp_path: Path, apps_csv: str) -> Path:
    gpu_csv = tmp_path / "gpus.csv"
    gpu_csv.write_text("0, GPU-aaaa, NVIDIA H200, 00000000:00:06.0, 580.159.04, 9.0, 13114, 143771, 0, Enabled\n"
                       "1, GPU-bbbb, NVIDIA H200, 00000000:00:07.0, 580.159.04, 9.0, 9, 143771, 0, Enabled\n")
    (tmp_path / "apps.csv").write_text(apps_csv)
    script = tmp_path / "nvidia-smi"
    script.write_text(f'#!/bin/sh\ncase "$1" in --query-gpu=*) cat "{gpu_csv}";; --query-compute-apps=*) '
                      f'cat "{tmp_path / "apps.csv"}";; *) exit 2;; esac\n')
    script.chmod(0o755)
    return script


def test_a_foreign_gpu_holder_is_named_by_pid_user_and_title_never_its_arguments(tmp_path, health, capsys,
                                                                                   monkeypatch):
    state_dir = tmp_path / "llm-serving"
    serving_host(state_dir, health(200))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--api-key", SECRET])
    try:
        smi = replaying_nvidia_smi(tmp_path, f"{holder.pid}, {sys.executable}, 13105, GPU-aaaa, 00000000:00:06.0\n")
        result = run(capsys, monkeypatch, state_dir, nvidia_smi=str(smi))
    finally:
        holder.kill()
        holder.wait()
    gpus = result["gpus"]
    assert gpus["available"] is True and gpus["count"] == 2 and gpus["engine_memory_mib"] == 0
    (foreign,) = gpus["foreign"]
    assert foreign["pid"] == holder.pid and foreign["gpus"] == [0] and foreign["used_mib"] == 13105
    assert foreign["title"] == os.path.basename(sys.executable) and "uid" in foreign["user"]
    assert set(foreign) == {"pid", "user", "title", "gpus", "used_mib"}
    assert SECRET not in json.dumps(result)
    assert result["problems"] == [f"pid {holder.pid} ({foreign['user']}, {foreign['title']}) holds 13105 MiB on "
                                  "GPU(s) 0: not the engine's"]
    assert ", 2 GPUs (0 MiB held by the engine), " in result["summary"]


def test_the_engine_units_processes_are_counted_as_the_engines():
    gpus = [{"index": 0, "uuid": "GPU-a", "bus_id": "0000:00:06.0", "name": "H200", "memory_used_mib": 90000,
             "memory_total_mib": 143771},
            {"index": 1, "uuid": "GPU-b", "bus_id": "0000:00:07.0", "name": "H200", "memory_used_mib": 80000,
             "memory_total_mib": 143771}]
    apps = [{"pid": 10, "name": "sglang::scheduler_TP0", "used_mib": 86000, "gpu_uuid": "GPU-a", "bus_id": None},
            {"pid": 11, "name": "sglang::scheduler_TP1", "used_mib": 80000, "gpu_uuid": None, "bus_id": "0000:00:07.0"},
            {"pid": 99, "name": "python3", "used_mib": 4000, "gpu_uuid": "GPU-a", "bus_id": None},
            {"pid": 99, "name": "python3", "used_mib": 10, "gpu_uuid": "GPU-b", "bus_id": None}]
    seen = []

    def describe(pid, name):
        seen.append(pid)
        return {"pid": pid, "user": "alice (uid 1000)", "title": name}

    view = status_util.gpu_view(gpus, apps, {10, 11}, describe)
    assert view["count"] == 2 and view["engine_memory_mib"] == 166000
    assert [g["engine_mib"] for g in view["gpus"]] == [86000, 80000]
    assert view["foreign"] == [{"pid": 99, "user": "alice (uid 1000)", "title": "python3", "gpus": [0, 1],
                                "used_mib": 4010}]
    assert seen == [99], "the engine's own processes are not looked up"


def test_a_process_not_visible_here_is_named_by_nvidia_smis_name_cut_to_a_title():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert engine_status.describe_process(gone.pid, "/opt/x/bin/serve --token abc") == {
        "pid": gone.pid, "user": "unknown", "title": "/opt/x/bin/serve"}


def test_monotonic_times_become_utc():
    assert status_util.monotonic_to_utc("0") is None and status_util.monotonic_to_utc("n/a") is None
    # Active since monotonic 100 s; now is monotonic 1100 s at 2026-12-04T18:40:00Z.
    now = datetime(2026, 12, 4, 18, 40, tzinfo=timezone.utc).timestamp()
    assert status_util.monotonic_to_utc("100000000", now=now, now_monotonic=1100.0) == "2026-12-04T18:23:20Z"


def test_the_last_verdict_the_host_recorded_is_said_with_its_time_and_only_for_the_release_it_judged(
        tmp_path, health, capsys, monkeypatch):
    state_dir = tmp_path / "llm-serving"
    serving_host(state_dir, health(200))
    assert run(capsys, monkeypatch, state_dir)["verdict"] is None
    verdict = state_dir / "verdict.json"
    verdict.write_text(json.dumps({"release": "sglang-7222bd6d61dd", "kind": "verify", "mode": "full", "passed": True,
                                   "speedup": 1.83, "failures": []}))
    os.utime(verdict, (1_764_873_600, 1_764_873_600))  # 2025-12-04T18:40:00Z
    result = run(capsys, monkeypatch, state_dir)
    assert result["verdict"] == {"release": "sglang-7222bd6d61dd", "kind": "verify", "mode": "full", "passed": True,
                                 "speedup": 1.83, "failures": [], "recorded": "2025-12-04T18:40:00Z"}
    assert "last verify (full) passed, speed-up 1.83x 2025-12-04T18:40Z" in result["summary"]
    # A verdict on another release (the one before a switch) is reported, not said in the line.
    verdict.write_text(json.dumps({"release": "sglang-old000000001", "kind": "gate", "mode": "smoke", "passed": True}))
    result = run(capsys, monkeypatch, state_dir)
    assert result["verdict"]["release"] == "sglang-old000000001" and "last gate" not in result["summary"]
    verdict.write_text("{half")
    assert run(capsys, monkeypatch, state_dir)["verdict"] is None
