"""gpu_release against the /dev/shm entries of a real two-rank torch.distributed job (gloo, CPU).

The job runs under the CPU contract venv's python (torch of the pinned SGLang lock), spawned with
torch.multiprocessing; each rank carries SGLang's scheduler title (``sglang::scheduler_TP<rank>``), keeps a
``psm_*`` segment open and mapped and a ``torch_*`` entry (``file_system`` sharing) only mapped. A foreign,
non-engine process holds its own ``psm_*`` entry. Proved with the real module:

1. while the job runs, a release that targets no process keeps every entry a live rank has open or only
   mapped (and names the rank), keeps the foreign entry, and removes an entry nobody holds;
2. rank 1 is killed with SIGKILL in the middle of its all_reduce loop; rank 0 stays alive and stops making
   progress; ``playbooks/teardown.yml`` (ansible-playbook, local connection) then ends rank 0 and its
   descendants (only those), removes every stale entry of the job, and keeps the foreign process and its entry;
3. a second release finds nothing to do.

Everything runs in new PID and mount namespaces with a private tmpfs on /dev/shm: the test can reach only
processes it started and never touches the host's /dev/shm.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sglang_helpers import contract_python, free_port
from torch_shm_helpers import (
    INSIDE_ENV,
    REPO,
    Job,
    alive,
    private_namespace_argv,
    private_namespace_unavailable,
    private_shm_mounted,
    run_teardown,
    shm_use,
    wait_gone,
    wait_stalled,
)

from tests.module_utils_loader import use_repository_module_utils

use_repository_module_utils()
sys.path.insert(0, str(REPO / "plugins" / "modules"))

import gpu_release  # noqa: E402
from ansible.module_utils.testing import patch_module_args  # noqa: E402
from ansible_collections.blackwell.serving.plugins.module_utils.host.procfs import first_matching_pattern  # noqa: E402
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import (  # noqa: E402
    field_values,
    load_roster,
)

# The patterns the gpu_release role passes: every engine's of the engine roster.
ROSTER_PATTERNS = field_values(load_roster(), "process_patterns")

pytestmark = pytest.mark.contract

SHM = Path("/dev/shm")
TITLES = ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
ENGINE_SHM = gpu_release.ARGUMENT_SPEC["shm_patterns"]["default"]
VENV_ENV = "BWS_TORCH_PYTHON"
FOREIGN_CODE = """
import sys, time
from multiprocessing import resource_tracker, shared_memory
shm = shared_memory.SharedMemory(name="psm_bws_foreign", create=True, size=4096)
resource_tracker.unregister(shm._name, "shared_memory")
print("ready", flush=True)
time.sleep(600)
"""


def in_private_namespace(test):
    """Re-run the test in new PID + mount namespaces with a private /dev/shm; outside, assert it passed."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        if os.environ.get(INSIDE_ENV) == "1":
            assert private_shm_mounted(), "refusing to run: /dev/shm is not the private tmpfs"
            return test(*args, **kwargs)
        reason = private_namespace_unavailable()
        if reason:
            pytest.skip(reason)
        python = str(contract_python())  # skips (fails under CI) when the venv cannot be built
        nodeid = f"{inspect.getfile(test)}::{test.__name__}"
        argv = [sys.executable, "-m", "pytest", "-q", "-s", "-x", "-p", "no:cacheprovider", nodeid]
        proc = subprocess.run(
            private_namespace_argv(argv),
            cwd=REPO, env={**os.environ, INSIDE_ENV: "1", VENV_ENV: python},
            capture_output=True, text=True, timeout=170, check=False,
        )  # fmt: skip
        sys.stdout.write(proc.stdout[-5000:])
        assert proc.returncode == 0, f"in the private namespace:\n{proc.stdout[-8000:]}\n{proc.stderr[-2000:]}"
        return None

    return wrapper


def run_module(capsys, **args):
    """gpu_release's main() in this process, with the engines the role passes (the roster's); returns its result."""
    roster = load_roster()
    engines = {"units": field_values(roster, "unit"), "patterns": ROSTER_PATTERNS,
               "service_users": field_values(roster, "service_user")}
    with patch_module_args(engines | args), pytest.raises(SystemExit) as exc:
        gpu_release.main()
    out = json.loads(capsys.readouterr().out)
    assert exc.value.code == 0, out
    return out


def engine_entries() -> set[str]:
    import fnmatch

    return {n for n in os.listdir(SHM) if any(fnmatch.fnmatchcase(n, p) for p in ENGINE_SHM)}


def kept_by(result: dict) -> dict[str, str]:
    return {Path(k["path"]).name: k["reason"] for k in result["shm"]["kept"]}


def removed_by(result: dict) -> set[str]:
    return {Path(p).name for p in result["shm"]["removed"]}


def descendants_of(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid = int(Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(name))
    found, stack = set(), list(children.get(pid, []))
    while stack:
        p = stack.pop()
        if p not in found:
            found.add(p)
            stack.extend(children.get(p, []))
    return found


@in_private_namespace
def test_release_keeps_live_rank_entries_and_removes_what_a_killed_job_left(tmp_path, capsys):
    t0 = time.monotonic()
    python = os.environ[VENV_ENV]
    (SHM / "nccl-bws-stale").write_bytes(b"left by an earlier job")
    (SHM / "not-an-engine-entry").write_bytes(b"x")
    foreign = subprocess.Popen(
        ["python3", "-c", FOREIGN_CODE], executable=sys.executable, stdout=subprocess.PIPE, text=True
    )
    job = Job(python, tmp_path / "job", backend="gloo", device="cpu", port=free_port(), titles=TITLES, mib=0)
    report: dict = {}
    try:
        assert foreign.stdout.readline() == "ready\n"
        ranks = job.wait_ready()
        t_ready = time.monotonic()
        r0, r1 = ranks
        for r in ranks:
            cmdline = Path(f"/proc/{r['pid']}/cmdline").read_bytes()
            assert cmdline.split(b"\0")[0].rstrip() == r["title"].encode(), cmdline  # as setproctitle leaves it
            assert first_matching_pattern([r["title"]], ROSTER_PATTERNS)

        # Preconditions, from /proc: psm open and mapped by its rank; torch_* only mapped (fd closed).
        use = shm_use()
        for r in ranks:
            assert use[r["psm"]] == {"open": [r["pid"]], "mapped": [r["pid"]]}, (r["psm"], use.get(r["psm"]))
            assert use[r["torch_entry"]]["open"] == [], use[r["torch_entry"]]
            assert r["pid"] in use[r["torch_entry"]]["mapped"], use[r["torch_entry"]]
        assert use["psm_bws_foreign"]["open"] == [foreign.pid]
        assert "nccl-bws-stale" not in use

        # 1. The job is alive: a release that targets no process keeps what it holds.
        live = run_module(
            capsys, patterns=[], units=[], nvidia_smi=str(tmp_path / "no-nvidia-smi"), service_users=["root"]
        )
        kept = kept_by(live)
        for r in ranks:
            assert kept[r["psm"]] == f"open or mapped by PIDs {r['pid']}", kept
            assert str(r["pid"]) in kept[r["torch_entry"]].split("PIDs ")[1].split(", "), kept
        assert kept["psm_bws_foreign"] == f"open or mapped by PIDs {foreign.pid}"
        assert removed_by(live) == {"nccl-bws-stale"}
        assert live["targets"] == [] and live["gpu_verification"] == "skipped"
        job.wait_heartbeats_advance()  # the release did not disturb the job

        # 2. SIGKILL rank 1 in the middle of its all_reduce loop; rank 0 outlives it and stops progressing.
        job.wait_heartbeats_advance([1], timeout=10)  # rank 1 is running collectives when it is killed
        os.kill(r1["pid"], signal.SIGKILL)
        assert wait_gone([r1["pid"]], 30) == []  # a safety limit for the SIGKILLed rank to be reaped, not a bound
        stall = wait_stalled(job.work, 0, quiet_s=1.0)
        assert alive(r0["pid"]) and alive(job.launcher_pid()), "rank 0 or the launcher died with rank 1"
        leftover = engine_entries()
        holders = shm_use()
        stale = {n for n in leftover if n not in holders}
        assert r1["psm"] in stale, (leftover, holders)  # nothing cleans up after a SIGKILLed rank
        expected_targets = {r0["pid"]} | descendants_of(r0["pid"])

        teardown = run_teardown(
            tmp_path / "ansible",
            {
                "gpu_release_nvidia_smi": str(tmp_path / "no-nvidia-smi"),
                "gpu_release_grace_s": 2,
                "gpu_release_timeout_s": 20,
                "gpu_release_service_users": ["root"],  # the job runs as root here, standing for the engine user
            },
        )
        res = teardown["release"]
        assert teardown["rc"] == 0, teardown["output"]
        assert res is not None, "no gpu_release result captured"
        targets = {t["pid"]: t for t in res["targets"]}
        assert set(targets) == expected_targets, (targets, expected_targets)
        assert targets[r0["pid"]]["reason"] == "matches engine pattern 'sglang::*'"
        assert targets[r0["pid"]]["signals"] == ["TERM"], targets[r0["pid"]]
        assert all(t["exited"] for t in targets.values())
        assert foreign.pid not in targets and job.launcher_pid() not in targets
        assert wait_gone([job.launcher_pid()], 15) == [], "the launcher did not end after its ranks"
        assert alive(foreign.pid), "the foreign process was signalled"
        removed, kept_after = removed_by(res), kept_by(res)
        assert {r0["psm"], r1["psm"]} <= removed, removed
        # An entry gone but not removed by the module can only be torch's own clean-up: the torch_shm_manager
        # of a dead rank unlinks its torch_* entries about 2 s after its last client went away.
        cleaned_by_torch = leftover - removed - engine_entries()
        assert all(n.startswith("torch_") for n in cleaned_by_torch), cleaned_by_torch
        assert stale <= removed | cleaned_by_torch, (stale, removed)
        assert {n for n in stale if not n.startswith("torch_")} <= removed, (stale, removed)
        assert kept_after == {"psm_bws_foreign": f"open or mapped by PIDs {foreign.pid}"}, kept_after
        assert engine_entries() == {"psm_bws_foreign"}
        assert "not-an-engine-entry" in os.listdir(SHM)
        assert any("removed" in line for line in teardown["summary"] or []), teardown["summary"]

        # 3. Nothing left to do.
        again = run_module(capsys, nvidia_smi=str(tmp_path / "no-nvidia-smi"))
        assert again["changed"] is False and again["targets"] == [] and again["shm"]["removed"] == []

        report = {
            "title_set_by": r0["title_set_by"],
            "job_ready_s": round(t_ready - t0, 2),
            "rank0_after_peer_kill": stall,
            "live_release": {"kept": kept, "removed": sorted(removed_by(live))},
            "stale_before_teardown": sorted(stale),
            "entries_before_teardown": sorted(leftover),
            "teardown": {
                "wall_s": teardown["wall_s"],
                "module_elapsed_s": res["elapsed_s"],
                "release_s": res["release_s"],
                "targets": {str(p): t["reason"] for p, t in targets.items()},
                "removed": sorted(removed),
                "cleaned_by_torch_shm_manager": sorted(cleaned_by_torch),
                "kept": kept_after,
                "summary": teardown["summary"],
            },
            "total_s": round(time.monotonic() - t0, 2),
        }
        (tmp_path / "report.json").write_text(json.dumps(report, indent=1))
        print("TORCH-SHM-REPORT " + json.dumps(report))
    finally:
        job.stop()
        foreign.kill()
        foreign.wait()
