#!/usr/bin/python
"""Ansible module: wait for an engine to become ready by polling, never by sleeping blindly."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_wait
short_description: Wait until an inference engine answers its health endpoint, failing fast if its unit dies or stalls
description:
  - Polls I(url) until it answers I(status) or I(timeout_s) runs out. SGLang answers C(/health) with 503
    while it starts, then runs a real one-token generation and answers 503 after its own 20 s health-check
    timeout when that generation is stuck; vLLM answers 200 once its engine is up.
  - The wait ends within I(timeout_s) plus a fraction of a second whatever the endpoint does; each request's
    timeout is I(request_timeout_s) capped by the time left, and every systemd and journal read is bounded too.
    Messages give the real elapsed time.
  - With I(unit), each poll also reads the unit's state from systemd. If the unit fails, stops, or is
    restarted by C(Restart=on-failure) (its C(NRestarts) grows), the wait ends at once instead of at the
    timeout, and the result carries the tail of the unit's journal.
  - With I(unit) and I(stall_timeout_s), the wait also ends when the unit shows no progress for
    I(stall_timeout_s) while it is not ready (a deadlocked engine looks like a loading one to C(/health)).
    Progress is any of - a new journal line; more bytes read from storage by the unit's cgroup (C(rbytes) of
    its cgroup v2 C(io.stat), or, where the unit has none, C(read_bytes) of C(/proc/<pid>/io) of its
    processes); more GPU memory held by its processes than ever before in this wait (nvidia-smi's compute
    apps, read every 5 s; it grows as the model is created on the GPUs, the KV cache allocated, CUDA graphs
    captured); more CPU time used or bytes written by a compiler in the unit's cgroup (a process whose
    C(/proc/<pid>/comm) or argv[0] is ninja, nvcc, cicc, ptxas, cc1plus, gcc ... as a kernel build on first
    use runs them, silently - SGLang's JIT kernels, FlashInfer's, vLLM's torch.compile and Triton). A compiler
    that is alive but idle is not progress. A source that cannot be read is reported with the reason and never
    counted.
  - With stall detection the result says how long the start compiled (C(compile)) - from the first compiler
    seen to the last compiler progress - and the CPU seconds the compilers used.
    Lines matching I(progress_ignore) are the engine's echo of these very probes (access log lines of
    C(/health), SGLang's "Health check failed") or say that it is still waiting (vLLM's "No available shared
    memory broadcast block found", logged every 60 s while a worker hangs) and are not progress; a slow 503 is
    "not ready", never "still loading".
  - Read-only, so it runs in check mode too (a task that must not, sets C(check_mode) or C(when)).
options:
  url:
    description: Health URL, for example C(http://127.0.0.1:30000/health).
    type: str
    required: true
  status:
    description: HTTP status that means ready.
    type: int
    default: 200
  timeout_s:
    description: How long to wait in total, in seconds.
    type: float
    default: 1800
  interval_s:
    description: Pause between polls, in seconds.
    type: float
    default: 1.0
  request_timeout_s:
    description: >-
      Timeout of one request (capped by the time left). SGLang's health check may take up to its own 20 s
      generation timeout before it answers.
    type: float
    default: 30
  unit:
    description: Systemd unit whose state is watched while waiting, and whose journal is shown on failure.
    type: str
  stall_timeout_s:
    description: >-
      Fail when the unit showed no progress (no journal line other than I(progress_ignore) ones, no bytes read,
      no new high of GPU memory, no compiler at work) for this many seconds while not ready. 0 turns stall
      detection off. Needs I(unit), systemd and its journal.
    type: float
    default: 0
  nvidia_smi:
    description: nvidia-smi, whose compute apps give the GPU memory the unit's processes hold. Empty - not read.
    type: str
    default: nvidia-smi
  progress_ignore:
    description: Regular expressions (searched in each journal message) of lines that are not progress.
    type: list
    elements: str
    default: ['"GET /health', '"GET /ready', 'Health check failed', 'Health check request received',
              'No available shared memory broadcast block found']
  redact:
    description:
      - Secrets (the engine's API key) masked in the journal tail before it is returned, in every form a log
        line can hold them - as they are, JSON- and repr-escaped, base64-encoded.
    type: list
    elements: str
    default: []
  journal_lines:
    description: Journal lines to return on failure.
    type: int
    default: 40
author: the blackwell-llm-serving authors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Wait for SGLang to serve, failing after 10 minutes without a journal line
  engine_wait:
    url: http://127.0.0.1:30000/health
    unit: sglang.service
    timeout_s: 1800
    stall_timeout_s: 600
"""

RETURN = r"""
elapsed_s:
  description: Seconds from the first poll to the outcome.
  type: float
  returned: always
attempts:
  description: Number of health requests sent.
  type: int
  returned: always
last_status:
  description: Last HTTP status seen, or the connection error.
  type: str
  returned: always
test_double:
  description: Whether the ready answer carried the engine test double's C(X-Engine-Test-Double) header.
  type: bool
  returned: success
stalled:
  description: Whether the wait ended because the unit stalled (no progress and not ready).
  type: bool
  returned: always
silent_s:
  description: Seconds since the unit's last progress of any source, at the end (with stall detection).
  type: float
  returned: always
progress:
  description: The sources of progress, with stall detection (empty without).
  type: dict
  returned: always
  contains:
    last_source:
      description: >-
        The sources that showed the last progress (C(journal), C(io_stat), C(proc_io), C(gpu_memory),
        C(compilers)); empty while none did.
      type: list
      elements: str
    longest_silent_s:
      description: >-
        The longest time without progress of any source in this wait: how close a healthy start came to the
        stall timeout.
      type: float
    sources:
      description: >-
        Per source - C(read) (whether its last read succeeded), C(value) (progress lines seen, bytes read,
        MiB of GPU memory held, ms of compiler CPU), C(counts) (what the value counts), C(problem) (why it was
        not read), C(silent_s) (since it last grew) and C(longest_silent_s) (the longest time it did not grow in
        this wait).
      type: dict
compile:
  description: >-
    What the compilers of the unit's cgroup did during the wait, with stall detection (empty without) - how long the
    start compiled, for example SGLang's or vLLM's kernels built on first use.
  type: dict
  returned: always
  contains:
    seen:
      description: Whether a compiler process was seen in the unit's cgroup.
      type: bool
    first_seen_s:
      description: Seconds from the first poll to the first compiler seen (null when none was).
      type: float
    last_progress_s:
      description: Seconds from the first poll to the last look at which a compiler had worked (null when none did).
      type: float
    compile_s:
      description: Seconds from the first compiler seen to the last compiler progress.
      type: float
    cpu_s:
      description: CPU seconds (user and system) the compilers used while they were watched.
      type: float
    processes:
      description: Compiler processes seen.
      type: int
    names:
      description: Their names (comm or argv[0]).
      type: list
      elements: str
    working_now:
      description: Compilers that worked since the look before the last.
      type: int
    silent_s:
      description: Seconds since the last compiler progress, at the end (null when none made any).
      type: float
unit_state:
  description: >-
    The unit's ActiveState/SubState/Result/NRestarts/MainPID/ExecMainStatus/ControlGroup at the end, when I(unit)
    is set and systemd runs.
  type: dict
  returned: when unit is set
journal:
  description: Tail of the unit's journal, on failure.
  type: list
  elements: str
  returned: on failure with unit
"""

import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.blackwell.serving.plugins.module_utils.engine.progress import (
    Compilers,
    Source,
    UnitView,
    sample,
    sources,
)
from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import journal_tail, unit_properties
from ansible_collections.blackwell.serving.plugins.module_utils.secrets.redact import redact

UNIT_PROPERTIES = ("ActiveState", "SubState", "Result", "NRestarts", "MainPID", "ExecMainStatus", "ControlGroup")
# A request is never given less than this, so a nearly spent budget still gets one real answer.
MIN_REQUEST_S = 0.05
# systemctl and journalctl reads are bounded too; a wedged journald must not stretch the wait.
SYSTEMD_READ_S = 5.0
CURSOR_PREFIX = "-- cursor: "
# Sent by the engine test double (tests/doubles/engine_double.py) on every answer, never by an engine.
TEST_DOUBLE_HEADER = "x-engine-test-double"
# The engines' echo of our own probes: uvicorn's access lines (both engines), SGLang 0.5.23's health-check
# failure and shutdown lines (srt/entrypoints/http_server.py `health_generate`), the test double's access line.
# The echoes of our own probes, and lines an engine writes while it waits on something that does not come: vLLM 0.33.0
# logs "No available shared memory broadcast block found in 60 seconds" every 60 s while a worker hangs at start
# (vllm/distributed/device_communicators/shm_broadcast.py LONG_WAIT_TIME_LOG_MSG): a stalled start, not progress.
DEFAULT_PROGRESS_IGNORE = ['"GET /health', '"GET /ready', "Health check failed", "Health check request received",
                           "No available shared memory broadcast block found"]


def probe(url: str, timeout: float) -> str:
    return probe_response(url, timeout)[0]


def probe_response(url: str, timeout: float) -> tuple[str, dict[str, str]]:
    """The status (or why there was no answer) and the response headers, lower-cased."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.status), {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as error:
        return str(error.code), {k.lower(): v for k, v in (error.headers or {}).items()}
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return f"no answer ({reason})", {}


def unit_died(state: dict[str, str], restarts_at_start: int) -> str | None:
    """Describe why the unit can no longer become ready, or None while it still can."""
    if not state:
        return None
    if state.get("ActiveState") in ("failed", "inactive", "deactivating") or state.get("SubState") == "auto-restart":
        return (f"unit is {state.get('ActiveState')}/{state.get('SubState')} (result {state.get('Result')}, "
                f"exit status {state.get('ExecMainStatus')})")
    # NRestarts only grows once RestartSec= has passed; auto-restart above catches the crash at once.
    restarts = int(state.get("NRestarts") or 0)
    if restarts > restarts_at_start:
        return f"unit crashed and was restarted {restarts - restarts_at_start} time(s) while starting"
    return None


class JournalProgress(Source):
    """New journal lines of a unit since the last look, minus the echoes of our own probes; the value counts them."""

    name, what = "journal", "progress lines"

    def __init__(self, unit: str, ignore: list[str], start: float) -> None:
        super().__init__(start)
        self.unit = unit
        self.ignore = [re.compile(pattern) for pattern in ignore]
        self.cursor: str | None = None
        self.lines = 0
        self.available = shutil.which("journalctl") is not None
        if self.available:
            self._read(["--lines", "1"])  # only where the journal ends now; older lines are not progress

    def _read(self, selection: list[str]) -> list[str]:
        argv = ["journalctl", "--unit", self.unit, "--no-pager", "--quiet", "--output", "cat", "--show-cursor",
                *selection]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=SYSTEMD_READ_S)
        except subprocess.TimeoutExpired:
            return []
        lines = result.stdout.splitlines()
        if lines and lines[-1].startswith(CURSOR_PREFIX):
            self.cursor = lines.pop()[len(CURSOR_PREFIX):]
        return lines

    def new_progress_lines(self) -> list[str]:
        if not self.available:
            return []
        lines = self._read(["--after-cursor", self.cursor] if self.cursor else [])
        return [line for line in lines if not any(pattern.search(line) for pattern in self.ignore)]

    def read(self, unit: UnitView, budget_s: float) -> int:
        self.lines += len(self.new_progress_lines())
        return self.lines

    def grew(self, value: int) -> bool:
        return value > (self.value or 0)


class Wait:
    """One readiness wait: a deadline, an optional stall clock fed by the sources of progress, what was last seen."""

    def __init__(self, params: dict, unit_state: dict[str, str]) -> None:
        self.params = params
        self.start = time.monotonic()
        self.deadline = self.start + params["timeout_s"]
        self.stall_s = params["stall_timeout_s"]
        self.last_progress = self.start
        self.longest_silent = 0.0
        self.last_source: list[str] = []
        self.journal: JournalProgress | None = None
        self.sources: list[Source] = []
        # Stall detection needs what it watches: a unit, systemd (a unit state) and its journal. The sources are
        # first read after the first answer that is not ready: an engine that is ready at once costs no read.
        self.watch_journal = self.stall_s > 0 and bool(params["unit"]) and bool(unit_state)
        self.attempts = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def next_limit(self) -> float:
        """When the wait must end at the latest: the deadline, or sooner the stall deadline."""
        if self.journal is None:
            return self.deadline
        return min(self.deadline, self.last_progress + self.stall_s)

    def request_timeout(self) -> float:
        return max(MIN_REQUEST_S, min(self.params["request_timeout_s"], self.next_limit() - time.monotonic()))

    def start_watching_journal(self) -> None:
        if self.watch_journal and self.journal is None:
            self.watch_journal = False
            journal = JournalProgress(self.params["unit"], self.params["progress_ignore"], self.start)
            if journal.available:
                self.journal = journal
                self.sources = [journal, *sources(self.start, self.params["nvidia_smi"])]

    def note_progress(self, state: dict[str, str]) -> None:
        self.start_watching_journal()
        if self.journal is None or state.get("ActiveState") not in ("active", "activating"):
            return
        now = time.monotonic()
        grew = sample(self.sources, now, UnitView(state.get("ControlGroup")), self.next_limit() - now)
        if grew:
            self.longest_silent = max(self.longest_silent, now - self.last_progress)
            self.last_progress, self.last_source = now, grew

    def silent_s(self) -> float:
        return time.monotonic() - self.last_progress if self.journal is not None else 0.0

    def progress(self) -> dict:
        now = time.monotonic()
        if not self.sources:
            return {}
        longest = max(self.longest_silent, self.silent_s())
        return {"last_source": self.last_source, "longest_silent_s": round(longest, 3),
                "sources": {source.name: source.report(now) for source in self.sources}}

    def compile(self) -> dict:
        """The compile report (CompileReport), offsets from the wait's start; empty without stall detection."""
        compilers = next((source for source in self.sources if isinstance(source, Compilers)), None)
        return compilers.compile_report(self.start, time.monotonic()) if compilers is not None else {}

    def stall_reason(self, last_status: str) -> str | None:
        if self.journal is None or self.silent_s() < self.stall_s:
            return None
        now = time.monotonic()
        others = "; ".join(source.describe(now) for source in self.sources[1:])
        return (f"stalled: {self.params['unit']} wrote no journal line and was not ready for "
                f"{self.silent_s():.1f} s (stall timeout {self.stall_s:g} s; last answer: {last_status}), nor read "
                f"bytes, took more GPU memory or had a compiler at work ({others}; last progress: "
                f"{', '.join(self.last_source) or 'none'}). A running engine that neither logs, reads its weights, "
                f"fills its GPUs, compiles nor answers is stuck, not loading (for example a generation deadlock: "
                f"an engine's /health may then answer 503 after its own timeout; or a kernel build whose compiler "
                f"lives but no longer works)")

    def timeout_reason(self, last_status: str) -> str | None:
        if time.monotonic() < self.deadline:
            return None
        return (f"not ready after {self.elapsed():.1f} s (timeout {self.params['timeout_s']:g} s; "
                f"last answer: {last_status})")

    def pause(self) -> None:
        time.sleep(max(0.0, min(self.params["interval_s"], self.next_limit() - time.monotonic())))


def read_unit(unit: str | None) -> dict[str, str]:
    return unit_properties(unit, UNIT_PROPERTIES, timeout=SYSTEMD_READ_S) if unit else {}


def wait(module: AnsibleModule) -> None:
    params = module.params
    unit = params["unit"]
    initial = read_unit(unit)
    restarts_at_start = int(initial.get("NRestarts") or 0)
    current = Wait(params, initial)
    last_status, state = "not polled", initial
    while True:
        current.attempts += 1
        last_status, headers = probe_response(params["url"], current.request_timeout())
        result = {"attempts": current.attempts, "last_status": last_status, "unit_state": state}
        if last_status == str(params["status"]):
            module.exit_json(changed=False, elapsed_s=round(current.elapsed(), 3), stalled=False,
                             silent_s=round(current.silent_s(), 3), progress=current.progress(),
                             compile=current.compile(),
                             test_double=TEST_DOUBLE_HEADER in headers, **result)
        state = read_unit(unit)
        current.note_progress(state)
        stall = current.stall_reason(last_status)
        reason = unit_died(state, restarts_at_start) or stall or current.timeout_reason(last_status)
        if reason:
            journal = [redact(line, params["redact"]) for line in
                       (journal_tail(unit, params["journal_lines"], timeout=SYSTEMD_READ_S) if unit else [])]
            module.fail_json(msg=f"{params['url']}: {reason}", elapsed_s=round(current.elapsed(), 3),
                             stalled=stall is not None and reason == stall, silent_s=round(current.silent_s(), 3),
                             progress=current.progress(), compile=current.compile(), journal=journal,
                             **{**result, "unit_state": state})
        current.pause()


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "status": {"type": "int", "default": 200},
            "timeout_s": {"type": "float", "default": 1800},
            "interval_s": {"type": "float", "default": 1.0},
            "request_timeout_s": {"type": "float", "default": 30},
            "unit": {"type": "str"},
            "stall_timeout_s": {"type": "float", "default": 0},
            "progress_ignore": {"type": "list", "elements": "str", "default": DEFAULT_PROGRESS_IGNORE},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "journal_lines": {"type": "int", "default": 40},
            "redact": {"type": "list", "elements": "str", "default": [], "no_log": True},
        },
        supports_check_mode=True,
    )
    wait(module)


if __name__ == "__main__":
    main()
