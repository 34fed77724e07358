"""plugins/modules/engine_wait.py: bounds kept whatever the endpoint does, stalls caught.

Against real local HTTP servers (a /health that never answers, one that answers 503 slowly as SGLang does when its
generation is stuck) in real time, the tests assert outcomes only. Where the instant is the point (a stall declared
after exactly stall_timeout_s of silence, a wait that ends at its deadline), the module runs on a virtual clock
(VirtualTime): its time.monotonic() and time.sleep(), progress.py's clock and a health double that answers in
virtual time; the fake counters grow as that clock moves. systemd is not running here, so the unit's state and
journal are given by replacing the two readers the module uses; the journal lines are the ones the engines write.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

REPO = Path(__file__).resolve().parents[4]
from tests.module_utils_loader import use_repository_module_utils  # noqa: E402

use_repository_module_utils()
sys.path.insert(0, str(REPO / "plugins" / "modules"))

import engine_wait  # noqa: E402
from ansible.module_utils.testing import patch_module_args  # noqa: E402
from ansible_collections.blackwell.serving.plugins.module_utils.engine import progress as bws_progress  # noqa: E402

RUNNING = {"ActiveState": "active", "SubState": "running", "Result": "success", "NRestarts": "0",
           "MainPID": "4242", "ExecMainStatus": "0"}
# What the engines write for each of our probes: uvicorn's access line and SGLang's failed health check.
PROBE_ECHOES = [
    'INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 503 Service Unavailable',
    "[2026-01-01 10:00:20] Health check failed. Server couldn't get a response from detokenizer for last "
    "20 seconds. tic start time: 10:00:00. last_heartbeat time: 09:58:01",
]


def serve(behaviour: str, seconds: float = 0.0) -> tuple[ThreadingHTTPServer, str]:
    """A local /health: `hang` never answers, `slow503` answers 503 after `seconds`, `ok` answers 200."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_GET(self) -> None:
            if behaviour == "hang":
                time.sleep(3600)
            time.sleep(seconds)
            self.send_response(200 if behaviour == "ok" else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/health"


@pytest.fixture
def endpoint(request) -> Iterator[str]:
    server, url = serve(*request.param)
    yield url
    server.shutdown()


VIRTUAL_URL = "http://127.0.0.1:9/health"  # never dialled: VirtualTime.probe_response answers for it
STEPS_PER_S = 8  # the doubles' counters grow 8 times a virtual second (dyadic instants: exact sums)


class VirtualTime:
    """`time` as engine_wait and progress.py see it: monotonic() is virtual time, moved only by sleep() and by the
    health double's answers; the doubles that grow with time (`on_advance`) are written as it moves, in the
    module's own thread. So each instant the module computes is exact, however loaded the machine is."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.latency: float | None = 0.0  # the health double's answer time; None: it never answers
        self.on_advance: list = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        self.now += seconds
        for callback in self.on_advance:
            callback(self.now)

    def probe_response(self, url: str, timeout: float) -> tuple[str, dict[str, str]]:
        """The health double: a 503 after `latency`, or no answer (a socket timeout) once the request's timeout
        has passed."""
        if self.latency is None or self.latency >= timeout:
            self.sleep(timeout)
            return "no answer (timed out)", {}
        self.sleep(self.latency)
        return "503", {}

    def grown(self, begin: float, end: float) -> int:
        """Steps a counter that grows from `begin` until `end` has taken by now."""
        return round((min(self.now, end) - begin) * STEPS_PER_S)


@pytest.fixture
def clock(monkeypatch) -> VirtualTime:
    virtual = VirtualTime()
    monkeypatch.setattr(engine_wait, "time", virtual)
    monkeypatch.setattr(bws_progress, "time", virtual)
    monkeypatch.setattr(engine_wait, "probe_response", virtual.probe_response)
    return virtual


class FakeJournal(engine_wait.JournalProgress):
    """The module's journal reader with journalctl's answers scripted: one batch of lines per poll."""

    batches: ClassVar[list[list[str]]] = []

    def __init__(self, unit: str, ignore: list[str], start: float) -> None:
        self.script = []  # the module's look at where the journal ends (where journalctl exists) takes no batch
        super().__init__(unit, ignore, start)
        self.script = list(type(self).batches)
        self.available = True

    def _read(self, selection: list[str]) -> list[str]:
        return self.script.pop(0) if self.script else []


@pytest.fixture
def systemd(monkeypatch):
    """A running unit whose journal shows what FakeJournal.batches says."""
    monkeypatch.setattr(engine_wait, "unit_properties", lambda *_a, **_k: dict(RUNNING))
    monkeypatch.setattr(engine_wait, "journal_tail", lambda unit, lines, timeout=None: [f"tail of {unit}"])
    monkeypatch.setattr(engine_wait, "JournalProgress", FakeJournal)
    return FakeJournal


def run(capsys, **args) -> tuple[int, dict]:
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        engine_wait.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("endpoint", [("hang",)], indirect=True)
def test_a_hung_health_gets_one_request_capped_by_the_time_left(endpoint, capsys):
    """A real socket that never answers: the one request's 30 s timeout is capped by the 2 s the wait has left."""
    code, result = run(capsys, url=endpoint, timeout_s=2, request_timeout_s=30, interval_s=1)
    assert code == 1 and result["failed"] and result["stalled"] is False
    assert result["attempts"] == 1
    assert "timed out" in result["last_status"]
    assert re.search(r"not ready after \d+\.\d s \(timeout 2 s; last answer: no answer \(timed out\)\)",
                     result["msg"]), result["msg"]


def test_a_hung_health_with_a_20_s_bound_ends_at_20_s(clock, capsys):
    clock.latency = None  # never answers
    code, result = run(capsys, url=VIRTUAL_URL, timeout_s=20, request_timeout_s=30, interval_s=1)
    assert code == 1 and result["failed"]
    assert result["attempts"] == 1  # one request, its 30 s timeout capped by the 20 s left
    assert result["elapsed_s"] == 20.0 and result["last_status"] == "no answer (timed out)"
    assert "not ready after 20.0 s (timeout 20 s; last answer: no answer (timed out))" in result["msg"]


@pytest.mark.parametrize("endpoint", [("slow503", 0.8)], indirect=True)
def test_slow_503s_end_the_wait_not_ready(endpoint, capsys):
    code, result = run(capsys, url=endpoint, timeout_s=3, request_timeout_s=30, interval_s=0.5)
    assert code == 1 and result["stalled"] is False
    assert result["last_status"] in ("503", "no answer (timed out)")
    assert re.search(r"not ready after \d+\.\d s \(timeout 3 s; last answer: (503|no answer \(timed out\))\)",
                     result["msg"]), result["msg"]


def test_slow_503s_end_at_the_bound_and_say_the_elapsed_time(clock, capsys):
    clock.latency = 0.75
    code, result = run(capsys, url=VIRTUAL_URL, timeout_s=3, request_timeout_s=30, interval_s=0.5)
    # 503s at 0.75 and 2.0 s; the third request gets the 0.5 s left and is cut at the deadline
    assert code == 1 and result["stalled"] is False and result["attempts"] == 3
    assert result["elapsed_s"] == 3.0 and result["last_status"] == "no answer (timed out)"
    assert "not ready after 3.0 s (timeout 3 s; last answer: no answer (timed out))" in result["msg"]


def test_a_unit_whose_only_output_is_the_echo_of_our_probes_has_stalled(clock, capsys, systemd):
    systemd.batches = [PROBE_ECHOES] * 50
    clock.latency = 0.5  # SGLang's slow 503
    code, result = run(capsys, url=VIRTUAL_URL, unit="sglang.service", timeout_s=60, stall_timeout_s=2.5,
                       interval_s=0.25)
    assert code == 1 and result["stalled"] is True
    # 503s at 0.5, 1.25 and 2.0 s; the fourth request gets the 0.25 s left to the stall bound
    assert result["attempts"] == 4 and result["elapsed_s"] == 2.5 and result["silent_s"] == 2.5
    assert "stalled: sglang.service wrote no journal line and was not ready for 2.5 s (stall timeout 2.5 s; last " \
           "answer: no answer (timed out))" in result["msg"]
    assert result["progress"]["last_source"] == [] and result["progress"]["sources"]["journal"]["value"] == 0
    assert result["journal"] == ["tail of sglang.service"]


# vLLM 0.33.0 vllm/distributed/device_communicators/shm_broadcast.py LONG_WAIT_TIME_LOG_MSG, as a worker that hangs
# at start makes the engine log it (every VLLM_RINGBUFFER_WARNING_INTERVAL, 60 s by default).
VLLM_STILL_WAITING = ("(EngineCore_DP0 pid=812) INFO 12-03 10:01:00 [shm_broadcast.py:542] No available shared memory "
                      "broadcast block found in 60 seconds. This typically happens when some processes are hanging or "
                      "doing some time-consuming work (e.g. compilation, weight/kv cache quantization).")


def test_vllms_still_waiting_warning_is_not_progress(clock, capsys, systemd):
    """A hung vLLM start logs only that it still waits: the stall bound ends it, not the readiness timeout."""
    systemd.batches = [[VLLM_STILL_WAITING]] * 500
    code, result = run(capsys, url=VIRTUAL_URL, unit="vllm.service", timeout_s=60, stall_timeout_s=2,
                       interval_s=0.25)
    assert code == 1 and result["stalled"] is True, result["msg"]
    assert result["elapsed_s"] == 2.0 and result["silent_s"] == 2.0 and result["attempts"] == 9  # 0, 0.25 ... 2 s
    assert "stalled: vllm.service wrote no journal line and was not ready for 2.0 s (stall timeout 2 s;" \
           in result["msg"]


def test_journal_output_is_progress_and_the_timeout_still_holds(clock, capsys, systemd):
    systemd.batches = [["Loading safetensors checkpoint shards: 12/64"]] * 500
    code, result = run(capsys, url=VIRTUAL_URL, unit="sglang.service", timeout_s=3, stall_timeout_s=1,
                       interval_s=0.25)
    assert code == 1 and result["stalled"] is False
    assert result["elapsed_s"] == 3.0 and result["attempts"] == 13  # a poll every 0.25 s, each one progress
    assert "not ready after 3.0 s (timeout 3 s; last answer: 503)" in result["msg"]
    assert result["silent_s"] == 0.0 and result["progress"]["longest_silent_s"] == 0.25
    assert result["progress"]["last_source"] == ["journal"]


def test_progress_that_stops_starts_the_stall_clock(clock, capsys, systemd):
    systemd.batches = [["Capture cuda graph begin."]] * 5
    code, result = run(capsys, url=VIRTUAL_URL, unit="sglang.service", timeout_s=30, stall_timeout_s=1.5,
                       interval_s=0.25)
    assert code == 1 and result["stalled"] is True
    # five polls of progress (0 to 1 s) moved the clock before the silence began
    assert result["elapsed_s"] == 1.0 + 1.5 and result["silent_s"] == 1.5
    assert result["progress"]["last_source"] == ["journal"] and result["progress"]["sources"]["journal"]["value"] == 5


@pytest.mark.parametrize("endpoint", [("ok", 0.0)], indirect=True)
def test_ready_endpoint_returns_at_once(endpoint, capsys, systemd):
    code, result = run(capsys, url=endpoint, unit="sglang.service", stall_timeout_s=1)
    assert code == 0 and result["attempts"] == 1 and result["changed"] is False


def test_without_systemd_there_is_no_stall_only_the_timeout(clock, capsys, monkeypatch):
    monkeypatch.setattr(engine_wait, "unit_properties", lambda *_a, **_k: {})
    monkeypatch.setattr(engine_wait, "journal_tail", lambda *_a, **_k: [])
    code, result = run(capsys, url=VIRTUAL_URL, unit="sglang.service", timeout_s=2, stall_timeout_s=0.5,
                       interval_s=0.25)
    assert code == 1 and result["stalled"] is False
    assert result["elapsed_s"] == 2.0 and result["progress"] == {}  # the 0.5 s stall bound never applied
    assert "not ready after 2.0 s (timeout 2 s; last answer: 503)" in result["msg"]


def test_probe_echo_patterns_match_the_engines_lines():
    ignore = [engine_wait.re.compile(p) for p in engine_wait.DEFAULT_PROGRESS_IGNORE]
    for line in [*PROBE_ECHOES, 'engine-double: "GET /health HTTP/1.1" 503 -']:
        assert any(p.search(line) for p in ignore), line
    for line in ("Loading safetensors checkpoint shards: 100% 64/64", 'INFO: "POST /v1/chat/completions HTTP/1.1" 200'):
        assert not any(p.search(line) for p in ignore), line


SECRET = "sk-'journal\"Key-7"


@pytest.mark.parametrize("endpoint", [("slow503", 0.2)], indirect=True)
def test_the_journal_tail_comes_back_with_the_key_masked_in_every_form(endpoint, capsys, monkeypatch, systemd):
    """SGLang logs its arguments with repr and clients log JSON: a tail shown on failure masks each form."""
    import base64

    lines = [f"server_args={ {'api_key': SECRET} }", json.dumps({"key": SECRET}),
             "token " + base64.b64encode(f"x{SECRET}yz".encode()).decode(), "plain line"]
    monkeypatch.setattr(engine_wait, "journal_tail", lambda *_a, **_k: list(lines))
    code, result = run(capsys, url=endpoint, unit="sglang.service", timeout_s=1, interval_s=0.2, redact=[SECRET])
    assert code == 1
    shown = "\n".join(result["journal"])
    assert result["journal"][-1] == "plain line" and shown.count("********") == 3, shown
    for line in lines[:3]:
        assert line not in shown
    assert "journal\"Key" not in shown and "journal\\\"Key" not in shown and "'journal" not in shown


# ---------------------------------------------------------------- progress besides the journal
# The module reads the unit's cgroup files, /proc/<pid>/io and nvidia-smi; here a cgroup tree and a procfs under
# tmp_path stand in for the host's, written as the virtual clock moves as an engine's kernel counters would grow,
# and a script speaks nvidia-smi's compute-apps CSV. The journal says only that the engine still waits (vLLM's
# warning).
CONTROL_GROUP = "/system.slice/vllm.service"
ENGINE_PID, FOREIGN_PID = 4242, 777


class Counters:
    """A fake cgroup tree and procfs whose byte counters grow with the virtual clock while `grow_for` lasts."""

    def __init__(self, root: Path, layout: str) -> None:
        self.root, self.layout = root, layout  # layout: "v2" (io.stat at the root), "hybrid" (no io.stat)
        base = root / "cgroup" / ("unified" if layout == "hybrid" else "") / CONTROL_GROUP.strip("/")
        base.mkdir(parents=True)
        (base / "cgroup.procs").write_text(f"{ENGINE_PID}\n")
        self.io_stat = base / "io.stat" if layout == "v2" else None
        self.proc_io = root / "proc" / str(ENGINE_PID) / "io"
        self.proc_io.parent.mkdir(parents=True)
        self.bytes = 0
        self.write()

    def write(self) -> None:
        if self.io_stat is not None:
            self.io_stat.write_text(f"259:0 rbytes={self.bytes} wbytes=0 rios=3 wios=0 dbytes=0 dios=0\n"
                                    "8:0 rbytes=4096 wbytes=512 rios=1 wios=1 dbytes=0 dios=0\n")
        self.proc_io.write_text(f"rchar: {self.bytes * 2}\nwchar: 0\nsyscr: 9\nsyscw: 0\nread_bytes: {self.bytes}\n"
                                "write_bytes: 0\ncancelled_write_bytes: 0\n")

    def grow_for(self, clock: VirtualTime, seconds: float, step: int = 1 << 20) -> None:
        begin, end = clock.now, clock.now + seconds

        def grow(_now: float) -> None:
            self.bytes = step * clock.grown(begin, end)
            self.write()

        clock.on_advance.append(grow)


@pytest.fixture
def host_counters(tmp_path, monkeypatch, systemd):
    """The unit runs in CONTROL_GROUP; its journal only repeats vLLM's still-waiting warning."""
    monkeypatch.setattr(engine_wait, "unit_properties", lambda *_a, **_k: {**RUNNING, "ControlGroup": CONTROL_GROUP})
    monkeypatch.setattr(bws_progress, "CGROUP_ROOT", str(tmp_path / "cgroup"))
    monkeypatch.setattr(bws_progress, "PROC_ROOT", str(tmp_path / "proc"))
    systemd.batches = [[VLLM_STILL_WAITING]] * 500
    return tmp_path


def fake_nvidia_smi(tmp_path: Path, sleep_s: float = 0.0) -> tuple[Path, Path]:
    """nvidia-smi --query-compute-apps as the driver answers it, the apps read from a JSON file [[pid, MiB], ...]."""
    apps = tmp_path / "apps.json"
    apps.write_text("[]")
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!{sys.executable}\nimport json, sys, time\ntime.sleep({sleep_s})\n"
                      "assert any(a.startswith('--query-compute-apps=') for a in sys.argv[1:]), sys.argv\n"
                      f"for pid, mib in json.load(open({str(apps)!r})):\n"
                      "    print(f'{pid}, python3, {mib}, GPU-0a1b, 00000000:01:00.0')\n")
    script.chmod(0o755)
    return script, apps


def count_gpu_reads(monkeypatch) -> list[str]:
    """The nvidia-smi calls the GPU source makes, counted in this process (not by the child, which may be killed
    before it can say so)."""
    calls: list[str] = []
    real_query = bws_progress.run_query

    def counted(nvidia_smi, *args, **kwargs):
        calls.append(nvidia_smi)
        return real_query(nvidia_smi, *args, **kwargs)

    monkeypatch.setattr(bws_progress, "run_query", counted)
    return calls


def test_bytes_read_by_the_units_cgroup_are_progress_until_they_stop(clock, capsys, host_counters):
    """A cold weight read logs nothing: io.stat's rbytes growing keeps the wait going; once they stop, it stalls."""
    counters = Counters(host_counters, "v2")
    counters.grow_for(clock, 3.0)
    code, result = run(capsys, url=VIRTUAL_URL, unit="vllm.service", timeout_s=30, stall_timeout_s=1.5,
                       interval_s=0.25, nvidia_smi="")
    assert code == 1 and result["stalled"] is True, result["msg"]
    # every poll up to the reads' end at 3 s saw more bytes; the stall is 1.5 s of silence after the last
    assert result["elapsed_s"] == 3.0 + 1.5 and result["silent_s"] == 1.5
    sources = result["progress"]["sources"]
    assert result["progress"]["last_source"] == ["io_stat"]
    assert result["progress"]["longest_silent_s"] == 1.5  # the reads kept every earlier gap at one poll
    assert sources["io_stat"]["read"] and sources["io_stat"]["value"] == counters.bytes + 4096  # both devices
    assert sources["io_stat"]["silent_s"] == 1.5
    assert sources["journal"]["longest_silent_s"] == 4.5 and sources["journal"]["value"] == 0
    assert not sources["proc_io"]["read"] and sources["proc_io"]["problem"] == "not read: io.stat counts these bytes"
    assert sources["gpu_memory"]["problem"] == "not read (no nvidia-smi given)"
    msg = result["msg"]
    assert "stalled: vllm.service wrote no journal line and was not ready for 1.5 s (stall timeout 1.5 s; last " \
           "answer: 503)" in msg
    assert f"io_stat: {counters.bytes + 4096} bytes read, last grew 1.5 s ago; " in msg
    assert "last progress: io_stat)" in msg


def test_without_io_stat_the_processes_read_bytes_count_and_the_missing_source_is_named(clock, capsys,
                                                                                        host_counters):
    """A cgroup v1 or hybrid host has no io.stat for the unit: /proc/<pid>/io's read_bytes of its processes count."""
    counters = Counters(host_counters, "hybrid")
    counters.grow_for(clock, 2.5)
    code, result = run(capsys, url=VIRTUAL_URL, unit="vllm.service", timeout_s=30, stall_timeout_s=1.5,
                       interval_s=0.25, nvidia_smi="")
    assert code == 1 and result["stalled"] is True
    assert result["elapsed_s"] == 2.5 + 1.5  # the stall clock ran from the last bytes read
    sources = result["progress"]["sources"]
    assert result["progress"]["last_source"] == ["proc_io"]
    assert sources["proc_io"]["read"] and sources["proc_io"]["value"] == counters.bytes
    assert not sources["io_stat"]["read"]
    assert "the io controller is not enabled for it (it needs cgroup v2 and IOAccounting=yes)" in \
        sources["io_stat"]["problem"]
    assert "io_stat: no io.stat in the unit's cgroup" in result["msg"]


def test_a_source_it_cannot_read_is_reported_never_counted(clock, capsys, host_counters, monkeypatch):
    """/proc/<pid>/io of another user's process without ptrace rights (root in a container without
    CAP_SYS_PTRACE): the bytes it reads are not seen, so the wait stalls and says which source it lacked."""
    counters = Counters(host_counters, "hybrid")
    counters.grow_for(clock, 5.0)
    real_open = open

    def denied(path, *args, **kwargs):
        if str(path).endswith("/io"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(bws_progress, "open", denied, raising=False)
    code, result = run(capsys, url=VIRTUAL_URL, unit="vllm.service", timeout_s=30, stall_timeout_s=1.5,
                       interval_s=0.25, nvidia_smi="")
    assert code == 1 and result["stalled"] is True
    assert result["elapsed_s"] == 1.5  # the stall timeout from the start: the growing bytes were never seen
    proc_io = result["progress"]["sources"]["proc_io"]
    assert proc_io["read"] is False and proc_io["value"] is None
    assert "cannot be read (Permission denied): it needs ptrace rights over the engine's user" in proc_io["problem"]
    assert "proc_io: " + proc_io["problem"] in result["msg"]
    assert result["progress"]["last_source"] == []


def test_gpu_memory_the_units_processes_hold_is_progress_at_each_new_high(clock, capsys, host_counters,
                                                                        monkeypatch):
    """Weights landing on the GPUs: the unit's process holds more each read. Another process's memory, or the
    unit's own going down and up again below its high, is not progress."""
    Counters(host_counters, "hybrid")
    monkeypatch.setattr(bws_progress, "GPU_SAMPLE_S", 0.2)  # below the poll interval: every poll reads
    # The double is a real process: a generous kill limit, so that load cannot fail a read (the kill is tested
    # below); a safety net, no bound.
    real_runner = bws_progress.timed_runner
    monkeypatch.setattr(bws_progress, "timed_runner", lambda _timeout, setting: real_runner(60.0, setting))
    reads = count_gpu_reads(monkeypatch)
    script, apps = fake_nvidia_smi(host_counters)
    # what the GPUs hold, one entry per half second: eight new highs, then ups and downs below the high
    held = [[[ENGINE_PID, mib], [FOREIGN_PID, 100]] for mib in range(1000, 9000, 1000)]
    held += [[[ENGINE_PID, mib], [FOREIGN_PID, mib * 2]] for mib in (5000, 7000) * 5]
    begin = clock.now

    def fill(now: float) -> None:
        apps.write_text(json.dumps(held[min(int((now - begin) * 2), len(held) - 1)]))

    fill(begin)
    clock.on_advance.append(fill)
    code, result = run(capsys, url=VIRTUAL_URL, unit="vllm.service", timeout_s=30, stall_timeout_s=1.5,
                       interval_s=0.25, nvidia_smi=str(script))
    assert code == 1 and result["stalled"] is True
    # The last new high (8000 MiB) is there from 3.5 s; the stall is 1.5 s after it. Without the GPU source the
    # wait would stall at 1.5 s, and counting the lows or the foreign process would keep it going.
    assert result["elapsed_s"] == 3.5 + 1.5
    gpu = result["progress"]["sources"]["gpu_memory"]
    assert gpu["read"] and gpu["counts"] == "MiB held" and gpu["value"] == 5000 and gpu["silent_s"] == 1.5
    assert result["progress"]["last_source"] == ["gpu_memory"]
    assert "gpu_memory: 5000 MiB held, last grew 1.5 s ago" in result["msg"]
    assert len(reads) == result["attempts"] == 21  # one read a poll, 0 to 5 s


def test_a_hung_nvidia_smi_is_killed_once_and_not_asked_again(clock, capsys, host_counters, monkeypatch):
    Counters(host_counters, "hybrid")
    monkeypatch.setattr(bws_progress, "GPU_READ_S", 0.5)
    reads = count_gpu_reads(monkeypatch)
    script, _ = fake_nvidia_smi(host_counters, sleep_s=30)  # killed after 0.5 s of real time
    code, result = run(capsys, url=VIRTUAL_URL, unit="vllm.service", timeout_s=30, stall_timeout_s=2,
                       interval_s=0.25, nvidia_smi=str(script))
    assert code == 1 and result["stalled"] is True and "(stall timeout 2 s;" in result["msg"]
    assert result["attempts"] == 9 and len(reads) == 1  # the first poll's read only
    assert "did not answer within 0.5 s (engine_wait's GPU read) and was killed" in \
        result["progress"]["sources"]["gpu_memory"]["problem"]
    assert "(not asked again in this wait)" in result["progress"]["sources"]["gpu_memory"]["problem"]


def test_io_stat_sums_the_bytes_read_of_every_device(tmp_path, monkeypatch):
    monkeypatch.setattr(bws_progress, "CGROUP_ROOT", str(tmp_path))
    group = tmp_path / "system.slice" / "sglang.service"
    group.mkdir(parents=True)
    (group / "io.stat").write_text("259:0 rbytes=1000 wbytes=9 rios=1 wios=1 dbytes=0 dios=0\n"
                                   "259:1 rbytes=24 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n")
    source = bws_progress.IoStat(0.0)
    assert source.read(bws_progress.UnitView("/system.slice/sglang.service"), 1.0) == 1024
    with pytest.raises(bws_progress.UnavailableError, match="the unit has no control group"):
        source.read(bws_progress.UnitView(""), 1.0)


# ---------------------------------------------------------------- compilers at work
# A kernel build on first use (SGLang's load_jit, FlashInfer's JIT, vLLM's torch.compile and Triton) is silent: no
# journal line, no bytes read, flat GPU memory. Its compilers' CPU time (/proc/<pid>/stat utime + stime) and bytes
# written (/proc/<pid>/io write_bytes) are the progress; here they are written into the fake procfs as the virtual
# clock moves.
COMPILER_PID, ENGINE_BUSY_PID = 5151, 4343


class FakeProcess:
    """/proc/<pid>/{comm,cmdline,stat,io} of one process of the unit, its CPU ticks and written bytes growing with
    the virtual clock while `work_for` lasts."""

    def __init__(self, root: Path, pid: int, comm: str, argv0: str, starttime: int = 9000) -> None:
        self.dir = root / "proc" / str(pid)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "comm").write_text(comm + "\n")
        (self.dir / "cmdline").write_bytes(argv0.encode() + b"\0--out\0/cache/x.so\0")
        self.pid, self.comm, self.starttime = pid, comm, starttime
        self.ticks, self.written = 0, 0
        self.write()

    def write(self) -> None:
        # proc(5): pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
        # cutime cstime priority nice threads itrealvalue starttime ...
        utime, stime = self.ticks * 3 // 4, self.ticks - self.ticks * 3 // 4
        (self.dir / "stat").write_text(f"{self.pid} ({self.comm}) R 1 {self.pid} {self.pid} 0 -1 4194304 10 0 0 0 "
                                       f"{utime} {stime} 0 0 20 0 1 0 {self.starttime} 1000 100\n")
        (self.dir / "io").write_text(f"rchar: 0\nwchar: {self.written}\nsyscr: 0\nsyscw: 0\nread_bytes: 0\n"
                                     f"write_bytes: {self.written}\ncancelled_write_bytes: 0\n")

    def work_for(self, clock: VirtualTime, seconds: float, ticks: int = 10, written: int = 0) -> None:
        """`ticks` and `written` bytes more at each step (STEPS_PER_S a virtual second)."""
        begin, end = clock.now, clock.now + seconds

        def work(_now: float) -> None:
            steps = clock.grown(begin, end)
            self.ticks, self.written = ticks * steps, written * steps
            self.write()

        clock.on_advance.append(work)


def in_unit(root: Path, *pids: int) -> None:
    procs = root / "cgroup" / "unified" / CONTROL_GROUP.strip("/") / "cgroup.procs"
    procs.write_text("".join(f"{pid}\n" for pid in (ENGINE_PID, *pids)))


def test_an_idle_compiler_alive_longer_than_the_stall_timeout_is_a_stall(clock, capsys, host_counters):
    """A wedged kernel build: the compiler lives (its process is there for the whole wait) but uses no CPU and
    writes nothing. It is not progress: the wait stalls at the stall timeout, and says a compiler was there."""
    Counters(host_counters, "hybrid")
    FakeProcess(host_counters, COMPILER_PID, "cicc", "cicc", starttime=7).work_for(clock, 0.0)
    in_unit(host_counters, COMPILER_PID)
    code, result = run(capsys, url=VIRTUAL_URL, unit="vllm.service", timeout_s=30, stall_timeout_s=1.5,
                       interval_s=0.25, nvidia_smi="")
    assert code == 1 and result["stalled"] is True, result["msg"]
    assert result["elapsed_s"] == 1.5 and result["silent_s"] == 1.5
    assert result["compile"]["seen"] is True and result["compile"]["names"] == ["cicc"]
    assert result["compile"]["first_seen_s"] == 0.0
    assert result["compile"]["last_progress_s"] is None and result["compile"]["cpu_s"] == 0
    assert result["progress"]["last_source"] == []
    assert "had a compiler at work" in result["msg"] and "compilers: 0 CPU seconds" in result["msg"]


def test_a_working_compiler_keeps_the_start_alive_and_its_compile_time_is_reported(clock, capsys, host_counters):
    """A compiler that burns CPU for 3 s (twice the stall timeout) keeps the wait going; when it stops, the stall
    clock runs from its last progress. The result says how long the start compiled and the CPU seconds."""
    Counters(host_counters, "hybrid")
    compiler = FakeProcess(host_counters, COMPILER_PID, "cicc", "cicc")
    in_unit(host_counters, COMPILER_PID)
    compiler.work_for(clock, 3.0, ticks=10)
    code, result = run(capsys, url=VIRTUAL_URL, unit="vllm.service", timeout_s=30, stall_timeout_s=1.5,
                       interval_s=0.25, nvidia_smi="")
    assert code == 1 and result["stalled"] is True, result["msg"]
    assert result["elapsed_s"] == 3.0 + 1.5
    assert result["progress"]["last_source"] == ["compilers"]
    report = result["compile"]
    assert report["seen"] and report["names"] == ["cicc"] and report["processes"] == 1
    # seen at the first look (the baseline), working at each poll up to its end at 3 s
    assert report["first_seen_s"] == 0.0 and report["last_progress_s"] == 3.0 and report["compile_s"] == 3.0, report
    assert report["silent_s"] == 1.5
    assert report["cpu_s"] == round(compiler.ticks / bws_progress.clock_ticks(), 2)
    assert result["progress"]["sources"]["compilers"]["counts"] == "ms of compiler CPU"


def test_only_compilers_count_and_they_are_known_by_argv0_or_comm(clock, capsys, host_counters):
    """The engine's own busy Python process is no compiler (its CPU is not progress); a compiler is known by its
    comm or by argv[0]'s basename (nvcc given as a path, comm cut to 15 characters); bytes it writes count too."""
    Counters(host_counters, "hybrid")
    FakeProcess(host_counters, ENGINE_BUSY_PID, "python3", "/usr/bin/python3").work_for(clock, 6.0, ticks=50)
    nvcc = FakeProcess(host_counters, COMPILER_PID, "some (odd) name", "/usr/local/cuda/bin/nvcc")
    in_unit(host_counters, ENGINE_BUSY_PID, COMPILER_PID)
    nvcc.work_for(clock, 2.0, ticks=0, written=4096)  # writes only: an object file growing
    code, result = run(capsys, url=VIRTUAL_URL, unit="vllm.service", timeout_s=30, stall_timeout_s=1.25,
                       interval_s=0.25, nvidia_smi="")
    assert code == 1 and result["stalled"] is True, result["msg"]
    # stalled 1.25 s after nvcc's last write, while the busy python process still burned CPU
    assert result["elapsed_s"] == 2.0 + 1.25 and result["compile"]["last_progress_s"] == 2.0
    assert result["compile"]["names"] == ["nvcc"] and result["compile"]["cpu_s"] == 0
    assert result["progress"]["last_source"] == ["compilers"]


def test_compiler_names_are_those_a_cuda_build_runs():
    for name in ("ninja", "nvcc", "cicc", "ptxas", "fatbinary", "nvlink", "cudafe++", "cc1plus", "gcc", "ld"):
        assert name in bws_progress.COMPILERS
    for name in ("python3", "sglang::scheduler", "VLLM::EngineCor"):
        assert name not in bws_progress.COMPILERS
