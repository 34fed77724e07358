"""SGLang's JIT kernels built before the switch (roles/sglang prebuild_kernels.py through engine_service_prebuild), on a
booted systemd host of its own. The engine is the ENGINE TEST DOUBLE; the engines' packages are the JIT PACKAGE TEST
DOUBLES (tests/doubles/jit_packages_double), whose builds run the COMPILER TEST DOUBLE for COMPILE_S seconds each; the
engine double builds FlashInfer's `sampling` at its first sampled request unless the pre-build left it in the
workspace (ENGINE_DOUBLE_KERNEL_CACHE is that directory). Small numbers: builds of 12 s against an 8 s stall timeout
and a 5 s smoke timeout.

The tests share the host and run in file order; each states the host it leaves behind.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest
import yaml

from tests.integration.engine_host import REPO
from tests.integration.lifecycle_helpers import (
    API_KEY,
    CONTAINER_MARKS,
    assert_rolled_back,
    booted_engine_host,
    deploy,
    main_pid,
)
from tests.integration.real_engine_scenario import task_times

pytestmark = CONTAINER_MARKS

COMPILE_S, STALL_S, SMOKE_S = 12, 8, 5
WORKSPACE = "/opt/sglang/venv/jit-cache"  # the sandbox venv's FlashInfer workspace (roles/sglang)
FI_SAMPLING = f"{WORKSPACE}/.cache/flashinfer/0.7.2/120f/cached_ops/sampling"
SG_SAMPLING = "/var/cache/sglang/jit/sm120f/speculative_sampling"
SANDBOX = yaml.safe_load((REPO / "inventory/sandbox/group_vars/all/sandbox.yml").read_text())
PREBUILD_TASK = "Prebuild | build the engine's kernels ahead"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    yield from booted_engine_host("bws-it-prebuild", tmp_path_factory.mktemp("prebuild-host"))


@pytest.fixture(scope="module")
def runs() -> list:
    return []


def compiling(seconds: float = COMPILE_S, **env: str) -> dict:
    """Deploy variables: the pre-build's builds and the engine double's sampled build take `seconds`."""
    return {"sglang_stall_timeout_s": STALL_S, "verify_smoke_timeout_s": SMOKE_S,
            "sglang_extra_environment": {**SANDBOX["sglang_extra_environment"], "BWS_JIT_DOUBLE_SECONDS": str(seconds),
                                         "ENGINE_DOUBLE_COMPILE_SAMPLED_S": str(seconds),
                                         "ENGINE_DOUBLE_KERNEL_CACHE": FI_SAMPLING,
                                         "ENGINE_DOUBLE_COMPILER": "/opt/bws-jit-double/lib/compiler_double.py",
                                         **env}}


def message(run, task: str) -> str:
    """What the play said in the task (its msg, whitespace folded)."""
    return " ".join(run.result(f"engine_service : Prebuild | {task}")["msg"].split())


def said(run) -> str:
    text = message(run, "what was built, and how long it took")
    found = re.search(r"SGLang's JIT kernel modules for 12\.0f before the switch: (.*\))", text)
    assert found, text
    return found.group(1)


def module_seconds(report: str, module: str) -> float:
    found = re.search(rf"{module} built in (\d+\.\d) s", report)
    assert found, report
    return float(found.group(1))


def no_compiler_runs(host) -> bool:
    return host.sh("pgrep -x cicc || true") == ""


def leaves_complete(host) -> None:
    """Every published leaf of SGLang's cache holds its module: a killed build leaves at most a staging directory."""
    leaves = host.sh(f"find {SG_SAMPLING} -mindepth 2 -maxdepth 2 -name 'deps-*' -type d 2>/dev/null || true").split()
    for leaf in leaves:
        assert host.sh(f"test -s {leaf}/speculative_sampling.so && echo ok || echo missing") == "ok", leaf


def test_a_fresh_host_builds_the_profiles_modules_before_the_switch_and_the_gate_passes(host, runs):
    """Empty caches; each build takes longer than the stall and the smoke timeouts: both reported built before the
    switch and published, the deploy passes and the smoke's sampled request finds FlashInfer's module built.
    Leaves release 1 serving."""
    run = deploy(host, runs, "deploy_sglang.yml", **compiling())
    assert run.status == "successful", run.stdout[-4000:]
    report = said(run)
    assert "2 of 2 built" in report, report
    for module in ("flashinfer-sampling", "sglang-speculative-sampling"):
        module_seconds(report, module)  # each is reported built ("<module> built in N s")
    assert "The sampled request waited" not in " ".join(run.stdout.split()), "the first sampled request compiled"
    assert host.sh(f"ls {FI_SAMPLING}") == "build.ninja\nsampling.so"
    published = host.sh(f"find {SG_SAMPLING} -mindepth 3 -maxdepth 3 -path '*/deps-*/speculative_sampling.so' "
                        "-size +0c")
    assert published, host.sh(f"find {SG_SAMPLING} || true")  # SGLang's module, in a published leaf
    leaves_complete(host)
    assert host.sh(f"stat -c %U {WORKSPACE}") == "sglang"
    assert host.health() == 200 and no_compiler_runs(host)
    print(f"fresh host: {report}")


def test_a_second_deploy_of_the_same_content_builds_nothing(host, runs):
    # The full path (a re-run with nothing to change ends after one read: tests/integration/test_release_code.py):
    # the pre-build runs and finds every kernel built.
    run = deploy(host, runs, "deploy_sglang.yml", engine_service_noop_check=False, **compiling())
    assert run.status == "successful", run.stdout[-4000:]
    assert run.count("changed", "bws-it-prebuild") == 0, run.stdout[-4000:]
    assert "0 of 2 built" in said(run)


def test_check_mode_says_what_a_new_toolchain_would_build_and_builds_nothing(host, runs):
    before = host.sh(f"find {WORKSPACE} {SG_SAMPLING} | sort")
    run = host.run_playbook("playbooks/deploy_sglang.yml", check=True,
                            extravars=compiling(BWS_TOOLCHAIN_DOUBLE_CXX_VERSION="13.1.0"))
    runs.append(run)
    assert run.rc == 0, run.stdout[-4000:]
    assert message(run, "say what would be built (check mode, nothing is built)") == (
        "Check mode, nothing is built: before the switch on bws-it-prebuild the deploy would build SGLang's JIT "
        "kernel modules for 12.0f: flashinfer-sampling: would build, sglang-speculative-sampling: would build.")
    assert host.sh(f"find {WORKSPACE} {SG_SAMPLING} | sort") == before


def test_a_new_toolchain_is_built_while_the_old_release_serves_and_the_switch_excludes_the_compile(host, runs):
    """A new C++ compiler: FlashInfer's workspace is emptied (its stamp), SGLang's key changes; both built before the
    switch: the pre-build ends before the old engine's drain begins, and the new engine's start compiles nothing.
    Leaves release 2."""
    before = host.state()["current"]
    run = deploy(host, runs, "deploy_sglang.yml", **compiling(BWS_TOOLCHAIN_DOUBLE_CXX_VERSION="13.1.0"))
    assert run.status == "successful", run.stdout[-4000:]
    report = said(run)
    assert "2 of 2 built" in report and "the toolchain changed (cxx)" in report, report
    built_start, built_end = task_times(run, PREBUILD_TASK)
    down_start, _ = task_times(run, "Drain | SIGTERM, then at most")
    _, ready = task_times(run, "Serve check | wait for readiness")
    downtime = (ready - down_start).total_seconds()
    prebuild = (built_end - built_start).total_seconds()
    assert built_end <= down_start, "the build ran into the switch"
    # The new engine compiled nothing while it came up: the readiness wait watches the unit's compilers (engine_wait)
    # and its summary would say "compiling kernels for N s".
    summary = " ".join(run.result("engine_service : Serve check | summary")["msg"].split())
    assert "ready after" in summary and "compiling kernels" not in summary, summary
    assert host.state()["current"] != before and host.health() == 200
    print(f"new toolchain: pre-build {prebuild:.1f} s while the old release served ({report}); "
          f"switch downtime {downtime:.1f} s")


SAMPLED = """
import json, time, urllib.request
body = json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                   "temperature": 0.6, "top_p": 0.95}).encode()
began = time.monotonic()
request = urllib.request.Request("http://127.0.0.1:30000/v1/chat/completions", body,
                                 {"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
status = urllib.request.urlopen(request, timeout=120).status
print(status, round(time.monotonic() - began, 2))
"""


def sampled_request(host) -> tuple[str, float]:
    """One sampled chat request on the host, the key on the interpreter's stdin (never in an argv): status, seconds."""
    proc = subprocess.run(["podman", "exec", "-i", host.name, "python3", "-"], input=f"KEY = {API_KEY!r}\n{SAMPLED}",
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status, seconds = proc.stdout.split()
    return status, float(seconds)


def test_a_gate_rollback_starts_the_previous_release_on_its_built_kernels_without_building(host, runs):
    """A release whose gate fails (garbage output) after a pre-build that had nothing to build: the rollback
    restarts the release that served on the kernels built for it before it first served; neither its start nor its
    first sampled request compiles (no compiler runs, the module is the one built before). Leaves release 2 serving,
    restarted."""
    before, old_pid = host.state()["current"], main_pid(host)
    built = host.sh(f"stat -c %Y {FI_SAMPLING}/sampling.so")
    run = deploy(host, runs, "deploy_sglang.yml", **compiling(BWS_TOOLCHAIN_DOUBLE_CXX_VERSION="13.1.0",
                                                              ENGINE_DOUBLE_FAULT="garbage-output"))
    assert run.status == "failed", run.stdout[-4000:]
    flat = " ".join(run.stdout.split())
    assert "0 of 2 built" in said(run)
    assert_rolled_back(flat, before)
    assert host.state()["current"] == before and main_pid(host) != old_pid and host.health() == 200
    status, seconds = sampled_request(host)
    assert status == "200", (status, seconds)
    assert no_compiler_runs(host)
    assert host.sh(f"stat -c %Y {FI_SAMPLING}/sampling.so") == built  # the same module, not rebuilt
    print(f"rollback to {before}: its first sampled request answered in {seconds} s, nothing built")


def run_in_background(host, runs, **extravars) -> tuple[threading.Thread, list]:
    done: list = []

    def target() -> None:
        done.append(deploy(host, runs, "deploy_sglang.yml", **extravars))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, done


def test_a_killed_prebuild_fails_the_deploy_before_the_switch_and_leaves_no_compiler(host, runs):
    """The pre-build's unit killed mid-build (its main process SIGKILLed, as an OOM kill would): every compiler goes
    with the cgroup, the deploy fails before the switch, the old release serves on. Leaves release 2 serving."""
    serving, pid = host.state()["current"], main_pid(host)
    thread, done = run_in_background(host, runs, **compiling(60, BWS_TOOLCHAIN_DOUBLE_CXX_VERSION="14.0.0"))
    deadline = time.monotonic() + 180
    while no_compiler_runs(host):
        assert thread.is_alive() and time.monotonic() < deadline, "no build started"
        time.sleep(0.5)
    unit = host.sh("systemctl list-units --plain --no-legend '*-prebuild.service' | awk '{print $1}'")
    assert unit.endswith("-prebuild.service"), unit
    host.sh(f"systemctl kill --kill-whom=main --signal=SIGKILL {unit}")
    thread.join(240)
    run = done[0]
    assert run.status == "failed", run.stdout[-4000:]
    flat = message(run, "a failed or killed build stops the deploy before the switch")
    refused = "Refusing to switch bws-it-prebuild: building SGLang's JIT kernel modules for 12.0f ahead failed"
    assert refused in flat, flat[-3000:]
    assert "Nothing that serves was touched" in flat
    assert host.state()["current"] == serving and main_pid(host) == pid and host.health() == 200
    assert no_compiler_runs(host), host.sh("ps -eo pid,pgid,comm,args")
    assert host.sh(f"test -e {FI_SAMPLING}/sampling.so && echo yes || echo no") == "no"  # emptied, never published
    leaves_complete(host)


def test_a_prebuild_past_its_limit_fails_the_deploy_before_the_switch(host, runs):
    serving, pid = host.state()["current"], main_pid(host)
    run = deploy(host, runs, "deploy_sglang.yml", sglang_prebuild_timeout_s=5,
                 **compiling(60, BWS_TOOLCHAIN_DOUBLE_CXX_VERSION="14.0.0"))
    assert run.status == "failed", run.stdout[-4000:]
    flat = message(run, "a failed or killed build stops the deploy before the switch")
    assert "ahead ran into its limit of 5 s (engine_service_prebuild timeout_s)" in flat, flat[-3000:]
    assert host.state()["current"] == serving and main_pid(host) == pid and host.health() == 200
    assert no_compiler_runs(host), host.sh("ps -eo pid,pgid,comm,args")
    leaves_complete(host)
