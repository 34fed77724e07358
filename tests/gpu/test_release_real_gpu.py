"""teardown.yml on a real NVIDIA GPU with real CUDA processes (PyTorch), via ansible-runner, local connection.

Holders (all started here, all in a private PID namespace): an SGLang-titled worker that exits on SIGTERM,
one that ignores SIGTERM, a ``python3 -m sglang.launch_server`` with a child that also holds memory, a
foreign CUDA process (must survive and be named), an NVML-only monitor and an ``nvidia-persistenced``-titled
NVML client (both must survive). Writes ``gpu_release_real_gpu.json`` (before/after, module result) to
``$BWS_GPU_RESULTS_DIR`` (default: the test's tmp dir).

Run: ``python3 -m pytest -q tests/gpu/test_release_real_gpu.py`` on a host with an NVIDIA GPU, PyTorch, root.
"""

from __future__ import annotations

import pytest
from gpu_real import (
    alive,
    backend,
    changed_count,
    check_preconditions,
    gpu_unavailable_reason,
    in_new_pid_namespace,
    release_result,
    results_dir,
    run_playbook,
    write_json,
)

pytestmark = pytest.mark.gpu

GRACE_S = 2.0
MIB = {"tp0": 2048, "tp1": 2048, "launcher": 1024, "foreign": 512}


@pytest.fixture
def gpu(tmp_path):
    reason = gpu_unavailable_reason()
    if reason:
        pytest.skip(reason)
    be = backend(tmp_path)
    yield be
    be.stop_all()


@in_new_pid_namespace
def test_teardown_frees_real_gpu_memory_and_spares_bystanders(gpu, tmp_path):
    (gpu.shm / "nccl-stale0").write_bytes(b"x")
    baseline = gpu.snapshot()
    c = {name: gpu.compute(mib) for name, mib in MIB.items()}
    launcher_spec = {
        **c["launcher"][0],
        "child": {"argv": ["python3", "tokenizer_worker.py"], **c["launcher"][0]},
    }
    pids = gpu.start(
        {
            "tp0": (["sglang::scheduler_TP0"], c["tp0"][0], c["tp0"][1]),
            "tp1": (["sglang::scheduler_TP1"], {**c["tp1"][0], "ignore_term": True}, c["tp1"][1]),
            "launcher": (
                ["python3", "-m", "sglang.launch_server", "--tp-size", "1"],
                launcher_spec,
                c["launcher"][1],
            ),
            "foreign": (["python3", "train.py"], c["foreign"][0], c["foreign"][1]),
            "monitor": (["python3", "gpu_monitor.py"], *gpu.nvml()),
            "persistenced": (["nvidia-persistenced", "--user", "nvidia-persistenced"], *gpu.nvml()),
        }
    )
    (tp0,), (tp1,), (launcher, child) = pids["tp0"], pids["tp1"], pids["launcher"]
    (foreign,), (monitor,), (persistenced,) = pids["foreign"], pids["monitor"], pids["persistenced"]
    before = gpu.snapshot()
    cuda = {
        "tp0": ([tp0], 2048),
        "tp1": ([tp1], 2048),
        "launcher": ([launcher, child], 1024),
        "foreign": ([foreign], 512),
    }
    pre = check_preconditions(gpu, baseline, before, cuda, [monitor, persistenced])

    runner, results = run_playbook(tmp_path, gpu.extravars(gpu_release_grace_s=GRACE_S, gpu_release_timeout_s=30))
    gpu.reap()
    after = gpu.snapshot()
    res = release_result(results)
    rerun, rerun_results = run_playbook(tmp_path, gpu.extravars(gpu_release_grace_s=GRACE_S))
    report = {
        "backend": gpu.name,
        "baseline": baseline,
        "before": before,
        "after": after,
        "preconditions": pre,
        "module_result": res,
        "teardown_summary": results.get("Teardown | summary", {}).get("msg"),
        "rerun_changed": changed_count(rerun),
        "rerun_summary": rerun_results.get("Teardown | summary", {}).get("msg"),
    }
    write_json(results_dir(tmp_path) / "gpu_release_real_gpu.json", report)

    assert runner.rc == 0, runner.stdout[-3000:]
    engines = [tp0, tp1, launcher, child]
    assert not any(alive(p) for p in engines), [p for p in engines if alive(p)]
    assert all(alive(p) for p in (foreign, monitor, persistenced)), "a bystander was killed"
    targets = {t["pid"]: t for t in res["targets"]}
    assert set(targets) == set(engines)
    assert targets[tp0]["signals"] == ["TERM"]  # it went at TERM
    assert targets[tp1]["signals"] == ["TERM", "KILL"]  # it ignored TERM: KILLed after it
    assert targets[child]["reason"] == f"descendant of {launcher}"
    assert [f["pid"] for f in res["foreign_holders"]] == [foreign]
    spared = {s["pid"]: s["reason"] for s in res["spared"]}
    assert spared[persistenced].startswith("protected daemon")
    assert spared[monitor].startswith("NVML-only GPU holder")
    freed = before["gpus"][0]["memory_used_mib"] - after["gpus"][0]["memory_used_mib"]
    assert freed >= 2048 + 2048 + 2 * 1024, f"only {freed} MiB freed"
    assert after["gpus"][0]["memory_used_mib"] >= baseline["gpus"][0]["memory_used_mib"] + 512  # foreign still there
    assert res["gpu_verification"] == "done"
    assert [p.name for p in gpu.shm.iterdir()] == []
    assert rerun.rc == 0 and report["rerun_changed"] == 0
