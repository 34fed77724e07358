"""teardown.yml through ansible-runner against real processes holding stand-in GPU device files.

Each test re-runs itself in a new PID namespace (gpu_helpers.in_new_pid_namespace), so only processes it
started can be seen or signalled. The GPUs are simulated by tests/doubles/nvidia_smi_double.py over stand-in
device files of the constructed 8-GPU host (device minor != index).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gpu_helpers import (
    Sim,
    alive,
    changed_count,
    in_new_pid_namespace,
    release_result,
    run_playbook,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def sim(tmp_path):
    s = Sim(tmp_path)
    yield s
    s.stop_all()


def preflight_playbook(tmp_path: Path, gpus: list[str]) -> Path:
    """What roles/engine_service/tasks/preflight.yml runs on the GPUs a profile needs: gpu_release's holders check."""
    playbook = tmp_path / "preflight.yml"
    playbook.write_text(json.dumps([{
        "name": "Preflight", "hosts": "gpu_servers", "gather_facts": False,
        "tasks": [{"name": "Holders", "ansible.builtin.include_role": {"name": "gpu_release", "tasks_from": "holders"},
                   "vars": {"gpu_release_gpus": gpus}}],
    }]))  # fmt: skip
    return playbook


def files_holding(directory: Path, word: bytes) -> list[str]:
    return [str(path.relative_to(directory)) for path in sorted(directory.rglob("*"))
            if path.is_file() and word in path.read_bytes()]


@in_new_pid_namespace
def test_teardown_releases_engines_spares_bystanders_and_is_idempotent(sim, tmp_path):
    shm = sim.shm
    for name in ["nccl-stale1", "psm_open", "sem.mp-mapped", "torch_1_2_3", "psm_engine", "unrelated-file"]:
        (shm / name).write_bytes(b"\0" * 4096)
    # another user's idle PyTorch entry: no process holds it, it matches torch_*, and it is not ours
    (shm / "torch_9_9_9").write_bytes(b"\0" * 4096)
    os.chown(shm / "torch_9_9_9", 65534, 65534)

    # Engine processes
    (tp0,) = sim.spawn(
        ["sglang::scheduler_TP0"],
        {"open": [*sim.compute_files(0), str(shm / "psm_engine")]},
        sim.mem(g0=40960),
    )
    (tp1,) = sim.spawn(
        ["sglang::scheduler_TP1"], {"open": sim.compute_files(1), "ignore_term": True}, sim.mem(g1=40960)
    )
    launcher, launcher_child = sim.spawn(
        ["python3", "-m", "sglang.launch_server", "--model-path", "/models/x"],
        {
            "open": sim.compute_files(2),
            "child": {"argv": ["python3", "tokenizer_worker.py"], "open": sim.compute_files(3)},
        },
        sim.mem(g2=1024, g3=30720),
    )
    (all8,) = sim.spawn(["VLLM::EngineCore"], {"open": sim.compute_files(*range(8))}, sim.mem(g5=512))
    # Bystanders
    (persistenced,) = sim.spawn(
        ["nvidia-persistenced", "--user", "nvidia-persistenced"],
        {"open": [str(sim.dev / "nvidiactl"), sim.gpu_file(0)]},
    )
    # An NVML client opens nvidia-uvm too (driver 580): only nvidia-smi's compute-app list tells it apart.
    (monitor,) = sim.spawn(
        ["python3", "gpu_exporter.py"],
        {"open": [*sim.compute_files(), *(sim.gpu_file(i) for i in range(8))]},
        {"NVSIM_NVML_ONLY": "1"},
    )
    (foreign,) = sim.spawn(
        ["python3", "train.py"], {"open": [*sim.compute_files(6), str(shm / "psm_open")]}, sim.mem(g6=2048)
    )
    (mapper,) = sim.spawn(["python3", "shm_reader.py"], {"map": [str(shm / "sem.mp-mapped")]})
    (journal,) = sim.spawn(["journalctl", "-u", "sglang.service", "sglang::scheduler_TP0"], {})
    engines = [tp0, tp1, launcher, launcher_child, all8]
    bystanders = [persistenced, monitor, foreign, mapper, journal]

    # 1. --check: says what it would do, touches nothing
    runner, results = run_playbook(tmp_path, sim.extravars(gpu_release_grace_s=1), check=True)
    assert runner.rc == 0, runner.stdout
    res = release_result(results)
    assert set(res["signalled"]["TERM"]) == set(engines)
    assert all(alive(p) for p in engines + bystanders)
    assert sorted(os.listdir(shm)) == sorted(
        ["nccl-stale1", "psm_open", "sem.mp-mapped", "torch_1_2_3", "psm_engine", "unrelated-file", "torch_9_9_9"]
    )
    assert sorted(os.path.basename(p) for p in res["shm"]["would_remove"]) == [
        "nccl-stale1",
        "psm_engine",
        "torch_1_2_3",
    ]

    # 2. the real run
    runner, results = run_playbook(tmp_path, sim.extravars(gpu_release_grace_s=1))
    assert runner.rc == 0, runner.stdout
    res = release_result(results)
    assert not any(alive(p) for p in engines), [p for p in engines if alive(p)]
    assert all(alive(p) for p in bystanders), [p for p in bystanders if not alive(p)]
    targets = {t["pid"]: t for t in res["targets"]}
    assert set(targets) == set(engines)
    assert targets[tp1]["signals"] == ["TERM", "KILL"]  # it ignored TERM: KILLed after it
    assert targets[tp0]["signals"] == ["TERM"]  # it went at TERM
    assert targets[launcher_child]["reason"] == f"descendant of {launcher}"
    assert targets[all8]["gpus"] == list(range(8))

    gpus = {g["index"]: g for g in res["gpus"]}
    assert gpus[5]["memory_used_before_mib"] == 512 and gpus[5]["memory_used_after_mib"] == 0
    assert [h["used_mib"] for h in gpus[5]["holders"] if h["pid"] == all8] == [512]
    assert [h["used_mib"] for h in gpus[4]["holders"] if h["pid"] == all8] == [None]  # holds the file, no memory
    assert gpus[0]["minor"] == 2 and gpus[0]["freed_mib"] == 40960
    for index in (0, 1, 2, 3, 4, 5, 7):
        assert gpus[index]["clean"] is True and gpus[index]["memory_used_after_mib"] == 0
    assert gpus[6]["clean"] is False and gpus[6]["memory_used_after_mib"] == 2048
    assert [f["pid"] for f in res["foreign_holders"]] == [foreign]
    assert res["foreign_holders"][0]["gpus"] == [6]
    spared = {s["pid"]: s["reason"] for s in res["spared"]}
    assert spared[persistenced].startswith("protected daemon (nvidia-persistenced)")
    assert spared[monitor].startswith("NVML-only GPU holder")

    assert sorted(os.listdir(shm)) == ["psm_open", "sem.mp-mapped", "torch_9_9_9", "unrelated-file"]
    kept = {os.path.basename(k["path"]): k["reason"] for k in res["shm"]["kept"]}
    assert kept == {
        "psm_open": f"open or mapped by PIDs {foreign}",
        "sem.mp-mapped": f"open or mapped by PIDs {mapper}",
        "torch_9_9_9": "owned by nobody (uid 65534), not by root",
    }

    summary = results["Teardown | summary"]["msg"]
    assert summary[0].startswith("no systemd on this host") or summary[0].startswith("unit ")
    assert any(line.startswith(f"foreign, not signalled: {foreign} ") and "on GPUs [6]" in line for line in summary)
    assert any(line.startswith("GPU 6 (minor 4)") and "NOT clean" in line for line in summary)

    # 3. again: nothing left to do
    runner, results = run_playbook(tmp_path, sim.extravars(gpu_release_grace_s=1))
    assert runner.rc == 0
    assert changed_count(runner) == 0, results
    assert release_result(results)["targets"] == []


@in_new_pid_namespace
def test_teardown_without_nvidia_driver_still_releases_and_says_so(sim, tmp_path):
    sim.write_config("no_driver")
    (shm_file := sim.shm / "nccl-x").write_bytes(b"x")
    (engine,) = sim.spawn(["VLLM::Worker_TP0"], {"open": sim.compute_files(0)})
    extravars = sim.extravars(gpu_release_grace_s=1, gpu_release_driver_proc_dir=str(tmp_path / "no-driver"))
    runner, results = run_playbook(tmp_path, extravars)
    assert runner.rc == 0, runner.stdout
    res = release_result(results)
    assert not alive(engine), res["spared"]
    assert not shm_file.exists()
    assert res["gpu_verification"] == "skipped" and res["driver_loaded"] is False
    summary = results["Teardown | summary"]["msg"]
    assert any(line.startswith("no NVIDIA driver on this host: GPU verification skipped") for line in summary)


def wedge(sim: Sim, index: int, **reading: int) -> None:
    """The double reports GPU ``index`` busy with no process, as killed processes can leave it after a hang."""
    sim.gpus[index].update(reading)
    sim.write_config("ok")


@in_new_pid_namespace
def test_teardown_fails_on_a_wedged_gpu_after_releasing_what_it_can(sim, tmp_path):
    wedge(sim, 3, utilization_pct=100, leaked_mib=30720)
    state_dir = tmp_path / "state"
    (state_dir / "releases" / "sglang-a").mkdir(parents=True)
    (state_dir / "releases" / "sglang-a" / "release.json").write_text('{"id": "sglang-a", "unit": "sglang.service"}')
    (state_dir / "state.json").write_text('{"current": "sglang-a", "previous": null, "status": "serving"}')
    (engine,) = sim.spawn(["sglang::scheduler_TP0"], {"open": sim.compute_files(2)}, sim.mem(g2=4096))
    extravars = sim.extravars(gpu_release_grace_s=1, gpu_release_wedged_window_s=0.3,
                              engine_service_state_dir=str(state_dir))  # fmt: skip
    runner, results = run_playbook(tmp_path, extravars)
    assert runner.rc != 0
    res = release_result(results)
    assert not alive(engine), "the engine is released before the GPUs are judged"
    assert res["msg"].startswith("wedged GPU, needs `nvidia-smi -r` (with nothing using it) or a reboot: GPU 3 (GPU-")
    assert "100 % utilisation and 30720 MiB used (idle <= 256 MiB) with no compute process" in res["msg"]
    summary = results["Summary of the GPU release"]["msg"]
    assert any(line.startswith("GPU 3 (minor 1): ") and "WEDGED" in line for line in summary), summary
    assert any(line.startswith("GPU 2 (minor 0): ") and line.endswith("; clean") for line in summary), summary
    assert '"status": "serving"' in (state_dir / "state.json").read_text(), "a failed teardown records nothing"


def test_the_deploy_preflight_check_refuses_a_wedged_gpu(sim, tmp_path):
    # roles/engine_service/tasks/preflight.yml runs exactly this entry point on the GPUs the profile needs. Report
    # only: it signals nothing, so it needs no PID namespace of its own.
    wedge(sim, 1, leaked_mib=8192)
    playbook = preflight_playbook(tmp_path, ["0", "1"])
    runner, results = run_playbook(tmp_path, sim.extravars(gpu_release_wedged_window_s=0.3), playbook=str(playbook))
    assert runner.rc != 0
    msg = results["Holders | foreign processes on the GPUs 0, 1"]["msg"]
    assert msg.startswith("wedged GPU, needs `nvidia-smi -r` (with nothing using it) or a reboot: GPU 1 (GPU-"), msg
    assert msg.endswith("Report only: nothing was stopped, signalled or removed."), msg


@in_new_pid_namespace
def test_no_command_line_reaches_the_play_output_or_the_runner_artifacts(sim, tmp_path):
    """A key on the command line of a process on the GPUs (a stranger's, one that put its command line in its title,
    an engine of ours) stays on the host: the preflight's holder report and the teardown name processes by pid,
    user and title, and no artifact ansible-runner keeps holds the key."""
    (stranger,) = sim.spawn(["python3", "serve.py", "--api-key", "SECRET-argv"], {"open": sim.compute_files(1)},
                            sim.mem(g1=2048))
    (titled,) = sim.spawn(["trainer --api-key SECRET-title"], {"open": sim.compute_files(0)}, sim.mem(g0=512))
    (engine,) = sim.spawn(["python3", "-m", "sglang.launch_server", "--api-key", "SECRET-engine"],
                          {"open": sim.compute_files(2)}, sim.mem(g2=4096))
    assert b"SECRET-argv" in Path(f"/proc/{stranger}/cmdline").read_bytes()

    preflight, results = run_playbook(tmp_path, sim.extravars(), playbook=str(preflight_playbook(tmp_path, ["0", "1"])))
    assert preflight.rc != 0, preflight.stdout
    msg = results["Holders | foreign processes on the GPUs 0, 1"]["msg"]
    assert f"PID {titled} trainer (root (uid 0)) on GPUs [0]" in msg and f"PID {stranger} python3 (root" in msg, msg

    teardown, results = run_playbook(tmp_path, sim.extravars(gpu_release_grace_s=1))
    assert teardown.rc == 0, teardown.stdout
    res = release_result(results)
    assert [(t["pid"], t["title"]) for t in res["targets"]] == [(engine, "python3")] and not alive(engine)
    assert {f["pid"]: f["title"] for f in res["foreign_holders"]} == {stranger: "python3", titled: "trainer"}
    summary = results["Teardown | summary"]["msg"]
    assert any(line.startswith(f"foreign, not signalled: {titled} trainer (root (uid 0)) on GPUs [0]")
               for line in summary), summary

    for run in (preflight, teardown):
        assert "SECRET" not in run.stdout
        assert files_holding(run.artifact_dir, b"SECRET") == [], run.artifact_dir
        assert files_holding(run.artifact_dir, b"trainer"), "the scan reads where the results are kept"


CAP_SYS_PTRACE = 19
NESTED_ENGINE = """
import os, sys
os.unshare(os.CLONE_NEWPID)
child = os.fork()
if child:
    print(child, flush=True)  # its PID as the test sees it (in its namespace it is 1)
    os.waitpid(child, 0)
    sys.exit(0)
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
os.execv("/usr/bin/python3", ["sglang::scheduler_TP0", "-c", "import time; time.sleep(600)"])
"""


def _without_ptrace(test):
    return in_new_pid_namespace(test, without=("sys_ptrace",))


@_without_ptrace
def test_without_cap_sys_ptrace_a_nested_engine_process_of_a_service_user_is_named_foreign_and_spared(sim, tmp_path):
    """Inside a container without CAP_SYS_PTRACE, root cannot read another user's /proc/<pid>/ns/pid: the scope
    takes the PID namespace from NSpid: in /proc/<pid>/status, and a process it cannot place is never a target.
    Here: an engine-titled process of an engine service user (nobody), in a PID namespace nested below teardown's."""
    status = Path("/proc/self/status").read_text().splitlines()
    effective = int(next(line for line in status if line.startswith("CapEff:")).split()[1], 16)
    assert not effective & (1 << CAP_SYS_PTRACE), "the test runs without CAP_SYS_PTRACE"
    launcher = subprocess.Popen([sys.executable, "-c", NESTED_ENGINE], stdout=subprocess.PIPE, text=True)
    sim.children.append(launcher)
    nested = int(launcher.stdout.readline())
    for _ in range(100):  # until the exec has happened
        if Path(f"/proc/{nested}/cmdline").read_bytes().startswith(b"sglang::scheduler_TP0"):
            break
        time.sleep(0.05)
    with pytest.raises(PermissionError):
        os.readlink(f"/proc/{nested}/ns/pid")
    try:
        runner, results = run_playbook(tmp_path, sim.extravars(gpu_release_grace_s=1,
                                                               gpu_release_service_users=["nobody"]))
        assert runner.rc == 0, runner.stdout
        assert alive(nested), "teardown signalled a process it could not place"
        res = release_result(results)
        assert res["targets"] == []
        (foreign,) = [f for f in res["foreign"] if f["pid"] == nested]
        assert "in another PID namespace (nested 1 level(s) below" in foreign["reason"], foreign
        summary = results["Teardown | summary"]["msg"]
        named = f"foreign, not signalled: {nested} sglang::scheduler_TP0"
        assert any(line.startswith(named) for line in summary), summary
    finally:
        os.kill(nested, 9)


@in_new_pid_namespace
def test_a_second_teardown_of_one_host_waits_for_the_first_then_fails_with_nothing_changed(sim, tmp_path):
    """Two teardowns at once both stopped, signalled and wrote state.json; the second now meets the host lock (held
    here as the first would hold it), fails naming it, and signals nothing; once it is free the teardown runs."""
    import fcntl

    lock = tmp_path / "release.lock"
    (engine,) = sim.spawn(["sglang::scheduler_TP0"], {"open": sim.compute_files(1)})
    holder = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    os.pwrite(holder, f"{os.getpid()}\n".encode(), 0)
    extravars = sim.extravars(gpu_release_grace_s=1, gpu_release_lock_file=str(lock), gpu_release_lock_timeout_s=0)
    runner, _ = run_playbook(tmp_path, extravars)
    text = " ".join(runner.stdout.split())
    assert runner.rc != 0, text[-3000:]
    assert (f"gpu_release: another release of this host's engines (a teardown, or a deploy's switch) holds {lock} "
            f"(pid {os.getpid()}) and did not end within 0 s; nothing was changed.") in text, text[-3000:]
    assert alive(engine) and changed_count(runner) == 0
    os.close(holder)
    runner, results = run_playbook(tmp_path, extravars)
    assert runner.rc == 0, runner.stdout[-3000:]
    assert not alive(engine) and release_result(results)["targets"][0]["pid"] == engine
