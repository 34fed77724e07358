"""The engine unit and the boot unit as the role renders them, scored by systemd's own `systemd-analyze security`.

The templates (roles/engine_service/templates) are rendered with the collection's own filters and every variable they
read given (StrictUndefined: a new one fails here, not as an empty line in a unit); `systemd-analyze security
--offline=yes` scores the files as systemd would, and `systemd-analyze verify` checks them. The host scenarios run
the engines under the same units.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
from ansible_collections.blackwell.serving.plugins.filter.systemd_quote import FilterModule

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "roles" / "engine_service" / "templates"
# The exposure each unit may have at most (0 = locked down, 10 = none; systemd says "OK" up to 4.9).
BASELINE_MAX, STRICT_MAX, BOOT_MAX = 3.5, 3.5, 5.0
UNIT_VARS = {
    "ansible_managed": "Ansible managed", "engine_service_engine": "sglang", "engine_service_engine_version": "0.5.23",
    "engine_service_profile": "kimi-k25-int4", "engine_service_description": "sglang inference server",
    "engine_service_conflicts": ["vllm.service"], "engine_service_require_gpu_nodes": True,
    "engine_service_start_limit_interval_s": 3600, "engine_service_start_limit_burst": 3,
    "engine_service_user": "sglang", "engine_service_group": "sglang", "engine_service_name": "sglang",
    "engine_service_writable_paths": ["/srv/models"],
    "engine_service_environment": {"HF_HOME": "/var/cache/sglang/hf", "HF_HUB_OFFLINE": "1"},
    "engine_service_credentials": [],
    "engine_service_exec_start": ["/usr/bin/python3", "-m", "sglang.launch_server", "--config", "/x/config.yaml"],
    "engine_service_timeout_start_s": "infinity", "engine_service_timeout_stop_s": 180, "engine_service_restart_s": 30,
    "engine_service_limit_nofile": 1048576, "engine_service_state_dir": "/var/lib/llm-serving",
    "engine_service_libexec_dir": "/usr/local/libexec/llm-serving",
    "engine_service_trial_unit_dir": "/run/systemd/system.control",
    "engine_service_all_units": ["sglang.service", "vllm.service"],
}


def render(template: str, directory: Path, name: str, **overrides: object) -> Path:
    env = jinja2.Environment(trim_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters.update({f"blackwell.serving.{key}": value for key, value in FilterModule().filters().items()})
    env.filters["comment"] = lambda text: f"#\n# {text}\n#"  # Ansible's comment filter, its default style
    path = directory / name
    path.write_text(env.from_string((TEMPLATES / template).read_text()).render(**{**UNIT_VARS, **overrides}))
    return path


def analyze(*args: str) -> subprocess.CompletedProcess:
    systemd_analyze = shutil.which("systemd-analyze")
    assert systemd_analyze, "systemd-analyze is missing: scripts/bootstrap.sh installs the systemd package"
    return subprocess.run([systemd_analyze, *args], check=False, capture_output=True, text=True, timeout=60)


def exposure(unit: Path) -> tuple[float, str]:
    result = analyze("security", "--offline=yes", "--no-pager", str(unit))
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    return float(match.group(1)), result.stdout


def directives(unit: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


@pytest.mark.parametrize(("hardening", "ceiling"), [("baseline", BASELINE_MAX), ("strict", STRICT_MAX)])
def test_the_engine_unit_scores_at_most_its_ceiling(tmp_path: Path, hardening: str, ceiling: float) -> None:
    unit = render("engine.service.j2", tmp_path, "sglang.service", engine_service_hardening=hardening)
    score, table = exposure(unit)
    print(f"{hardening}: {score}")
    assert score <= ceiling, table
    verified = analyze("verify", "--man=no", f"{unit}:sglang.service")
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr


def test_strict_is_tighter_than_baseline(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "s").mkdir()
    baseline = exposure(render("engine.service.j2", tmp_path / "b", "sglang.service",
                               engine_service_hardening="baseline"))[0]
    strict = exposure(render("engine.service.j2", tmp_path / "s", "sglang.service",
                             engine_service_hardening="strict"))[0]
    assert strict < baseline


def test_baseline_leaves_the_gpus_and_the_jit_alone(tmp_path: Path) -> None:
    """What CUDA needs of the unit: /dev/nvidia* visible (no PrivateDevices, no device allow-list: ProtectClock would
    make one, `DeviceAllow=char-rtc r`), writable executable memory (PyTorch's and Triton's JIT), Unix and TCP
    sockets (CUDA IPC, NCCL), and the GPUs' memory locked (LimitMEMLOCK)."""
    found = directives(render("engine.service.j2", tmp_path, "sglang.service", engine_service_hardening="baseline"))
    assert found["PrivateDevices"] == ["no"] and found["MemoryDenyWriteExecute"] == ["no"]
    assert "DevicePolicy" not in found and "DeviceAllow" not in found and "ProtectClock" not in found
    assert set(found["RestrictAddressFamilies"][0].split()) == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
    assert found["LimitMEMLOCK"] == ["infinity"]
    assert found["CapabilityBoundingSet"] == [""] and found["NoNewPrivileges"] == ["yes"]


def test_strict_lists_every_gpu_device_it_allows(tmp_path: Path) -> None:
    found = directives(render("engine.service.j2", tmp_path, "sglang.service", engine_service_hardening="strict"))
    assert found["DevicePolicy"] == ["closed"]
    assert {entry.split()[0] for entry in found["DeviceAllow"]} == {
        "char-nvidia*", "char-nvidiactl", "char-nvidia-frontend", "char-nvidia-uvm", "char-nvidia-caps"}


def test_the_boot_unit_scores_at_most_its_ceiling_and_writes_only_the_unit_directories(tmp_path: Path) -> None:
    unit = render("engine-boot.service.j2", tmp_path, "llm-serving-boot.service")
    score, table = exposure(unit)
    print(f"boot: {score}")
    assert score <= BOOT_MAX, table
    found = directives(unit)
    assert found["ProtectSystem"] == ["strict"]
    assert found["ReadWritePaths"] == ["/etc/systemd/system", "-/run/systemd/system.control"]
    assert found["RestrictAddressFamilies"] == ["AF_UNIX"] and found["PrivateNetwork"] == ["yes"]
    verified = analyze("verify", "--man=no", f"{unit}:llm-serving-boot.service")
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr
