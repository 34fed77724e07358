"""The test command's scheduler (scripts/test.sh): every stage of the run, started as soon as what it needs is
ready, side by side within a CPU budget, each one reported.

- A stage runs when every stage it needs has passed; a failed (or timed-out) stage stops nothing but the stages that
  need it, which are reported as skipped, naming why. Nothing is left out of the table.
- The budget: a stage takes ``slots`` (about the cores it keeps busy); stages start in the order of ``STAGES`` while
  the running ones hold fewer than ``--slots`` (BWS_TEST_SLOTS). A stage that alone holds more than the budget still
  runs, alone.
- Every line a stage prints is printed as it comes, prefixed with the stage's name, and kept in
  ``<results>/<name>.log``.
- Each stage runs in a process group of its own; a stage past its time limit (BWS_STAGE_TIMEOUT_S), or all of them
  when the run is interrupted, is ended by signalling that group only, after checking it is still the group this
  runner started.
- The end: the stage table (status, when it started, how long it took, its test cases from its JUnit files), then the
  closing line, last: ``PASSED: 14 of 14 stages passed; 1385 tests (1380 passed, 5 skipped)`` or
  ``FAILED: units (2 failed), host-scenarios (skipped: needs image, which failed); 12 of 14 stages passed; ...``.
  The exit status is 0 only when every stage asked for ran and passed.

Standard library only, Python >= 3.10: it runs on the distribution's python3 before the bootstrap has built the venv.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARTS = ("lint", "unit", "molecule", "contract", "host")
SETUP = "setup"  # the part of the stages other stages need (bootstrap, image, venvs): run when anything needs them


@dataclass(frozen=True)
class StageSpec:
    """One stage: its command, the part that asks for it, what it needs, its CPU share and its JUnit files."""

    name: str
    part: str
    argv: tuple[str, ...]
    needs: tuple[str, ...] = ()
    slots: int = 1
    junit: tuple[str, ...] = ()  # file name patterns under the results folder
    nice: int = 0


def pytest_argv(name: str, *args: str) -> tuple[str, ...]:
    return ("pytest", "-v", "-p", "no:cacheprovider", "--durations=12", f"--junitxml={{results}}/{name}.xml", *args)


def stage_specs(workers: str, host_workers: str) -> list[StageSpec]:
    """The stages in the order they are started when they can be."""
    parallel = ("-n", workers, "--dist", "loadfile")
    step = ("bash", "scripts/test-stage.sh")
    return [
        StageSpec("bootstrap", SETUP, ("bash", "scripts/bootstrap.sh"), slots=1),
        StageSpec("image", SETUP, ("bash", "scripts/build-image.sh"), ("bootstrap",), nice=5),
        StageSpec("prepared-image", SETUP, ("bash", "scripts/build-prepared-image.sh"), ("image",), nice=5),
        StageSpec("contract-venvs", SETUP, ("python", "tests/contract/prepare_venvs.py"), ("bootstrap",), nice=10),
        StageSpec("yamllint", "lint", ("yamllint", "--strict", "."), ("bootstrap",)),
        StageSpec("ruff", "lint", ("ruff", "check", "."), ("bootstrap",)),
        StageSpec("ansible-doc", "lint", (*step, "module-docs"), ("bootstrap",)),
        StageSpec("execution-environment", "lint", (*step, "ee-create"), ("bootstrap",)),
        StageSpec("ansible-test-sanity", "lint", ("bash", "scripts/ansible_test.sh", "sanity"), ("bootstrap",)),
        StageSpec("ansible-test-units", "unit", (*step, "ansible-test-units"), ("bootstrap",), slots=2,
                  junit=("ansible-test-units-*.xml",)),
        StageSpec("pytest", "unit",
                  pytest_argv("pytest", *parallel, "-m", "not container", "--ignore=tests/unit/plugins", "tests/unit",
                              "tests/integration"),
                  ("bootstrap",), slots=2, junit=("pytest.xml",)),
        StageSpec("ansible-lint", "lint", ("ansible-lint", "--strict", "-q"), ("bootstrap",)),
        StageSpec("molecule-provision", "molecule", (*step, "molecule", "provision"), ("image",),
                  junit=("molecule-provision.xml",)),
        StageSpec("contracts", "contract", pytest_argv("contracts", *parallel, "tests/contract"),
                  ("contract-venvs",), slots=2, junit=("contracts.xml",)),
        # Its workers boot systemd hosts and start the engines' real front ends, whose start-up (imports, about a
        # CPU minute each) meets the stall timeouts when other stages take the cores: it holds one slot per worker,
        # so that with the default budget it runs once everything else has ended.
        StageSpec("host-scenarios", "host",
                  pytest_argv("host-scenarios", "-n", host_workers, "--dist", "loadfile", "-m", "container",
                              "tests/integration"),
                  ("prepared-image", "contract-venvs"), slots=int(host_workers), junit=("host-scenarios.xml",)),
    ]


def wanted_specs(specs: Sequence[StageSpec], parts: Sequence[str], molecule: Sequence[str] | None = None
                 ) -> list[StageSpec]:
    """The stages of the asked parts, and the setup stages they need (transitively)."""
    by_name = {spec.name: spec for spec in specs}
    chosen = {spec.name for spec in specs if spec.part in parts
              and (molecule is None or spec.part != "molecule" or spec.name.split("-", 1)[1] in molecule)}
    pending = list(chosen)
    while pending:
        for need in by_name[pending.pop()].needs:
            if need not in chosen:
                chosen.add(need)
                pending.append(need)
    return [spec for spec in specs if spec.name in chosen]


# ---------------------------------------------------------------------------------------------------- JUnit counts


@dataclass
class Counts:
    """JUnit test cases by outcome; xfailed are among the skipped (pytest writes an expected failure as a skip)."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    xfailed: int = 0
    # The failed and errored cases, each "<test id>: <the start of its failure message>", in the file's order.
    failures: list[str] = field(default_factory=list)

    def add(self, other: Counts) -> None:
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped
        self.xfailed += other.xfailed
        self.failures += other.failures

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped

    def text(self) -> str:
        parts = [f"{self.passed} passed"] + [f"{n} {word}" for n, word in ((self.failed, "failed"),
                                                                          (self.skipped, "skipped")) if n]
        return f"{self.total} tests ({', '.join(parts)})"


# How much of a failure's message the closing section shows: enough for its first sentence, so that a log read only
# from its end (CI keeps the end) still says why each test failed.
FAILURE_CHARS = 400


def failure_line(case: ET.Element, failure: ET.Element) -> str:
    """A failed case as one line: its test id and the start of its message, whitespace folded."""
    test = "::".join(part for part in (case.get("classname", ""), case.get("name", "")) if part)
    message = " ".join((failure.get("message") or failure.text or "").split())
    if len(message) > FAILURE_CHARS:
        message = message[:FAILURE_CHARS] + " ..."
    return f"{test}: {message}" if message else test


def junit_counts(path: Path) -> Counts:
    counts = Counts()
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        counts.failed += 1  # a JUnit file cut short (a killed stage) counts as a failure, never as nothing
        counts.failures.append(f"{path.name}: the JUnit file cannot be read (cut short by a killed stage?)")
        return counts
    for case in root.iter("testcase"):
        outcomes = {child.tag: child for child in case}
        if outcomes.keys() & {"failure", "error"}:
            counts.failed += 1
            counts.failures.append(failure_line(case, outcomes.get("failure", outcomes.get("error"))))
        elif "skipped" in outcomes:
            counts.skipped += 1
            counts.xfailed += outcomes["skipped"].get("type") == "pytest.xfail"
        else:
            counts.passed += 1
    return counts


def stage_counts(results: Path, patterns: Sequence[str]) -> Counts | None:
    """The test cases of a stage's JUnit files; None for a stage that has none (a linter) or wrote none."""
    files = sorted({path for pattern in patterns for path in results.glob(pattern)})
    if not files:
        return None
    counts = Counts()
    for path in files:
        counts.add(junit_counts(path))
    return counts


# -------------------------------------------------------------------------------------------------------- outcomes


@dataclass
class Outcome:
    """What became of a stage: passed, failed, timed out, or skipped (with why)."""

    name: str
    status: str = "pending"  # pending, running, passed, failed, timed out, interrupted, skipped
    rc: int | None = None
    started_s: float | None = None  # since the run began
    seconds: float | None = None
    why: str = ""
    counts: Counts | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def reason(self) -> str:
        """Why a stage did not pass, in a few words: its failed tests, its status, or why it did not run."""
        if self.status == "skipped":
            return f"skipped: {self.why}"
        if self.status in ("timed out", "interrupted"):
            return self.why or self.status
        if self.counts is not None and self.counts.failed:
            return f"{self.counts.failed} failed"
        if self.why:
            return self.why
        return f"exit {self.rc}" if self.rc is not None else self.status

    def row(self) -> str:
        start = "" if self.started_s is None else f"{self.started_s:.0f}s"
        took = "" if self.seconds is None else f"{self.seconds:.0f}s"
        tests = "" if self.counts is None else self.counts.text()
        verdict = self.status if self.passed else f"{self.status.upper()} ({self.reason()})"
        if self.status == "skipped":
            verdict = f"SKIPPED ({self.why})"
        return f"{self.name:<24} {start:>6} {took:>6}  {verdict}" + (f"; {tests}" if tests else "")


def closing_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """The stage table and the closing line, last."""
    counts = Counts()
    for outcome in outcomes:
        if outcome.counts is not None:
            counts.add(outcome.counts)
    failures = [f"  {outcome.name}: {line}" for outcome in outcomes if outcome.counts is not None
                for line in outcome.counts.failures]
    lines = ["", "### failed tests (stage: test: the start of its failure)", *failures] if failures else []
    lines += ["", "### stages (name, started at, took, status; test cases)",
             *(f"  {outcome.row()}" for outcome in outcomes)]
    if counts.xfailed:
        lines.append(f"of the skipped tests, {counts.xfailed} are expected failures "
                     "(strict xfail: known engine defects, named in each)")
    bad = [outcome for outcome in outcomes if not outcome.passed]
    passed = len(outcomes) - len(bad)
    tail = f"{passed} of {len(outcomes)} stages passed; {counts.text()}"
    if bad:
        lines.append("FAILED: " + ", ".join(f"{o.name} ({o.reason()})" for o in bad) + f"; {tail}")
    else:
        lines.append(f"PASSED: {tail}")
    return lines


# ----------------------------------------------------------------------------------------------------------- runner


class Printer:
    """Lines from several stages, each whole, prefixed with the stage's name."""

    def __init__(self, out=None) -> None:
        self.out = out or sys.stdout
        self.lock = threading.Lock()

    def line(self, text: str) -> None:
        with self.lock:
            self.out.write(text + "\n")
            self.out.flush()


@dataclass
class Running:
    spec: StageSpec
    process: subprocess.Popen
    started: float
    reader: threading.Thread
    deadline: float
    signalled: list[int] = field(default_factory=list)


class Runner:
    """Runs the stages: see the module's docstring. ``clock`` and ``poll_s`` are injected by the tests."""

    def __init__(self, specs: Sequence[StageSpec], results: Path, *, slots: int, timeout_s: float,
                 printer: Printer | None = None, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = 0.2, env: dict[str, str] | None = None, kill_grace_s: float = 20.0) -> None:
        self.specs = list(specs)
        self.results = results
        self.slots = max(slots, 1)
        self.timeout_s = timeout_s
        self.printer = printer or Printer()
        self.clock = clock
        self.poll_s = poll_s
        self.env = env if env is not None else dict(os.environ)
        self.kill_grace_s = kill_grace_s
        self.t0 = clock()
        self.outcomes = {spec.name: Outcome(spec.name) for spec in self.specs}
        self.running: dict[str, Running] = {}

    # -- one stage

    def since_start(self) -> float:
        return self.clock() - self.t0

    def say(self, text: str) -> None:
        self.printer.line(f"### [{self.since_start():5.0f}s] {text}")

    def argv_of(self, spec: StageSpec) -> list[str]:
        argv = [arg.replace("{results}", str(self.results)) for arg in spec.argv]
        return (["nice", "-n", str(spec.nice)] if spec.nice else []) + argv

    def start(self, spec: StageSpec) -> None:
        outcome = self.outcomes[spec.name]
        outcome.status, outcome.started_s = "running", self.since_start()
        self.say(f"{spec.name}: started" + (f" (needs {', '.join(spec.needs)})" if spec.needs else ""))
        env = {**self.env, "BWS_RESULTS": str(self.results), "PYTHONUNBUFFERED": "1"}
        log = (self.results / f"{spec.name}.log").open("w", encoding="utf-8", errors="replace")
        try:
            process = subprocess.Popen(self.argv_of(spec), cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            log.write(f"could not start: {exc}\n")
            log.close()
            self.finish(spec, rc=127, why=f"could not start: {exc}")
            return
        reader = threading.Thread(target=self.relay, args=(spec.name, process, log), daemon=True)
        reader.start()
        self.running[spec.name] = Running(spec, process, self.clock(), reader, self.clock() + self.timeout_s)

    def relay(self, name: str, process: subprocess.Popen, log) -> None:
        with log:
            for raw in iter(process.stdout.readline, b""):
                text = raw.decode("utf-8", errors="replace").rstrip("\n")
                log.write(text + "\n")
                self.printer.line(f"[{name}] {text}")

    def finish(self, spec: StageSpec, rc: int, why: str = "", ended: str = "") -> None:
        """Record how a stage ended; ``ended`` is "timed out" or "interrupted" for a stage this runner stopped."""
        outcome = self.outcomes[spec.name]
        running = self.running.pop(spec.name, None)
        if running is not None:
            running.reader.join(timeout=10)
            outcome.seconds = self.clock() - running.started
        outcome.rc = rc
        outcome.counts = stage_counts(self.results, spec.junit)
        if ended:
            outcome.status, outcome.why = ended, why
        elif rc == 0 and (outcome.counts is None or outcome.counts.failed == 0):
            outcome.status = "passed"
        else:
            outcome.status, outcome.why = "failed", why
        if spec.junit and outcome.counts is None and outcome.status == "passed":
            outcome.status, outcome.why = "failed", "wrote no JUnit file: its tests did not run"
        took = "" if outcome.seconds is None else f" in {outcome.seconds:.0f}s"
        tests = "" if outcome.counts is None else f"; {outcome.counts.text()}"
        self.say(f"{spec.name}: {outcome.status if outcome.passed else outcome.status.upper()}{took}{tests}")

    # -- signals: only the groups this runner started

    def signal_group(self, running: Running, sig: int) -> None:
        pid = running.process.pid
        if running.process.poll() is not None:
            return
        try:
            if os.getpgid(pid) != pid:  # no longer the group leader we started: never signal someone else's group
                return
            os.killpg(pid, sig)
            running.signalled.append(sig)
        except ProcessLookupError:
            pass

    def end_overdue(self, running: Running) -> None:
        now = self.clock()
        if not running.signalled and now >= running.deadline:
            self.say(f"{running.spec.name}: past its {self.timeout_s:.0f}s limit (BWS_STAGE_TIMEOUT_S): SIGTERM")
            self.signal_group(running, signal.SIGTERM)
        elif running.signalled == [signal.SIGTERM] and now >= running.deadline + self.kill_grace_s:
            self.signal_group(running, signal.SIGKILL)

    def stop_all(self) -> None:
        for running in list(self.running.values()):
            self.signal_group(running, signal.SIGTERM)
        end = time.monotonic() + self.kill_grace_s  # real time: the run is ending, the injected clock may not move
        while any(r.process.poll() is None for r in self.running.values()) and time.monotonic() < end:
            time.sleep(self.poll_s)
        for running in list(self.running.values()):
            self.signal_group(running, signal.SIGKILL)
            running.process.wait()
            self.finish(running.spec, running.process.returncode, why="the run was interrupted", ended="interrupted")

    # -- the schedule

    def blocked_by(self, spec: StageSpec) -> str | None:
        """Why a stage can never run (a stage it needs did not pass), or None."""
        for need in spec.needs:
            outcome = self.outcomes.get(need)
            if outcome is None:
                return f"needs {need}, which is not part of this run"
            if outcome.status in ("failed", "timed out", "interrupted", "skipped"):
                return f"needs {need}, which {'did not run' if outcome.status == 'skipped' else outcome.status}"
        return None

    def ready(self, spec: StageSpec) -> bool:
        return all(self.outcomes[need].passed for need in spec.needs)

    def used_slots(self) -> int:
        return sum(running.spec.slots for running in self.running.values())

    def schedule(self) -> None:
        for spec in self.specs:
            outcome = self.outcomes[spec.name]
            if outcome.status != "pending":
                continue
            why = self.blocked_by(spec)
            if why is not None:
                outcome.status, outcome.why = "skipped", why
                self.say(f"{spec.name}: SKIPPED ({why})")
            elif self.ready(spec) and (not self.running or self.used_slots() + spec.slots <= self.slots):
                self.start(spec)

    def reap(self) -> None:
        for _name, running in list(self.running.items()):
            rc = running.process.poll()
            if rc is None:
                self.end_overdue(running)
            else:
                overdue = bool(running.signalled)
                self.finish(running.spec, rc, why=f"killed after {self.timeout_s:.0f}s" if overdue else "",
                            ended="timed out" if overdue else "")

    def run(self) -> list[Outcome]:
        while not STOP.is_set():
            self.schedule()
            if not self.running:
                break
            STOP.wait(self.poll_s)
            self.reap()
        if STOP.is_set():
            self.say("interrupted: stopping the running stages")
            self.stop_all()
            for outcome in self.outcomes.values():
                if outcome.status == "pending":
                    outcome.status, outcome.why = "skipped", "the run was interrupted"
        return [self.outcomes[spec.name] for spec in self.specs]


# Set by SIGTERM (a CI runner's cancel) or SIGINT (Ctrl-C): the main loop, between two of its steps, ends the running
# stages' groups and prints the table. A flag, not an exception, so that no step is cut in half (a stage started
# but not yet recorded would be left running).
STOP = threading.Event()


def interrupted(signum: int, frame: object) -> None:
    STOP.set()


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, required=True, help="folder for the logs and JUnit files")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--list", action="store_true", help="print the stages that would run, and what each needs")
    return parser.parse_args(argv)


def env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise SystemExit(f"error: {name}={text!r}: a whole number >= 1")
    return int(text)


def stage_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The stages' environment: the project venv's bin first on PATH. This scheduler may have been started through
    a pyenv shim (no venv yet on a fresh machine), and pyenv prepends its version's bin, with a pytest and a python of
    its own, to the PATH its children inherit."""
    env = dict(environ)
    venv = env.get("VENV_DIR")
    if venv:
        first = f"{venv}/bin"
        env["PATH"] = ":".join([first, *(entry for entry in env.get("PATH", "").split(":") if entry != first)])
    return env


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    molecule = os.environ.get("BWS_MOLECULE_SCENARIOS")
    specs = wanted_specs(stage_specs(str(env_int("BWS_TEST_WORKERS", 2)), str(env_int("BWS_HOST_WORKERS", 5))),
                         args.parts, molecule.split() if molecule else None)
    if args.list:
        for spec in specs:
            print(f"{spec.name:<24} {spec.part:<9} slots {spec.slots}  needs {', '.join(spec.needs) or '-'}")
        return 0
    args.results.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    runner = Runner(specs, args.results, slots=env_int("BWS_TEST_SLOTS", 5),
                    timeout_s=env_int("BWS_STAGE_TIMEOUT_S", 3000), env=stage_environment(os.environ))
    outcomes = runner.run()
    for line in closing_lines(outcomes):
        runner.printer.line(line)
    return 0 if all(outcome.passed for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
