"""A new user's first hour, as the README writes it: the quick-start and sandbox commands, taken from README.md
(its "Quick start" section's shell blocks, not a copy of them), run in the order given in one shell, in a scratch
HOME with BWS_PYTHON set, as root on this machine.

Every command the section names is either run or skipped for a reason listed in SKIPPED (the test command itself,
Python routes that need more than PyPI and the Debian mirror): a command the README gains that is neither fails
`test_every_quick_start_command_is_run_or_skipped_for_a_reason`, which runs without podman.

What the scratch HOME shares with the machine: root's podman storage (the test-host image, built by the test
command's own bootstrap), the system's pip configuration, and pip's download cache (PIP_CACHE_DIR, so that the
same wheels are not downloaded twice in one test run). Everything under HOME (the venv, the collections, the
containers.conf) is made anew by the commands themselves.

The commands run against a sandbox of their own (BWS_SANDBOX_NAME, which scripts/sandbox.sh and inventory/sandbox
read), so the test runs whatever the user did before: a `bws-sandbox` of the user's is left exactly as it was (same
container, same release serving, same engine process), which the test checks. Where there is none, none may appear
(a command that reached for it would have booted it).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
USERS_SANDBOX = "bws-sandbox"  # scripts/sandbox.sh's default container, inventory/sandbox/hosts.yml's host
SANDBOX = "bws-readme-first-hour"  # this test's own (BWS_SANDBOX_NAME)
# Commands of the quick start that this test does not run, and why (a regular expression of the command each).
SKIPPED = {
    r"^bash scripts/test\.sh$": "the test command itself: this test runs inside it (.ci/run)",
    r"^sudo apt install python3\.12-venv$": "Ubuntu 24.04's route to Python 3.12; this machine is Debian 12",
    r"uv python install": "uv's managed Python downloads the interpreter from GitHub (python-build-standalone), "
    "beyond PyPI and the Debian mirror",
    r"^pyenv install": "pyenv builds Python from python.org's sources, beyond PyPI and the Debian mirror",
}
PROGRAMS = ("bash", "source", "ansible-playbook", "sudo", "apt", "pipx", "pyenv", "python3")
MARK = "@@readme-step"


def quick_start() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## Quick start")
    return text[start : text.index("\n## ", start + 1)]


def block_commands(section: str) -> list[str]:
    """The commands of the section's shell blocks, in order, their trailing comments dropped."""
    commands = []
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", section, flags=re.S):
        commands += [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]
    return commands


def prose_commands(section: str) -> list[str]:
    """Commands the section's prose names in code spans (`apt install ...`): a program and an argument."""
    prose = re.sub(r"```.*?```", "", section, flags=re.S)
    spans = re.findall(r"`([^`\n]+)`", prose)
    return [span for span in spans if " " in span and span.split()[0].split("=")[-1] in PROGRAMS]


def skip_reason(command: str) -> str | None:
    return next((why for pattern, why in SKIPPED.items() if re.search(pattern, command)), None)


def test_every_quick_start_command_is_run_or_skipped_for_a_reason():
    section = quick_start()
    blocks, prose = block_commands(section), prose_commands(section)
    assert "bash scripts/sandbox.sh" in blocks and len(blocks) >= 8, blocks
    # The prose's commands are the Python routes: none of them is run, so each needs its reason.
    assert [c for c in prose if skip_reason(c) is None] == [], "a quick-start command is neither run nor skipped"
    # A block's command is run unless skipped; a skipped one must still be in the README (no stale reasons).
    named = blocks + prose
    assert [p for p in SKIPPED if not any(re.search(p, c) for c in named)] == [], "a reason for a command gone"


def python_312() -> str:
    """A Python >= 3.12 outside any venv, as a user would point BWS_PYTHON at it."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def scratch_env(home: Path) -> dict[str, str]:
    pip_cache = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, check=False
    ).stdout.strip()
    env = {
        "HOME": str(home),
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",  # a fresh root login's
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "BWS_PYTHON": python_312(),
        "BWS_SANDBOX_NAME": SANDBOX,
    }
    if pip_cache:
        env["PIP_CACHE_DIR"] = pip_cache
    return env


def shell_script(commands: list[str]) -> str:
    """One shell, as a user's terminal: each command in turn (state such as `source` carries over), its exit
    status and duration marked; the first failure ends it."""
    lines = ["cd " + shlex.quote(str(REPO))]
    for number, command in enumerate(commands):
        lines += [
            f"echo '{MARK} {number} start'; start=$EPOCHREALTIME",
            command,
            f'rc=$?; echo "{MARK} {number} rc $rc $(awk "BEGIN {{ print $EPOCHREALTIME - $start }}")"',
            "[ $rc -eq 0 ] || exit $rc",
        ]
    return "\n".join(lines) + "\n"


def container_exists(name: str) -> bool:
    return subprocess.run(["podman", "container", "exists", name], check=False).returncode == 0


def sandbox_fingerprint(name: str, since: str) -> dict[str, str]:
    """What must not change in a user's sandbox: the container, its boot, the release state and engine processes,
    and no file written under /etc, /opt or the release state since `since` (seconds since the epoch)."""
    def podman(*args: str) -> str:
        return subprocess.run(["podman", *args], capture_output=True, text=True, check=False).stdout.strip()

    return {
        "id": podman("inspect", "-f", "{{.Id}} {{.State.StartedAt}}", name),
        "state.json": podman("exec", name, "sh", "-c", "cat /var/lib/llm-serving/state.json 2>/dev/null || true"),
        "engines": podman("exec", name, "systemctl", "show", "-p", "MainPID,ActiveState,FragmentPath",
                          "sglang", "vllm"),
        "changed files": podman("exec", name, "sh", "-c",
                                f"find /etc /var/lib/llm-serving /opt -newermt @{since} 2>/dev/null | sort"),
    }


@pytest.mark.container
def test_the_quick_start_and_sandbox_commands_work_as_written_in_a_scratch_home(
    tmp_path: Path, record_property
):
    assert not container_exists(SANDBOX), f"a container {SANDBOX} is left from an earlier run: podman rm -f {SANDBOX}"
    since = str(int(time.time()))
    # The user's bws-sandbox as it is, or its absence: none is booted to stand for it (this test boots only the
    # README's, under its own name). Where there is none, a command aimed at it would boot it: its fingerprint stays
    # empty.
    before = sandbox_fingerprint(USERS_SANDBOX, since)
    commands = block_commands(quick_start())
    to_run = [c for c in commands if skip_reason(c) is None]
    skipped = {c: skip_reason(c) for c in commands + prose_commands(quick_start()) if skip_reason(c)}
    home = tmp_path / "home"
    home.mkdir()
    started = time.monotonic()
    try:
        run = subprocess.run(
            ["bash", "--noprofile", "--norc", "-c", shell_script(to_run)],
            env=scratch_env(home),
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
    finally:
        subprocess.run(["podman", "rm", "-f", "--ignore", "-t", "0", SANDBOX], capture_output=True, check=False)
    output = run.stdout + run.stderr
    steps = {
        int(n): (int(rc), float(s)) for n, rc, s in re.findall(rf"^{MARK} (\d+) rc (\d+) ([0-9.]+)$", output, re.M)
    }
    report = {
        "ran": [
            {"command": c, "rc": steps.get(i, (None, None))[0], "seconds": steps.get(i, (None, None))[1]}
            for i, c in enumerate(to_run)
        ],
        "skipped": skipped,
        "total_s": round(time.monotonic() - started, 1),
    }
    record_property("readme_first_hour", json.dumps(report))
    print(json.dumps(report, indent=1))
    failed = next((step for step in report["ran"] if step["rc"] != 0), None)
    assert failed is None, f"README command failed or did not run: {failed}\n{output[-6000:]}"

    # Each sandbox.sh call ends with its outcome line; the sandbox play and verify report what they checked.
    outcomes = re.findall(r"^Sandbox outcome: (\S+) (.*)$", output, re.M)
    assert [playbook for playbook, _ in outcomes] == [
        "deploy_sglang.yml",
        "deploy_vllm.yml",
        "verify.yml",
        "deploy_sglang.yml",
        "teardown.yml",
    ], outcomes
    assert "ran in check mode" in outcomes[3][1] and all("ran for real" in o for _, o in outcomes[:3] + outcomes[4:])
    assert re.search(r"speed-?up.{0,80}not measured", output, re.I | re.S), "verify did not report the speed-up"
    # The first command's deploy checked the sandbox's simulated GPUs and said that they are simulated.
    first = " ".join(output.split(f"{MARK} 0 start", 1)[-1].split(f"{MARK} 0 rc", 1)[0].split())
    assert ("8 GPU(s) (NVIDIA RTX PRO 6000 Blackwell Server Edition) with driver 580.105.08 and compute capability "
            "12.0") in first, first[-4000:]
    assert "SIMULATED GPUs" in first and "NVIDIA-SMI TEST DOUBLE" in first and "were NOT checked" not in first
    assert re.search(r"^bws-sandbox\s*: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", output, re.M)
    assert f"sandbox {SANDBOX} removed" in output and not container_exists(SANDBOX)
    # The user's sandbox is exactly as it was: same container and boot, same release serving, same engine process.
    assert sandbox_fingerprint(USERS_SANDBOX, since) == before
    # Everything the commands installed went under the scratch HOME, nothing into the machine's.
    assert (home / ".cache" / "blackwell-serving" / "venv" / "bin" / "ansible-playbook").is_file()
    assert (home / ".cache" / "blackwell-serving" / "collections").is_dir()
