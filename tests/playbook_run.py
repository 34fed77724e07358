"""The tests' one way to run a playbook and read what it did: ansible-runner and its events.

``run_playbook`` starts ``ansible-playbook`` through ansible-runner (the way CI and the execution environment drive
the project) and returns a ``PlaybookRun`` read from the job's events: the recap per host, every task result by
task name, the names of the tasks that ran, and the play output for failure messages. Host scenarios, Molecule
verifiers, the contract and GPU tests use it; a repository rule (tests/unit/test_repository_rules.py) keeps other
test code from starting playbooks another way, naming the few that must (a killed controller, a private mount
namespace, the README's own commands). The benches under bench/ time the user's own command and start it as typed.
"""

from __future__ import annotations

import json
import os
import pty
import select
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RECAP_KEYS = ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored")
RESULT_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable")


@dataclass
class PlaybookRun:
    """One finished ansible-playbook run: its exit, recap and events."""

    status: str  # ansible-runner's: successful, failed, timeout, canceled
    rc: int
    stats: dict[str, dict[str, int]]
    stdout: str
    artifact_dir: Path
    events: list[dict[str, Any]] = field(repr=False)

    def count(self, key: str, host: str) -> int:
        """One recap counter of one host (ok, changed, failures, dark, skipped, rescued, ignored)."""
        return int((self.stats or {}).get(key, {}).get(host, 0))

    def recap(self, host: str) -> dict[str, int]:
        """The recap line of ``host`` as a dict; ``unreachable`` and ``failed`` are ansible-playbook's names."""
        counters = {key: self.count(key, host) for key in RECAP_KEYS}
        counters["failed"] = counters["failures"]
        counters["unreachable"] = counters["dark"]
        return counters

    def played(self, host: str) -> bool:
        """Whether the recap names ``host`` at all."""
        return any(host in hosts for hosts in (self.stats or {}).values())

    @property
    def task_events(self) -> list[dict[str, Any]]:
        """The per-host task results in the order they came: ``event`` plus its ``event_data``."""
        return [event for event in self.events if event.get("event") in RESULT_EVENTS]

    def task_events_results(self) -> list[dict[str, Any]]:
        """Every task result in order, each with ``_event`` (runner_on_ok, ...), ``_host`` and ``_task``."""
        return [_result_of(event) for event in self.task_events]

    def results(self, task: str, host: str | None = None) -> list[dict[str, Any]]:
        """Every result of the task named ``task`` (its name, or ``role : name`` as the play shows it)."""
        return [_result_of(event) for event in self.task_events
                if _task_matches(event.get("event_data", {}), task)
                and host in (None, event.get("event_data", {}).get("host"))]

    def result(self, task: str, host: str | None = None) -> dict[str, Any]:
        """The first result of ``task``; KeyError naming the tasks that did run when it did not."""
        found = self.results(task, host)
        if not found:
            raise KeyError(f"no result of {task!r}{f' on {host}' if host else ''}; tasks that ran: {self.task_names}")
        return found[0]

    @property
    def task_names(self) -> list[str]:
        """Names of the tasks that reported a result, in order, each once."""
        names: list[str] = []
        for event in self.task_events:
            name = event.get("event_data", {}).get("task", "")
            if name not in names:
                names.append(name)
        return names

    @property
    def tasks_started(self) -> list[str]:
        """Every task the play started, in order, named as its banner shows it (``role : name``)."""
        started = []
        for event in self.events:
            if event.get("event") == "playbook_on_task_start":
                data = event.get("event_data", {})
                started.append(f"{data['role']} : {data.get('task', '')}" if data.get("role") else data.get("task", ""))
        return started

    def first_results(self) -> dict[str, dict[str, Any]]:
        """task name -> its first ok or failed result (the shape the older helpers returned)."""
        results: dict[str, dict[str, Any]] = {}
        for event in self.task_events:
            data = event.get("event_data", {})
            if event["event"] in ("runner_on_ok", "runner_on_failed") and "res" in data:
                results.setdefault(data.get("task", ""), data["res"])
        return results


def _result_of(event: dict[str, Any]) -> dict[str, Any]:
    data = event.get("event_data", {})
    return {**data.get("res", {}), "_event": event["event"], "_host": data.get("host"), "_task": data.get("task")}


def _task_matches(data: dict[str, Any], task: str) -> bool:
    name = data.get("task", "")
    role = data.get("role")
    return task in (name, f"{role} : {name}" if role else name)


def local_inventory(path: Path, *, group: str = "gpu_servers", python: str | None = None,
                    host_vars: dict[str, Any] | None = None) -> Path:
    """An inventory file holding localhost (local connection) in ``group``; returns its path."""
    host = {"ansible_connection": "local", "ansible_python_interpreter": python or sys.executable,
            "ansible_become": os.geteuid() != 0, **(host_vars or {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"all": {"children": {group: {"hosts": {"localhost": host}}}}}), encoding="utf-8")
    return path


def run_playbook(playbook: str | Path, inventory: str | Path | list[str | Path] | None = None, *,
                 extravars: dict[str, Any] | None = None, extra_args: list[str] | None = None,
                 check: bool = False, diff: bool = False, limit: str | None = None, tags: str | None = None,
                 skip_tags: str | None = None, project_dir: Path = REPO, envvars: dict[str, str] | None = None,
                 workdir: Path | None = None, timeout: int | None = None) -> PlaybookRun:
    """Run ``playbook`` (relative to ``project_dir`` or absolute) through ansible-runner; never raises on failure.

    ``inventory`` None runs without ``-i`` (the project's ansible.cfg inventory, or implicit localhost); a list
    passes each (``-i A -i B``).
    ``envvars`` add to this process's environment (ANSIBLE_CONFIG defaults to the project's ansible.cfg);
    ``extra_args`` are further ansible-playbook arguments (``-e @file``, ``-v``). The run's private data directory
    (inventory copy, artifacts, events) is made under ``workdir`` and kept; without one it is removed once read.
    """
    import ansible_runner

    private = Path(tempfile.mkdtemp(prefix="runner-", dir=workdir))
    cmdline = [*(["--check"] if check else []), *(["--diff"] if diff else []), *(extra_args or [])]
    env = {"ANSIBLE_CONFIG": str(project_dir / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_FORCE_COLOR": "0", **_toolchain_path(), **(envvars or {})}
    inventories = [str(path) for path in inventory] if isinstance(inventory, list) else inventory
    runner = ansible_runner.run(
        private_data_dir=str(private), project_dir=str(project_dir), playbook=str(playbook),
        inventory=str(inventories) if isinstance(inventories, Path) else inventories, extravars=extravars or None,
        limit=limit, tags=tags, skip_tags=skip_tags, cmdline=shlex.join(cmdline) or None, envvars=env,
        suppress_env_files=True, quiet=True, timeout=timeout,
    )
    run = PlaybookRun(runner.status, runner.rc, runner.stats or {}, _output(runner), Path(runner.config.artifact_dir),
                      list(runner.events))
    if workdir is None:
        shutil.rmtree(private, ignore_errors=True)
    return run


def run_module(module: str, args: str, *, check: bool = False, diff: bool = False, python: str | None = None,
               workdir: Path | None = None, envvars: dict[str, str] | None = None,
               timeout: int | None = 120) -> dict[str, Any]:
    """One module on localhost (local connection) through ansible-runner, as ``ansible localhost -m`` would run it;
    returns its result (``failed`` set when it failed)."""
    import ansible_runner

    private = Path(tempfile.mkdtemp(prefix="runner-", dir=workdir))
    inventory = local_inventory(private / "hosts.json", group="ungrouped", python=python or sys.executable)
    env = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", **_toolchain_path(), **(envvars or {})}
    runner = ansible_runner.run(private_data_dir=str(private), project_dir=str(REPO), host_pattern="localhost",
                                inventory=str(inventory), module=module, module_args=args, envvars=env,
                                cmdline=shlex.join([*(["--check"] if check else []), *(["--diff"] if diff else [])])
                                or None,
                                suppress_env_files=True, quiet=True, timeout=timeout)
    events, output = list(runner.events), _output(runner)
    if workdir is None:
        shutil.rmtree(private, ignore_errors=True)
    for event in events:
        if event.get("event") in RESULT_EVENTS:
            failed = event["event"] != "runner_on_ok"
            return {**event["event_data"]["res"], **({"failed": True} if failed else {})}
    raise AssertionError(f"{module} returned no result ({runner.status}, rc {runner.rc}):\n{output[-3000:]}")


def run_at_a_terminal(playbook: str | Path, inventory: str | Path, answer: str | None = None, *,
                      wait_for: str = "", extra_args: list[str] | None = None, project_dir: Path = REPO,
                      timeout: float = 240) -> tuple[int, str]:
    """Run ``ansible-playbook`` on a pseudo-terminal of its own, as a person at a terminal does (ansible-runner gives
    it none, so Ansible's prompts do not ask there): type ``answer`` once ``wait_for`` is printed (None: type
    nothing). Its exit status and what it printed, whitespace folded. No events: what it did is read on the host."""
    command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(playbook),
               *(extra_args or [])]
    env = {**os.environ, "ANSIBLE_CONFIG": str(project_dir / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           **_toolchain_path()}
    pid, terminal = pty.fork()
    if pid == 0:  # the child: a session of its own whose controlling terminal is the pty, in the foreground
        os.chdir(project_dir)
        os.execve(command[0], command, env)
    output, answered, deadline = b"", answer is None, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([terminal], [], [], 1)[0]:
                try:
                    chunk = os.read(terminal, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            if not answered and wait_for.encode() in output:
                time.sleep(1)  # as a person would: Ansible flushes what was typed before its prompt took the terminal
                os.write(terminal, answer.encode() + b"\n")
                answered = True
        else:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(terminal)
    return os.waitstatus_to_exitcode(status), " ".join(output.decode(errors="replace").split())


def _toolchain_path() -> dict[str, str]:
    """PATH with this interpreter's scripts first, so the ansible-playbook beside the tests' python runs."""
    scripts = Path(sys.executable).parent
    if not (scripts / "ansible-playbook").exists():
        return {}
    return {"PATH": os.pathsep.join([str(scripts), *filter(None, os.environ.get("PATH", "").split(os.pathsep))])}


def _output(runner: Any) -> str:
    """What ansible-playbook wrote (stdout and stderr share ansible-runner's pseudo-terminal)."""
    return runner.stdout.read() if runner.stdout else ""


