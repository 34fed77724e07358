"""A rollback restores code, not only config; a power cut in the middle of a deploy leaves the host serving.

One booted systemd host of its own. The engine is the ENGINE TEST DOUBLE, installed by the deploy's own install
step (role python_env: uv from a wheelhouse, `uv pip sync --require-hashes`, a venv per content) from wheels of
the double (tests/integration/engine_wheels.py): lock A is a healthy engine, lock B an engine version whose
answers are garbage (its post-start gate fails), lock C a healthy one the tests interrupt. "Power cut": the test
host is restarted without a stop timeout (podman restart -t 0) in the middle of a deploy. The tests share the host
and run in file order; each states the host it leaves behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import time
from pathlib import Path

import pytest

from tests.integration.engine_host import REPO, EngineHost, podman
from tests.integration.engine_wheels import build_wheel, download_uv_wheel, write_lock
from tests.integration.lifecycle_helpers import (
    BOOT_UNIT,
    CONTAINER_MARKS,
    ENGINE_UNITS,
    assert_boots,
    deploy,
    interrupted_deploy,
    inventory_vars,
)

pytestmark = CONTAINER_MARKS

ENVS = "/opt/sglang/envs"
TRIAL_UNIT = "/run/systemd/system.control/sglang.service"
UV = "/opt/uv/0.13.9/bin/uv"  # where python_env installs the pinned uv
# The UV TEST DOUBLE, put in uv's place: the real uv, except that `uv pip sync` first says so and waits, so a test
# can cut the power in the middle of a venv build.
SLOW_UV = f"""#!/bin/sh
if [ "$1 $2" = "pip sync" ]; then touch /run/uv-double-syncing; sleep 300; fi
exec {UV}-real "$@"
"""


@pytest.fixture(scope="module")
def locks(tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("engine-wheels")
    wheelhouse = work / "wheelhouse"
    wheelhouse.mkdir()
    download_uv_wheel(wheelhouse)
    wheels = {"A": build_wheel(wheelhouse, "1.0"), "B": build_wheel(wheelhouse, "2.0", fault="garbage-output"),
              "C": build_wheel(wheelhouse, "3.0")}
    return {"wheelhouse": wheelhouse, **{name: write_lock(work / f"lock-{name}.yml", wheel)
                                         for name, wheel in wheels.items()}}


@pytest.fixture(scope="module")
def host(tmp_path_factory, locks):
    engine_host = EngineHost("bws-it-release-code", tmp_path_factory.mktemp("release-code-host"))
    engine_host.write_inventory(inventory_vars(
        engine_host, sglang_install=True, python_env_wheelhouse=str(locks["wheelhouse"]),
        sglang_check_imports=["bws_engine_double"], sglang_min_free_mib=64,
        # The test locks install the engine double, no SGLang or ninja: there are no kernels to build ahead (the
        # pre-build is proven in test_engine_prebuild.py).
        sglang_prebuild=False))
    engine_host.boot_prepared()
    yield engine_host
    engine_host.destroy()


@pytest.fixture(scope="module")
def runs() -> list:
    return []


@pytest.fixture(scope="module")
def served() -> dict:
    """What each test found serving, for the next."""
    return {}


def serving_release(host: EngineHost) -> dict:
    state = host.state()
    return json.loads(host.sh(f"cat /var/lib/llm-serving/releases/{state['current']}/release.json"))


def running_command(host: EngineHost) -> str:
    pid = host.unit("sglang.service")["MainPID"]
    assert pid != "0", "sglang.service runs no process"
    return host.sh(f"tr '\\0' ' ' < /proc/{pid}/cmdline")


def tree_digest(host: EngineHost, path: str) -> str:
    """Every file's path, mode and bytes under path, as one digest: a venv written to changes it."""
    return host.sh(f"cd {path} && find . -printf '%p %y %m\\n' | sort | sha256sum && "
                   "find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum")


def boot_story(host: EngineHost) -> str:
    """What the engine unit did since the boot, for a failure message."""
    return host.sh("systemctl status --no-pager sglang.service; journalctl -b --no-pager -n 40 -u sglang.service"
                   " -u nvidia-gpu-nodes.service; cat /var/lib/llm-serving/state.json", check=False)


def wait_for(condition, what: str, timeout_s: float = 120, host: EngineHost | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s\n{boot_story(host) if host else ''}")
        time.sleep(0.5)


def power_cut_during(host: EngineHost, extravars: dict, cut_when) -> None:
    """Run a deploy; once cut_when() holds, restart the test host with no stop timeout (the power cut)."""
    interrupted_deploy(host, "playbooks/deploy_sglang.yml", extravars, cut_when,
                       interrupt=lambda: podman("restart", "-t", "0", host.name))
    wait_for(lambda: host.sh("systemctl is-system-running --wait 2>/dev/null; true", check=False) != "", "boot")


SAMPLES = "/var/tmp/bws-boot-samples.log"
# Every 20 ms: state.json, the engine units' files in /etc (short digests) and the units wanted at boot, one line.
SAMPLER = f"""rm -f {SAMPLES} /run/bws-sampler.stop
while [ ! -e /run/bws-sampler.stop ]; do
  s=$(tr -d '\\n ' < /var/lib/llm-serving/state.json 2>/dev/null)
  e=$(for u in {' '.join(ENGINE_UNITS)}; do
         printf '%s:' "$u"; sha256sum < /etc/systemd/system/$u 2>/dev/null | cut -c1-16; echo
       done | tr '\\n' ',')
  w=$(ls /etc/systemd/system/multi-user.target.wants/ 2>/dev/null | tr '\\n' ',')
  echo "$s|$e|$w" >> {SAMPLES}
  sleep 0.02
done"""


def engine_boot_program():
    """The boot unit's own program (roles/engine_service/files/engine_boot.py), to judge each sample as it would."""
    spec = importlib.util.spec_from_file_location("engine_boot", REPO / "roles/engine_service/files/engine_boot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def boot_samples(host: EngineHost):
    """Sample, every 20 ms while the block runs, what a power cut at that instant would boot; yields a list filled
    with one (state.json, units in /etc, units started at boot) per sample when the block ends."""
    samples: list[dict] = []
    host.sh(f"cat > /run/bws-sampler.sh <<'EOF'\n{SAMPLER}\nEOF\nsetsid sh /run/bws-sampler.sh >/dev/null 2>&1 &")
    try:
        yield samples
    finally:
        host.sh("touch /run/bws-sampler.stop; sleep 0.2")
    units_of = dict(line.split() for line in host.sh(
        "python3 -c \"import glob, json; [print(p.split('/')[-2], json.load(open(p))['unit'])"
        " for p in glob.glob('/var/lib/llm-serving/releases/*/release.json')]\"").splitlines())
    program = engine_boot_program()
    for line in host.sh(f"cat {SAMPLES}").splitlines():
        state_text, etc, wants = line.split("|")
        state = json.loads(state_text) if state_text else None
        release, _ = program.release_to_boot(state)
        wanted = set(filter(None, wants.split(",")))
        chosen = {units_of[release]} if release and BOOT_UNIT in wanted else set()
        samples.append({"state": state_text, "etc": etc, "release": release,
                        "boots": sorted(chosen | (wanted & set(ENGINE_UNITS)))})
    assert samples, "the sampler took no sample"


def assert_one_engine_boots_throughout(samples: list[dict], what: str) -> None:
    wrong = [s for s in samples if len(s["boots"]) != 1]
    assert not wrong, (f"{what}: {len(wrong)} of {len(samples)} samples would boot {len(wrong[0]['boots'])} "
                       f"engine units: {wrong[0]}")


def test_lock_a_is_installed_into_a_venv_of_its_own_and_serves_from_it(host, runs, locks, served):
    run = deploy(host, runs, "deploy_sglang.yml", sglang_lock_file=str(locks["A"]))
    assert run.status == "successful", run.stdout[-3000:]
    release = serving_release(host)
    venv = release["venv"]
    assert venv.startswith(f"{ENVS}/sglang-"), release
    assert f"{venv}/bin/sglang serve --config" in running_command(host)
    assert host.health() == 200
    stamp = json.loads(host.sh(f"cat {venv}/python-env.json"))
    assert venv.endswith("/" + stamp["id"]) and stamp["name"] == "sglang"
    # Committed: the unit the host boots into is this release's, and no trial copy is left.
    assert host.sh(f"test -e {TRIAL_UNIT} && echo trial || echo none") == "none"
    assert venv in host.sh("cat /etc/systemd/system/sglang.service")
    assert_boots(host, "sglang.service", host.state()["current"])
    served.update(release_a=host.state()["current"], venv_a=venv, digest_a=tree_digest(host, venv))

    # The same lock again: the fast path reads the host once and ends; nothing is built, written or restarted.
    pid = host.unit("sglang.service")["MainPID"]
    again = deploy(host, runs, "deploy_sglang.yml", sglang_lock_file=str(locks["A"]))
    assert again.status == "successful" and again.count("changed", host.name) == 0, again.stdout[-3000:]
    said = " ".join(again.stdout.split())
    assert f"No change on {host.name}: release {served['release_a']} already serves exactly this deploy" in said, said
    assert again.results("python_env : Create the venv in its build directory", host.name) == []
    assert again.results("engine_service : Release | write the release and the host files it needs, read what serves",
                         host.name) == []
    assert tree_digest(host, venv) == served["digest_a"] and host.unit("sglang.service")["MainPID"] == pid


def test_drift_sends_the_deploy_down_the_full_path_which_repairs_it(host, runs, locks, served):
    """A unit and a configuration edited by hand (one run), then a stopped engine: each is said, the full path
    repairs it, and the engine runs on the repaired files. (Every kind of drift the fast path sees, one by one:
    tests/unit/plugins/modules/test_engine_noop.py.)"""
    release_dir = f"/var/lib/llm-serving/releases/{served['release_a']}"
    drifts = [
        (["/etc/systemd/system/sglang.service changed", f"{release_dir}/config.yaml changed"],
         "sed -i 's/^Restart=.*/Restart=no/' /etc/systemd/system/sglang.service && systemctl daemon-reload"
         f" && sed -i 's/^port: .*/port: 30001/' {release_dir}/config.yaml"),
        (["sglang.service is inactive, not active"], "systemctl stop sglang.service"),
    ]
    for said, drift in drifts:
        pristine = host.sh(f"sha256sum /etc/systemd/system/sglang.service {release_dir}/config.yaml")
        pid = host.unit("sglang.service")["MainPID"]
        host.sh(drift)
        run = deploy(host, runs, "deploy_sglang.yml", sglang_lock_file=str(locks["A"]))
        assert run.status == "successful", run.stdout[-3000:]
        printed = " ".join(run.stdout.split())
        assert f"Full deploy on {host.name}: " in printed and all(s in printed for s in said), (said, printed[-3000:])
        # Repaired: the files as the release holds them, the engine restarted on them and answering.
        assert host.sh(f"sha256sum /etc/systemd/system/sglang.service {release_dir}/config.yaml") == pristine
        assert host.unit("sglang.service")["ActiveState"] == "active" and host.health() == 200
        assert host.unit("sglang.service")["MainPID"] != pid and host.state()["current"] == served["release_a"]


def test_a_failed_version_bump_rolls_back_to_the_previous_code_untouched(host, runs, locks, served):
    with boot_samples(host) as samples:
        run = deploy(host, runs, "deploy_sglang.yml", sglang_lock_file=str(locks["B"]))
    assert run.status == "failed", run.stdout[-3000:]
    # A power cut at any instant of the switch, the failed gate and its rollback boots release A, and only it.
    assert_one_engine_boots_throughout(samples, "a failed gate's rollback")
    assert {s["release"] for s in samples} == {served["release_a"]}, samples[::20]
    assert f"Rolled back: {served['release_a']} is serving again" in " ".join(run.stdout.split())
    state = host.state()
    assert state["current"] == served["release_a"] and state["failed"] != served["release_a"]
    failed = json.loads(host.sh(f"cat /var/lib/llm-serving/releases/{state['failed']}/release.json"))
    assert failed["venv"] != served["venv_a"] and failed["venv"].startswith(f"{ENVS}/sglang-")
    # The previous release runs its own code again, whose files are byte for byte what they were.
    assert f"{served['venv_a']}/bin/sglang serve --config" in running_command(host)
    assert tree_digest(host, served["venv_a"]) == served["digest_a"]
    assert host.health() == 200
    assert served["venv_a"] in host.sh("cat /etc/systemd/system/sglang.service")
    assert host.sh(f"test -e {TRIAL_UNIT} && echo trial || echo none") == "none"


def test_a_power_cut_during_the_venv_build_leaves_no_venv_to_start_and_the_rerun_finishes(host, runs, locks, served):
    host.sh(f"mv {UV} {UV}-real && cat > {UV} <<'EOF'\n{SLOW_UV}EOF\nchmod 0755 {UV}")
    try:
        power_cut_during(host, {"sglang_lock_file": str(locks["C"])},
                         lambda: host.sh("test -e /run/uv-double-syncing && echo yes", check=False) == "yes")
    finally:
        host.sh(f"mv {UV}-real {UV}", check=False)
    # After the boot: the release that served before starts from the unit in /etc, on its own venv.
    wait_for(lambda: host.health() == 200, "the last release that served answers after the boot", host=host)
    assert f"{served['venv_a']}/bin/sglang serve --config" in running_command(host)
    assert host.state()["current"] == served["release_a"]
    # Only complete venvs have a name a unit could run: what the build left is a build directory.
    names = host.sh(f"ls -A {ENVS}").split()
    builds = [n for n in names if n.startswith(".build-")]
    assert len(builds) == 1, names
    assert builds[0].removeprefix(".build-") not in names
    assert host.sh(f"grep -l '{builds[0].removeprefix('.build-')}' /var/lib/llm-serving/releases/*/release.json"
                   " || echo none") == "none"

    run = deploy(host, runs, "deploy_sglang.yml", sglang_lock_file=str(locks["C"]))
    assert run.status == "successful", run.stdout[-3000:]
    release = serving_release(host)
    assert release["venv"] == f"{ENVS}/{builds[0].removeprefix('.build-')}"
    assert f"{release['venv']}/bin/sglang serve --config" in running_command(host)
    assert tree_digest(host, served["venv_a"]) == served["digest_a"]
    # The prune after the switch removed what the build left (venv A is the previous release's: kept).
    assert host.sh(f"ls -A {ENVS}").split().count(builds[0]) == 0
    served.update(release_c=host.state()["current"], venv_c=release["venv"])


def test_a_power_cut_before_the_gate_boots_the_last_release_that_served(host, runs, locks, served):
    # Another config on the same venv, whose engine never answers: the deploy waits for it on trial.
    hang = {"sglang_lock_file": str(locks["C"]), "sglang_extra_environment": {"ENGINE_DOUBLE_FAULT": "hang"}}

    def on_trial() -> bool:
        state = json.loads(host.sh("cat /var/lib/llm-serving/state.json"))
        return (state.get("status") == "switching" and state.get("current") != served["release_c"]
                and host.sh(f"test -e {TRIAL_UNIT} && systemctl is-active sglang.service", check=False) == "active")

    power_cut_during(host, hang, on_trial)
    wait_for(lambda: host.health() == 200, "the last release that served answers after the boot", host=host)
    command = running_command(host)
    assert f"/var/lib/llm-serving/releases/{served['release_c']}/config.yaml" in command, command
    assert f"{served['venv_c']}/bin/sglang serve" in command
    assert host.sh("cat /proc/$(systemctl show -p MainPID --value sglang.service)/environ | tr '\\0' '\\n'"
                   " | grep -c ENGINE_DOUBLE_FAULT || true") == "0"

    # A re-run (without the fault) deploys the release that served again and records it as serving. The host's
    # engine unit is enabled as a deploy before the boot unit left it: the deploy disables it, never leaving two
    # things or none to start an engine at boot.
    host.sh("systemctl enable sglang.service")
    with boot_samples(host) as samples:
        run = deploy(host, runs, "deploy_sglang.yml", sglang_lock_file=str(locks["C"]))
    assert run.status == "successful", run.stdout[-3000:]
    assert_one_engine_boots_throughout(samples, "a deploy's switch")
    assert_boots(host, "sglang.service", served["release_c"])
    assert host.state()["current"] == served["release_c"] and host.state()["status"] == "serving"
    assert host.health() == 200


def unit_now(host: EngineHost) -> tuple[str, str, str]:
    """What would tell a change: state.json's text, the engine's MainPID, the unit file in /etc."""
    return (host.sh("cat /var/lib/llm-serving/state.json"), host.unit("sglang.service")["MainPID"],
            host.sh("sha256sum /etc/systemd/system/sglang.service"))


def test_rollback_with_nothing_to_go_back_to_is_refused_and_changes_nothing(host, runs, served):
    # The re-run above finished a switch that never served: state.json names no previous release.
    assert host.state()["previous"] is None, host.state()
    before = unit_now(host)
    run = deploy(host, runs, "rollback.yml")
    assert run.status == "failed", run.stdout[-3000:]
    said = " ".join(run.stdout.split())
    assert "there is nothing to roll back to: state.json names no previous release (kept: " in said, said[-2000:]
    assert served["release_a"] in said and "Nothing was changed." in said
    assert run.count("changed", host.name) == 0 and unit_now(host) == before


def test_rollback_to_a_kept_release_starts_it_from_its_own_venv_and_keeps_the_one_it_left(host, runs, served):
    # --check --diff says the switch and makes none.
    before = unit_now(host)
    check = host.run_playbook("playbooks/rollback.yml", extravars={"release": served["release_a"]}, check=True)
    assert check.status == "successful", check.stdout[-3000:]
    said = " ".join(check.stdout.split())
    assert (f"Check mode, nothing is changed: the rollback would switch {host.name} from release {served['release_c']}"
            f" to release {served['release_a']}") in said, said[-2000:]
    assert unit_now(host) == before

    with boot_samples(host) as samples:
        run = deploy(host, runs, "rollback.yml", release=served["release_a"])
    assert run.status == "successful", run.stdout[-3000:]
    assert_one_engine_boots_throughout(samples, "rollback.yml")
    # What a power cut would leave on disk at each step (the last test boots each of them).
    served["rollback_cuts"] = list(dict.fromkeys((s["state"], s["etc"]) for s in samples))
    assert_boots(host, "sglang.service", served["release_a"])
    assert f"rolled back to {served['release_a']}" in " ".join(run.stdout.split())
    assert host.state() == {"current": served["release_a"], "previous": served["release_c"], "status": "serving"}
    assert f"{served['venv_a']}/bin/sglang serve --config" in running_command(host)
    assert tree_digest(host, served["venv_a"]) == served["digest_a"]
    assert host.health() == 200
    assert served["venv_a"] in host.sh("cat /etc/systemd/system/sglang.service")
    assert host.sh(f"test -e {TRIAL_UNIT} && echo trial || echo none") == "none"

    # Without -e release: the previous one, the release it left, forward again.
    with boot_samples(host) as samples:
        forward = deploy(host, runs, "rollback.yml")
    assert forward.status == "successful", forward.stdout[-3000:]
    assert_one_engine_boots_throughout(samples, "rollback.yml forward")
    assert host.state() == {"current": served["release_c"], "previous": served["release_a"], "status": "serving"}
    assert f"{served['venv_c']}/bin/sglang serve --config" in running_command(host)
    assert host.health() == 200


def test_rollback_to_a_release_whose_venv_was_pruned_or_that_is_not_kept_is_refused(host, runs, served):
    before = unit_now(host)
    host.sh(f"mv {served['venv_a']} {served['venv_a']}.away")
    try:
        run = deploy(host, runs, "rollback.yml")
    finally:
        host.sh(f"mv {served['venv_a']}.away {served['venv_a']}")
    assert run.status == "failed", run.stdout[-3000:]
    said = " ".join(run.stdout.split())
    assert (f"Refusing to roll back {host.name} to {served['release_a']}: its venv {served['venv_a']} was pruned"
            in said), said[-2000:]
    assert run.count("changed", host.name) == 0 and unit_now(host) == before

    gone = deploy(host, runs, "rollback.yml", release="sglang-000000000000")
    assert gone.status == "failed"
    assert "release sglang-000000000000 is not kept on this host (kept: " in " ".join(gone.stdout.split())
    assert unit_now(host) == before


def test_a_power_cut_at_any_step_of_a_rollback_boots_the_release_state_json_names(host, runs, served):
    """Each distinct state of the disk the sampler saw during rollback.yml's switch from C to A (state.json and the
    unit in /etc; /run is lost to a power cut), put back and booted: the release state.json names starts, alone.
    Where the cut left the switch unfinished, rollback.yml re-run with no release finishes it: A serves, C is
    previous, as after the uncut rollback."""
    cuts = served["rollback_cuts"]
    assert len(cuts) >= 3, cuts  # at least: switching with C's unit in /etc, switching with A's, serving A
    digests = dict(line.split() for line in host.sh(
        "cd /var/lib/llm-serving/releases && for r in *; do echo \"$(sha256sum < $r/sglang.service | cut -c1-16) $r\";"
        " done").splitlines())
    program = engine_boot_program()
    for state_text, etc in cuts[1:]:  # the first is the state before the rollback began: a host at rest
        etc_release = digests[etc.split(",")[0].removeprefix("sglang.service:")]
        state = json.loads(state_text)
        host.sh(f"cp /var/lib/llm-serving/releases/{etc_release}/sglang.service /etc/systemd/system/sglang.service && "
                f"printf '%s\\n' '{json.dumps(state)}' > /var/lib/llm-serving/state.json && sync")
        podman("restart", "-t", "0", host.name)
        wait_for(lambda: host.health() == 200, f"the boot after a cut at {state} (/etc: {etc_release})", host=host)
        booted, _ = program.release_to_boot(state)
        command = running_command(host)
        assert f"/var/lib/llm-serving/releases/{booted}/config.yaml" in command, (state, etc_release, command)
        assert host.unit("vllm.service")["ActiveState"] == "inactive"
        assert json.loads(host.sh("cat /var/lib/llm-serving/state.json")) == state
        if state["status"] == "switching":
            assert state.get("by") == "rollback", state
            rerun = deploy(host, runs, "rollback.yml")
            assert rerun.status == "successful", rerun.stdout[-3000:]
            assert (f"from the interrupted rollback to {served['release_a']} (state.json says switching), which this "
                    "finishes") in " ".join(rerun.stdout.split())
            assert host.state() == {"current": served["release_a"], "previous": served["release_c"],
                                    "status": "serving"}
            assert host.health() == 200
