"""Checks of provision.yml on the systemd test host.

NVIDIA's repository is the TEST DOUBLE from tests/doubles/nvidia_apt_repo_double (dummy packages signed
with a throw-away key): these tests prove the apt mechanics (key, source, pins, branch moves, refusals),
not NVIDIA's packages.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest
import testinfra.utils.ansible_runner

from tests.playbook_run import PlaybookRun, run_playbook  # the repository root is on the path (pyproject.toml)

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
SCENARIO = Path(__file__).resolve().parents[1]
REPO = SCENARIO.parents[1]
HOSTS = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts("all")
# testinfra's own podman backend: one `podman exec` per command instead of one ansible run.
testinfra_hosts = [f"podman://{name}" for name in HOSTS]

V580 = "580.95.05-1"
V590 = "590.48.01-1"
LOADED_FILE = "/run/nvidia-driver-version-double"


def playbook(path: str, *args: str) -> PlaybookRun:
    """Run a playbook against the scenario's inventory (group_vars included) through tests/playbook_run.py."""
    return run_playbook(path, Path(INVENTORY).parent, extra_args=list(args), timeout=600, workdir=EPHEMERAL,
                        envvars=playbook_env())


def probe(role: str, *extra: str, tasks_from: str = "main") -> PlaybookRun:
    return playbook(
        str(SCENARIO / "tests" / "role_probe.yml"),
        "-e",
        f"probe_role={role}",
        "-e",
        f"probe_tasks_from={tasks_from}",
        *extra,
    )


def recap(result: PlaybookRun) -> dict[str, int]:
    assert result.played(HOSTS[0]), result.stdout[-3000:]
    return result.recap(HOSTS[0])


def one_line(text: str) -> str:
    """Undo the YAML callback's line folding so messages can be searched."""
    return re.sub(r"\s+", " ", re.sub(r"\x1b\[[0-9;]*m|│", " ", text))


def policy(host, package: str, *apt_options: str) -> tuple[str, str]:
    out = host.check_output(f"apt-cache {' '.join(apt_options)} policy {package}")
    installed = re.search(r"Installed: (\S+)", out).group(1)
    candidate = re.search(r"Candidate: (\S+)", out).group(1)
    return installed, candidate


# --- repository and key ---------------------------------------------------------------------------


def test_keyring_is_the_expected_key_dearmored(host):
    keyring = host.file("/usr/share/keyrings/cuda-archive-keyring.gpg")
    assert keyring.exists and keyring.mode == 0o644
    assert not keyring.content.startswith(b"-----BEGIN"), "keyring must be binary (dearmored)"
    colons = host.check_output("gpg --batch --with-colons --show-keys /usr/share/keyrings/cuda-archive-keyring.gpg")
    fingerprint = (EPHEMERAL / "nvidia-apt-repo-double" / "fingerprint.txt").read_text().strip()
    assert f"fpr:::::::::{fingerprint}:" in colons


def test_source_is_deb822_flat_repo_signed_by_keyring(host):
    source = host.file("/etc/apt/sources.list.d/nvidia-cuda.sources").content_string
    assert "Suites: /" in source
    assert "Signed-By: /usr/share/keyrings/cuda-archive-keyring.gpg" in source
    assert "Components" not in source
    assert not host.file("/etc/apt/sources.list.d/cuda-debian12-x86_64.list").exists, "conflicting source left"


def test_debian_contrib_enabled(host):
    assert re.search(r"^deb .* bookworm main contrib$", host.file("/etc/apt/sources.list").content_string, re.M)


# --- branch lock ------------------------------------------------------------------------------------


def test_580_installed_and_stays_candidate(host):
    for package in ("nvidia-open", "nvidia-kernel-open-dkms", "nvidia-driver-cuda", "libnvidia-compute"):
        assert policy(host, package) == (V580, V580), package


def test_590_would_win_without_the_pins(host):
    """The double is meaningful: without any preferences apt would move to 590."""
    no_pins = ("-o Dir::Etc::preferences=/dev/null", "-o Dir::Etc::preferencesparts=/nonexistent")
    assert policy(host, "nvidia-open", *no_pins)[1] == V590


def test_dist_upgrade_does_not_move_to_590(host):
    out = host.check_output("apt-get -s dist-upgrade")
    assert "590." not in out
    assert re.search(r"^0 upgraded, 0 newly installed", out, re.M), out


def test_pinning_package_of_the_branch_only(host):
    assert host.package("nvidia-driver-pinning-580").is_installed
    assert not host.package("nvidia-driver-pinning-590").is_installed


def test_branch_lock_is_not_apt_mark_hold(host):
    assert host.check_output("apt-mark showhold") == ""


def test_proprietary_flavour_never_installed_nor_installable(host):
    for package in ("cuda-drivers", "nvidia-kernel-dkms", "cuda-13-0"):
        assert not host.package(package).is_installed, package
    for package in ("cuda-drivers", "cuda-13-0"):
        simulated = host.run(f"apt-get -s install {package}")
        assert simulated.rc != 0, f"{package} is installable: {simulated.stdout}"


def test_driver_kept_out_of_unattended_upgrades(host):
    conf = host.file("/etc/apt/apt.conf.d/51nvidia-driver-unattended-upgrades").content_string
    assert "Unattended-Upgrade::Package-Blacklist" in conf
    for pattern in ('"^nvidia-";', '"^libnvidia-";', '"^linux-modules-nvidia-";'):
        assert pattern in conf


# --- kernel module configuration and persistence -----------------------------------------------------


def test_nouveau_blacklisted_and_hmm_left_alone(host):
    assert "blacklist nouveau" in host.file("/etc/modprobe.d/nvidia-blacklist-nouveau.conf").content_string
    assert not host.file("/etc/modprobe.d/nvidia-uvm-hmm.conf").exists


def test_persistenced_runs_persistence_mode_and_is_enabled(host):
    unit = host.check_output("systemctl cat nvidia-persistenced.service")
    exec_starts = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_starts[-2:] == [
        "ExecStart=",
        "ExecStart=/usr/bin/nvidia-persistenced --user root --persistence-mode --verbose",
    ]
    assert host.check_output("systemctl is-enabled nvidia-persistenced.service") == "enabled"
    assert host.check_output("systemctl show -p StopWhenUnneeded --value nvidia-persistenced") == "no"


# --- CUDA toolkit ----------------------------------------------------------------------------------------


def test_cuda_toolkit_on_path_for_login_shells(host):
    assert host.package("cuda-toolkit-13-0").is_installed
    out = host.check_output("bash -lc 'command -v nvcc; echo $CUDA_HOME; nvcc --version'")
    lines = out.splitlines()
    assert lines[0] == "/usr/local/cuda-13.0/bin/nvcc"
    assert lines[1] == "/usr/local/cuda-13.0"
    assert "release 13.0," in out


# --- python_env (air-gapped wheelhouse) -------------------------------------------------------------


def test_uv_installed_from_the_wheelhouse(host):
    assert host.check_output("/opt/uv/0.13.9/bin/uv --version").startswith("uv 0.13.9")


def the_venvs(host) -> list[str]:
    """The complete venvs of the converge's environment (build directories start with a dot)."""
    return sorted(host.check_output("ls -d /opt/provision-test/envs/provision-test-* 2>/dev/null || true").split())


def tree_digest(host, path: str) -> str:
    """One digest of every file's path, mode and content under path: a venv written to changes it."""
    return host.check_output(
        f"cd {path} && find . -type f -printf '%p %m\\n' | sort | sha256sum && find . -type f -print0 | sort -z"
        " | xargs -0 sha256sum | sha256sum")


def test_venv_built_offline_with_the_requirement_set(host):
    [venv] = the_venvs(host)
    python = f"{venv}/bin/python"
    assert host.check_output(f"{python} -c 'import six, sys; print(six.__version__, sys.prefix)'") == (
        f"1.17.0 {venv}"
    )
    stamp = json.loads(host.file(f"{venv}/python-env.json").content_string)
    assert stamp["name"] == "provision-test"
    assert venv.endswith("/" + stamp["id"])
    assert stamp["sources"] == {"wheelhouse": "/var/cache/python-env/provision-test/wheelhouse"}
    assert host.file("/var/cache/python-env/provision-test/wheelhouse/six-1.17.0-py2.py3-none-any.whl").exists
    # Built elsewhere and renamed into place: nothing of the build is left, and its scripts still run.
    assert host.check_output("ls -A /opt/provision-test/envs") == venv.rsplit("/", 1)[1]
    assert 'relocatable = true' in host.file(f"{venv}/pyvenv.cfg").content_string


# --- playbook runs on the converged host -----------------------------------------------------------

# six-1.17.0-py2.py3-none-any.whl, the wheel converge.yml installs with --require-hashes.
SIX_HASHES = {"six": ["4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274"]}

# Each case: (role, its inputs as inventory variables of a host alias, what the refusal must say).
REFUSALS = {
    "misspelled variable": (
        "nvidia_driver",
        {"nvidia_driver_brnach": "590"},
        "unknown variable nvidia_driver_brnach: not an option of role nvidia_driver"
        " (did you mean nvidia_driver_branch?)",
    ),
    "mistyped variable": ("nvidia_driver", {"nvidia_driver_reboot": "maybe"}, "nvidia_driver_reboot"),
    "mistyped number": (
        "nvidia_driver",
        {"nvidia_driver_reboot_timeout": "soon"},
        "variable nvidia_driver_reboot_timeout (role nvidia_driver)",
    ),
    "branch older than R580": ("nvidia_driver", {"nvidia_driver_branch": "575"}, "nvidia_driver_branch=575 refused"),
    "proprietary flavour": (
        "nvidia_driver",
        {"nvidia_driver_flavour": "proprietary"},
        "nvidia_driver_flavour=proprietary refused",
    ),
    "CUDA older than 12.9": ("cuda_toolkit", {"cuda_toolkit_version": "12.8"}, "cuda_toolkit_version=12.8 refused"),
    "CUDA meta package that pulls a driver": (
        "cuda_toolkit",
        {"cuda_toolkit_package": "cuda-13-0"},
        "cuda_toolkit_package=cuda-13-0 refused",
    ),
    "Secure Boot without an enrolled DKMS key": (
        "nvidia_driver",
        {"nvidia_driver_secure_boot": "enabled"},
        "DKMS signing certificate /var/lib/dkms/mok.pub is missing. Nothing was installed.",
    ),
    "a missing venv when the run may not build it": (
        "python_env",
        {"python_env_name": "x", "python_env_envs_dir": "/opt/x/envs",
         "python_env_requirements": ["six==1.17.0"], "python_env_hashes": SIX_HASHES, "python_env_build": False},
        "is not built, and this run may not build it (the install step is left out: --skip-tags install",
    ),
    "interpreter too old or missing": (
        "python_env",
        {"python_env_name": "x", "python_env_envs_dir": "/opt/x/envs", "python_env_requirements": ["six==1.17.0"],
         "python_env_hashes": SIX_HASHES, "python_env_interpreter": "/usr/bin/python3.9"},
        "/usr/bin/python3.9 was not found; the x venv needs Python 3.11 or newer",
    ),
    "requirement without a hash": (
        "python_env",
        {"python_env_name": "x", "python_env_envs_dir": "/opt/x/envs",
         "python_env_requirements": ["six==1.17.0", "uv==0.13.9 --hash=sha256:" + "0" * 64],
         "python_env_hashes": {"uv": SIX_HASHES["six"]}},
        "1 of 2 requirements of the x venv carry no sha256 hash (six==1.17.0): every file is installed with uv pip"
        " sync --require-hashes.",
    ),
}
# Refused by the input check (pre_tasks), before any task of the role.
INPUT_CHECK_REFUSALS = {"misspelled variable", "mistyped variable", "mistyped number"}


CMDLINES = {
    "translated": "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet",
    "passthrough": "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro iommu=pt quiet",
}


class TaskResult(NamedTuple):
    event: str  # runner_on_ok, runner_on_failed, runner_on_skipped, ...
    role: str
    task: str
    res: dict


# What the probe runs take from the environment: the toolchain, the configuration, and the hosts' connection plugin
# (molecule.yml).
PLAYBOOK_ENV = ("PATH", "ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_CONNECTION_PLUGINS")


def playbook_env() -> dict[str, str]:
    return {name: os.environ[name] for name in PLAYBOOK_ENV if name in os.environ}


def alias_probes(cases: dict[str, tuple[str, dict]]) -> dict[str, dict]:
    """One role_probe.yml run for many cases: each case is an inventory alias of the test host with its own
    role and inputs (inventory variables, which the input check reads as it reads -e). Returns per case its
    host's recap counts and task results, from ansible-runner's events as the engine scenarios read them:
    {"stats": {"ok": n, "changed": n, "failures": n}, "results": [TaskResult, ...]}."""
    aliases = {f"case{index}": case for index, case in enumerate(cases)}
    hosts = {
        alias: {"ansible_host": HOSTS[0], "ansible_connection": "podman_nsenter",
                "probe_role": cases[case][0], **cases[case][1]}
        for alias, case in aliases.items()
    }
    extra = EPHEMERAL / "alias-probes.yml"
    extra.write_text(json.dumps({"all": {"children": {"gpu_servers": {"hosts": hosts}}}}))
    runner = run_playbook(
        SCENARIO / "tests" / "role_probe.yml", [Path(INVENTORY).parent, extra], limit=",".join(aliases),
        workdir=EPHEMERAL, timeout=600, envvars=playbook_env(),
    )  # fmt: skip
    assert runner.stats, f"the probe run ended without a recap ({runner.status}): {runner.stdout[-3000:]}"
    per_case = {
        case: {"stats": {key: runner.count(key, alias) for key in ("ok", "changed", "failures")}, "results": []}
        for alias, case in aliases.items()
    }  # fmt: skip
    for event in runner.task_events:
        data = event.get("event_data", {})
        if data.get("host") in aliases and "res" in data:
            per_case[aliases[data["host"]]]["results"].append(
                TaskResult(event["event"], data.get("role", ""), data.get("task", ""), data["res"])
            )
    return per_case


def strings_of(value: object) -> str:
    """Every string in a task result, on one line: what its messages say, wherever the module put them."""
    if isinstance(value, dict):
        return " ".join(strings_of(v) for v in value.values())
    if isinstance(value, list):
        return " ".join(strings_of(v) for v in value)
    return one_line(value) if isinstance(value, str) else ""


@pytest.fixture(scope="module", autouse=True)
def background_runs():
    """Read-only playbook runs (check mode; one run for the refusals and preflight cases) go on while the
    quick checks above run."""
    for name, cmdline in CMDLINES.items():
        subprocess.run(["podman", "exec", HOSTS[0], "sh", "-c", f"echo '{cmdline}' > /run/cmdline-{name}"], check=True)
    # IOMMU groups without a type file (kernels before 5.11): the command line decides the mode. The container's
    # own sysfs may have no groups at all (no IOMMU), which would hide the command line.
    subprocess.run(["podman", "exec", HOSTS[0], "mkdir", "-p", "/run/iommu-groups-untyped/0/devices"], check=True)
    cases = {name: case[:2] for name, case in REFUSALS.items()}
    cases.update(
        {
            f"cmdline-{name}": ("host_preflight", {"host_preflight_cmdline_file": f"/run/cmdline-{name}",
                                                    "host_preflight_iommu_groups_dir": "/run/iommu-groups-untyped"})
            for name in CMDLINES
        }
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {
            "check": pool.submit(playbook, str(SCENARIO / "converge.yml"), "--check"),
            "cases": pool.submit(alias_probes, cases),
        }


def test_check_mode_changes_nothing_on_a_converged_host(background_runs):
    result = background_runs["check"].result()
    assert result.rc == 0, result.stdout[-4000:]
    counts = recap(result)
    assert counts["changed"] == 0 and counts["failed"] == 0, counts
    assert "SKIPPING hardware steps" in result.stdout, "the hardware skip must be visible"


def write_loaded_version(host, version: str) -> None:
    """Stand in for /proc/driver/nvidia/version with a module of the given version loaded."""
    line = f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build"
    host.check_output(f"printf '%s\\n' '{line}' > {LOADED_FILE}")


def test_reboot_pending_then_already_running(host):
    try:
        write_loaded_version(host, "575.51.03")
        pending = probe("nvidia_driver", "-e", f"nvidia_driver_loaded_version_file={LOADED_FILE}", tasks_from="status")
        assert pending.rc == 0, pending.stdout[-3000:]
        assert "REBOOT PENDING: NVIDIA driver 580.95.05 is installed, the loaded module is 575.51.03" in one_line(
            pending.stdout
        )
        write_loaded_version(host, "580.95.05")
        running = probe("nvidia_driver", "-e", f"nvidia_driver_loaded_version_file={LOADED_FILE}", tasks_from="status")
        assert running.rc == 0, running.stdout[-3000:]
        text = one_line(running.stdout)
        assert "ALREADY RUNNING: NVIDIA driver 580.95.05" in text
        assert "REBOOT PENDING" not in text
        assert recap(running)["changed"] == 0
    finally:
        host.run(f"rm -f {LOADED_FILE}")


def test_bad_input_fails_before_any_change(background_runs):
    cases = background_runs["cases"].result()
    for name, (role, _, message) in REFUSALS.items():
        stats, results = cases[name]["stats"], cases[name]["results"]
        failed = [result for result in results if result.event == "runner_on_failed"]
        assert stats["failures"] == 1 and len(failed) == 1, f"{name}: not refused ({stats})"
        assert stats["changed"] == 0, name
        refusal = failed[0]
        assert message in strings_of(refusal.res), f"{name}: {refusal.task}: {strings_of(refusal.res)[-1500:]}"
        assert refusal == results[-1], f"{name}: tasks ran after the refusal"
        if name in INPUT_CHECK_REFUSALS:
            assert refusal.role == "input_check", f"{name}: refused by {refusal.role}: {refusal.task!r}"
            assert role not in {result.role for result in results}, f"{name}: a task of {role} ran"


def test_preflight_warns_about_translated_iommu_with_the_fix(background_runs):
    cases = background_runs["cases"].result()
    translated, passthrough = cases["cmdline-translated"], cases["cmdline-passthrough"]
    for case in (translated, passthrough):
        assert case["stats"]["failures"] == 0 and case["stats"]["changed"] == 0, case["stats"]
    said_translated = strings_of([result.res for result in translated["results"]])
    assert "1 IOMMU/ACS finding(s)" in said_translated
    assert "add iommu=pt to GRUB_CMDLINE_LINUX" in said_translated
    assert "0 IOMMU/ACS finding(s)" in strings_of([result.res for result in passthrough["results"]])


def test_branch_change_moves_cleanly_and_back(host, background_runs):
    """Runs last: 580 -> 590 -> 580, pins and pinning packages follow, downgrades included."""
    for future in background_runs.values():
        future.result()
    to_590 = probe("nvidia_driver", "-e", "nvidia_driver_branch=590")
    assert to_590.rc == 0, one_line(to_590.stdout)[-3000:]
    assert policy(host, "nvidia-open") == (V590, V590)
    assert host.package("nvidia-driver-pinning-590").is_installed
    assert not host.package("nvidia-driver-pinning-580").is_installed
    assert "Pin: version 590.*" in host.file("/etc/apt/preferences.d/nvidia-driver-branch.pref").content_string

    back = probe("nvidia_driver")
    assert back.rc == 0, one_line(back.stdout)[-3000:]
    for package in ("nvidia-open", "nvidia-kernel-open-dkms", "libnvidia-compute"):
        assert policy(host, package) == (V580, V580), package
    assert host.package("nvidia-driver-pinning-580").is_installed
    assert not host.package("nvidia-driver-pinning-590").is_installed
    assert "590." not in host.check_output("apt-get -s dist-upgrade")


# Another requirement set (a comment line changes its hash), installed as the converge's was: with six's hash.
SET_V2 = json.dumps({"python_env_requirements": ["six==1.17.0", "# set v2"], "python_env_hashes": SIX_HASHES})


def test_changed_requirement_set_builds_a_new_venv_and_leaves_the_old_one_as_it_was(host, background_runs):
    for future in background_runs.values():
        future.result()
    venv = ("-e", "python_env_name=provision-test", "-e", "python_env_envs_dir=/opt/provision-test/envs")
    [old] = the_venvs(host)
    old_digest = tree_digest(host, old)
    changed = probe("python_env", *venv, "-e", SET_V2)
    assert changed.rc == 0, one_line(changed.stdout)[-3000:]
    synced = r"uv pip sync --require-hashes\)\][^\[]*?changed: \["
    assert re.search(synced, one_line(changed.stdout)), "a changed set must be installed"
    new = [v for v in the_venvs(host) if v != old]
    assert len(new) == 1, the_venvs(host)
    after = json.loads(host.file(f"{new[0]}/python-env.json").content_string)
    before = json.loads(host.file(f"{old}/python-env.json").content_string)
    assert after["requirements_sha256"] != before["requirements_sha256"]
    assert tree_digest(host, old) == old_digest, "the venv of the other set was written to"
    again = probe("python_env", *venv, "-e", SET_V2)
    assert recap(again)["changed"] == 0
    assert not re.search(synced, one_line(again.stdout)), "an unchanged set must not be reinstalled"
    assert host.check_output(f"{new[0]}/bin/python -c 'import six; print(six.__version__)'") == "1.17.0"
