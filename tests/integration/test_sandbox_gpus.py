"""The sandbox's simulated GPUs as a user meets them: `bash scripts/sandbox.sh` (deploy_sglang.yml) and
`bash scripts/sandbox.sh teardown.yml`, run as the README gives them on a sandbox of the test's own
(BWS_SANDBOX_NAME), their printed output read as the user reads it.

The sandbox simulates the reference host's 8 RTX PRO 6000 (tests/fixtures/nvidia-smi/rtxpro6000-8gpu-constructed)
with the NVIDIA-SMI TEST DOUBLE over stand-in device files (inventory/sandbox, tests/sandbox/prepare_host.yml): the
deploy's GPU preflight checks them and says they are simulated, the ENGINE TEST DOUBLE holds GPU 0 while it serves,
teardown verifies all 8, and a foreign holder on a simulated GPU (tests/doubles/gpu_holder_double.py, run as root in
the container) is refused by the next deploy's preflight, named by its PID, and left alive by teardown. The tests
share the sandbox and run in file order; the sandbox is removed at the end (the holder with it).

The same sandbox holds what a deploy leaves on a systemd host (this was Molecule's default scenario, which booted a
host of its own for the same deploy and teardown): the unit, its hardening, the engine's user, the release's files and
state, a second deploy and a check-mode deploy that change nothing, and a teardown that leaves the unit inactive and
disabled with nothing to boot.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import PurePosixPath

import pytest

from tests.integration.engine_host import REPO, podman
from tests.integration.gpu_helpers import MINOR_OF_INDEX
from tests.integration.lifecycle_helpers import CONTAINER_MARKS
from tests.playbook_run import PlaybookRun, run_playbook

pytestmark = CONTAINER_MARKS

NAME = "bws-it-sandbox-gpus"
HOST = "bws-sandbox"  # inventory/sandbox's host, whichever container it reaches
GPU_DOUBLE = "/opt/bws-gpu-double"  # inventory/sandbox's sandbox_gpu_double_dir
NVIDIA_SMI = f"{GPU_DOUBLE}/nvidia-smi"  # the NVIDIA-SMI TEST DOUBLE's wrapper on the sandbox host
CHECKED = ("8 GPU(s) (NVIDIA RTX PRO 6000 Blackwell Server Edition) with driver 580.105.08 and compute capability "
           "12.0; the profile needs 1 GPU(s) (tensor 1 x data 1), driver branch >= 580 and compute capability "
           ">= 8.0.")
SIMULATED = ("SIMULATED GPUs: the 8 NVIDIA RTX PRO 6000 here are the NVIDIA-SMI TEST DOUBLE "
             "(tests/doubles/nvidia_smi_double.py) over stand-in device files")
GPU_LINE = re.compile(r"GPU (\d) \(minor (\d)\): ([^;]*); (\d+) -> (\d+) MiB \(freed \d+\); (clean|NOT clean[^']*)")
HOLDER_MIB = 4096
HEALTH = ("python3 -c \"import urllib.request as u; "
          "print(u.urlopen('http://127.0.0.1:30000/health', timeout=10).status)\"")
BOOT_DRY_RUN = ("/usr/bin/python3 -I /usr/local/libexec/llm-serving/engine_boot.py --dry-run --unit sglang.service "
                "--unit vllm.service")
RELEASE = re.compile(r"^sglang-[0-9a-f]{12}$")


def sandbox(*args: str, destroy: bool = False) -> tuple[int, str]:
    """`bash scripts/sandbox.sh ARGS` on this test's sandbox: (exit status, its output with whitespace runs as one
    space, as the play's wrapped lines read)."""
    env = {**os.environ, "BWS_SANDBOX_NAME": NAME, "ANSIBLE_NOCOLOR": "1"}
    if destroy:
        env["BWS_SANDBOX_DESTROY"] = "1"
    run = subprocess.run(["bash", "scripts/sandbox.sh", *args], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=900, check=False)
    return run.returncode, " ".join((run.stdout + run.stderr).split())


def on_host(command: str) -> str:
    return podman("exec", NAME, "sh", "-c", command).stdout.strip()


def deploy_through_the_runner(*, check: bool = False) -> PlaybookRun:
    """deploy_sglang.yml on this test's sandbox through tests/playbook_run.py, the runner whose events give the recap
    (the sandbox inventory names its host bws-sandbox and reaches the container BWS_SANDBOX_NAME)."""
    return run_playbook("playbooks/deploy_sglang.yml", REPO / "inventory" / "sandbox", check=check, diff=check,
                        envvars={"BWS_SANDBOX_NAME": NAME}, timeout=900)


def stat(path: str) -> tuple[str, str, int]:
    owner, group, mode = on_host(f"stat -c '%U %G %a' {path}").split()
    return owner, group, int(mode, 8)


def unit_text() -> str:
    return on_host("cat /etc/systemd/system/sglang.service")


def compute_apps() -> list[list[str]]:
    """nvidia-smi's compute apps on the sandbox host (the NVIDIA-SMI TEST DOUBLE): [pid, MiB, bus id] rows."""
    out = on_host(f"{NVIDIA_SMI} --query-compute-apps=pid,used_memory,gpu_bus_id --format=csv,noheader,nounits")
    return [row.split(", ") for row in out.splitlines()]


@pytest.fixture(scope="module")
def sandbox_host():
    assert podman("container", "exists", NAME, check=False).returncode != 0, (
        f"a container {NAME} is left from an earlier run: podman rm -f {NAME}")
    try:
        yield NAME
    finally:
        sandbox(destroy=True)


def test_the_deploy_checks_the_simulated_gpus_and_says_they_are_simulated(sandbox_host):
    rc, out = sandbox()
    assert rc == 0, out[-4000:]
    assert CHECKED in out, out[-6000:]
    assert SIMULATED in out
    assert "were NOT checked" not in out and "no NVIDIA driver on this host" not in out
    # The switch verified the 8 simulated GPUs before the engine started, and said they are simulated.
    assert "bws-sandbox: 8 GPU(s), driver 580.105.08. SIMULATED GPUs" in out
    # The ENGINE TEST DOUBLE holds GPU 0 (device minor 2, bus 01:00.0) while it serves, as an engine does.
    engine = on_host("systemctl show -p MainPID --value sglang")
    assert compute_apps() == [[engine, "86000", "00000000:01:00.0"]]
    assert f"device minors [{MINOR_OF_INDEX[0]}]" in on_host("journalctl -u sglang -o cat --no-pager")


def test_the_unit_serves_and_is_what_the_boot_unit_starts(sandbox_host):
    assert on_host("systemctl is-active sglang") == "active"
    # No engine unit is enabled: the boot unit is, and starts the release state.json names.
    assert on_host("systemctl is-enabled sglang || true") == "disabled"
    assert on_host("systemctl is-enabled vllm || true") != "enabled"  # vLLM was never deployed here
    assert on_host("systemctl is-enabled llm-serving-boot") == "enabled"
    choice = json.loads(on_host(BOOT_DRY_RUN))
    state = json.loads(on_host("cat /var/lib/llm-serving/state.json"))
    assert RELEASE.match(state["current"]), state
    assert choice["unit"] == "sglang.service" and choice["release"] == state["current"], choice
    assert on_host(HEALTH) == "200"


def test_the_unit_is_exec_hardened_and_bounded(sandbox_host):
    assert stat("/etc/systemd/system/sglang.service") == ("root", "root", 0o644)
    text = unit_text()
    for line in ("Type=exec", "KillMode=mixed", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "PrivateTmp=yes", "RemoveIPC=yes", "LimitMEMLOCK=infinity", "User=sglang",
                 "Conflicts=vllm.service", "Restart=on-failure"):
        assert line in text.splitlines(), line
    unit_section = text.split("[Service]")[0]
    assert "StartLimitBurst=" in unit_section and "StartLimitIntervalSec=" in unit_section
    assert re.search(r"^ExecStart=/opt/sglang/venv/bin/sglang serve --config /var/lib/llm-serving/releases/"
                     r"sglang-[0-9a-f]{12}/config.yaml$", text, re.M), text


def test_the_engine_runs_as_the_service_user(sandbox_host):
    main_pid = on_host("systemctl show -p MainPID --value sglang")
    assert main_pid.isdigit() and main_pid != "0"
    assert on_host(f"ps -o user= -p {main_pid}") == "sglang"


def test_the_config_is_readable_by_root_and_the_service_group_only(sandbox_host):
    config = on_host("ls /var/lib/llm-serving/releases/sglang-*/config.yaml")
    assert stat(config) == ("root", "sglang", 0o640)
    text = on_host(f"cat {config}")
    assert 'speculative-algorithm: "EAGLE3"' in text and "tp-size: 1" in text, text


def test_sglang_logs_through_the_release_logging_configuration(sandbox_host):
    """SGLang logs its server_args (api_key included) on start: the release's logging.json, on the unit's
    SGLANG_LOGGING_CONFIG_PATH, filters it with the module beside it on PYTHONPATH."""
    text = unit_text()
    release = re.search(r'^Environment="PYTHONPATH=(/var/lib/llm-serving/releases/sglang-[0-9a-f]{12})"$', text, re.M)
    assert release, text
    assert f'Environment="SGLANG_LOGGING_CONFIG_PATH={release.group(1)}/logging.json"' in text.splitlines()
    config = json.loads(on_host(f"cat {release.group(1)}/logging.json"))
    assert config["filters"]["redact_api_keys"]["()"] == "bws_sglang_logging.RedactApiKeys"
    assert on_host(f"test -f {release.group(1)}/bws_sglang_logging.py && echo present") == "present"


def test_the_state_records_the_serving_release_and_its_files(sandbox_host):
    state = json.loads(on_host("cat /var/lib/llm-serving/state.json"))
    release_dir = PurePosixPath("/var/lib/llm-serving/releases") / state["current"]
    assert on_host(f"test -f {release_dir}/release.json && echo present") == "present"
    assert json.loads(on_host(f"cat {release_dir}/release.json"))["engine"] == "sglang"


def test_a_second_deploy_changes_nothing(sandbox_host):
    """Idempotence, as Molecule's step checks it: the same deploy again reports no change and leaves the engine
    process serving."""
    engine = on_host("systemctl show -p MainPID --value sglang")
    run = deploy_through_the_runner()
    assert run.status == "successful", run.stdout[-4000:]
    assert run.recap(HOST)["changed"] == 0, run.stdout[-4000:]
    assert on_host("systemctl show -p MainPID --value sglang") == engine, "the second deploy restarted the engine"


def test_a_check_mode_deploy_on_the_deployed_host_changes_nothing(sandbox_host):
    run = deploy_through_the_runner(check=True)
    assert run.status == "successful", run.stdout[-4000:]
    assert run.recap(HOST)["changed"] == 0, run.stdout[-4000:]
    assert "--- before" not in run.stdout


def test_teardown_verifies_the_8_simulated_gpus_free(sandbox_host):
    rc, out = sandbox("teardown.yml", "-e", "teardown_confirm=yes")
    assert rc == 0, out[-4000:]
    assert SIMULATED in out
    gpus = GPU_LINE.findall(out)
    assert sorted((int(i), int(m)) for i, m, *_ in gpus) == list(enumerate(MINOR_OF_INDEX)), out[-4000:]
    assert all(after == "0" and state == "clean" for *_, after, state in gpus), gpus
    assert compute_apps() == []
    used = on_host(f"{NVIDIA_SMI} --query-gpu=index,memory.used --format=csv,noheader,nounits")
    assert used.splitlines() == [f"{i}, 0" for i in range(8)]


def test_after_teardown_the_unit_is_inactive_disabled_and_nothing_boots(sandbox_host):
    assert on_host("systemctl is-active sglang || true") == "inactive"
    assert on_host("systemctl is-enabled sglang || true") == "disabled"
    assert on_host(f"{HEALTH} 2>/dev/null || echo refused") == "refused"
    # state.json says stopped: the boot unit starts nothing.
    assert json.loads(on_host(BOOT_DRY_RUN))["unit"] is None


def test_a_foreign_holder_is_refused_by_preflight_and_left_alive_by_teardown(sandbox_host):
    # A stranger's CUDA process on GPU 0 (device minor 2), 4 GiB: the GPU holder double, as root in the container.
    subprocess.run(["podman", "cp", str(REPO / "tests/doubles/gpu_holder_double.py"),
                    f"{NAME}:/root/gpu_holder_double.py"], check=True)
    minor = MINOR_OF_INDEX[0]
    spec = {"open": [f"{GPU_DOUBLE}/dev/nvidiactl", f"{GPU_DOUBLE}/dev/nvidia-uvm", f"{GPU_DOUBLE}/dev/nvidia{minor}"]}
    podman("exec", "-d", "-e", f"HOLDER_SPEC={json.dumps(spec)}", "-e", f"NVSIM_MEM_MIB={minor}:{HOLDER_MIB}", NAME,
           "python3", "/root/gpu_holder_double.py")
    find = "pgrep -f '[g]pu_holder_double'"  # [g]: never matches the shell running pgrep
    pid = on_host(f"for i in $(seq 50); do {find} && exit 0; sleep 0.1; done")
    assert pid.isdigit(), pid
    assert compute_apps() == [[pid, str(HOLDER_MIB), "00000000:01:00.0"]]

    rc, out = sandbox()
    assert rc != 0
    assert CHECKED in out and SIMULATED in out, "the GPU checks ran before the refusal"
    refused = rf"foreign processes use the GPUs \(not signalled\): PID {pid}\b[^;]*? on GPUs \[0\]"
    assert re.search(refused, out), out[-4000:]
    assert "nothing was stopped, signalled or removed" in out
    assert on_host("systemctl is-active sglang || true") == "inactive", "the engine was not started"

    rc, out = sandbox("teardown.yml", "-e", "teardown_confirm=yes")
    assert rc == 0, out[-4000:]
    assert re.search(rf"foreign, not signalled: {pid}\b[^']*? on GPUs \[0\]: ", out), out[-4000:]
    gpu0 = next(g for g in GPU_LINE.findall(out) if g[0] == "0")
    assert gpu0[2:] == ("1 foreign", str(HOLDER_MIB), str(HOLDER_MIB), f"NOT clean (compute apps left: {pid})")
    assert on_host(f"kill -0 {pid} && echo alive") == "alive", "teardown left the foreign holder alive"
