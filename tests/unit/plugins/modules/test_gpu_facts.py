"""gpu_facts and plugins/module_utils/bws_nvidia on recorded (H200) and constructed (8-GPU) nvidia-smi output."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
from tests.module_utils_loader import use_repository_module_utils  # noqa: E402

use_repository_module_utils()
sys.path.insert(0, str(REPO / "plugins" / "modules"))

import gpu_facts  # noqa: E402
from ansible.module_utils.testing import patch_module_args  # noqa: E402
from ansible_collections.blackwell.serving.plugins.module_utils.nvidia import smi as nv  # noqa: E402

FIX = REPO / "tests" / "fixtures" / "nvidia-smi"
H200 = FIX / "h200-3procs"
RTX8 = FIX / "rtxpro6000-8gpu-constructed"


def replay_runner(gpu_csv: Path, apps_csv: Path):
    def run(argv):
        if argv[1].startswith("--query-gpu="):
            return 0, gpu_csv.read_text(), ""
        if argv[1].startswith("--query-compute-apps="):
            return 0, apps_csv.read_text(), ""
        return 2, "", "unexpected"

    return run


def write_replay_smi(tmp_path: Path, gpu_csv: Path, apps_csv: Path) -> Path:
    """A nvidia-smi stand-in for main(): replays fixture files for the two queries."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --query-gpu=*) cat "{gpu_csv}";; --query-compute-apps=*) cat "{apps_csv}";; '
        "*) exit 2;; esac\n"
    )
    script.chmod(0o755)
    return script


def run_main(args: dict, capsys) -> tuple[int, dict]:
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        gpu_facts.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


def test_recorded_h200_gpu_row():
    (gpu,) = nv.gpus_from_csv((H200 / "query-gpu-busy.csv").read_text())
    assert gpu == {
        "index": 0,
        "uuid": "GPU-ea82d19a-2c61-37a1-249d-ead4e4c1c48b",
        "name": "NVIDIA H200",
        "pci_bus_id": "00000000:00:06.0",
        "bus_id": "0000:00:06.0",
        "driver_version": "580.159.04",
        "compute_cap": "9.0",
        "memory_used_mib": 13114,
        "memory_total_mib": 143771,
        "utilization_gpu_pct": 0,
        "persistence_mode": True,
    }


def test_recorded_h200_apps_sum_to_memory_used():
    apps = nv.apps_from_csv((H200 / "query-apps-busy.csv").read_text())
    assert sorted(a["pid"] for a in apps) == [428, 429, 430]
    assert sum(a["used_mib"] for a in apps) == 4706 + 4706 + 3682
    assert {a["bus_id"] for a in apps} == {"0000:00:06.0"}


def test_fields_match_the_recorded_commands():
    readme = (FIX / "README.md").read_text()
    assert " ".join(nv.QUERY_GPU_ARGS) in readme
    assert " ".join(nv.QUERY_APPS_ARGS) in readme


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:00:06.0", "0000:00:06.0"),
        ("0000:A1:00.0", "0000:a1:00.0"),
        ("00000001:c1:00.1", "0001:c1:00.1"),
    ],
)
def test_bus_ids_normalize(raw, expected):
    assert nv.normalize_bus_id(raw) == expected


def test_process_name_with_comma_is_reassembled():
    (app,) = nv.apps_from_csv("77, /opt/my, app/python3, 10, GPU-x, 00000000:01:00.0\n")
    assert app["name"] == "/opt/my, app/python3"
    assert app["used_mib"] == 10


def test_not_available_values_become_none():
    (app,) = nv.apps_from_csv("77, python3, [N/A], GPU-x, 00000000:01:00.0\n")
    assert app["used_mib"] is None


def test_short_row_is_a_clear_error():
    with pytest.raises(nv.NvidiaError, match="has 3 columns, expected 5"):
        nv.apps_from_csv("1, a, 2\n")


def test_device_minor_differs_from_index_on_the_8_gpu_host():
    gpus = nv.gpus_from_csv((RTX8 / "query-gpu-busy.csv").read_text())
    nv.attach_minors(gpus, nv.read_driver_gpus(str(RTX8 / "proc-driver-nvidia")))
    assert [g["minor"] for g in gpus] == [2, 3, 0, 1, 6, 7, 4, 5]
    assert {g["minor_source"] for g in gpus} == {"driver"}
    assert {g["compute_cap"] for g in gpus} == {"12.0"}


def test_gather_attributes_processes_per_gpu_by_uuid():
    facts = nv.gather(
        sys.executable,  # any executable: the replay runner answers instead of it
        str(RTX8 / "proc-driver-nvidia"),
        replay_runner(RTX8 / "query-gpu-busy.csv", RTX8 / "query-apps-busy.csv"),
    )
    assert facts["gpu_count"] == 8
    assert facts["driver_version"] == "580.105.08"
    gpu0 = facts["gpus"][0]
    assert sorted(p["pid"] for p in gpu0["processes"]) == [5101, 5200]
    for gpu in facts["gpus"][1:]:
        assert [p["pid"] for p in gpu["processes"]] == [5101 + gpu["index"]]


def test_missing_tool_says_whether_the_driver_is_loaded(tmp_path):
    with pytest.raises(nv.NvidiaError) as exc:
        nv.gather(str(tmp_path / "nvidia-smi"), str(tmp_path / "no-driver"))
    assert exc.value.kind == "missing_tool"
    assert "not loaded" in str(exc.value)
    with pytest.raises(nv.NvidiaError) as exc:
        nv.gather(str(tmp_path / "nvidia-smi"), str(H200 / "proc-driver-nvidia"))
    assert "driver is loaded" in str(exc.value)


def test_driver_not_loaded_output_is_recognised(tmp_path):
    def runner(argv):
        return 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", ""

    with pytest.raises(nv.NvidiaError) as exc:
        nv.gather(sys.executable, str(tmp_path), runner)
    assert exc.value.kind == "no_driver"


def test_main_reports_facts(tmp_path, capsys):
    smi = write_replay_smi(tmp_path, H200 / "query-gpu-busy.csv", H200 / "query-apps-busy.csv")
    code, out = run_main({"nvidia_smi": str(smi), "driver_proc_dir": str(H200 / "proc-driver-nvidia")}, capsys)
    assert code == 0
    assert out["available"] is True and out["changed"] is False
    (gpu,) = out["gpus"]
    assert gpu["minor"] == 0 and gpu["persistence_mode"] is True
    # The driver keeps a little memory of its own (20 MiB on the recorded H200) outside any process.
    assert 0 <= gpu["memory_used_mib"] - sum(p["used_mib"] for p in gpu["processes"]) < 64


def test_main_fails_without_nvidia_smi(tmp_path, capsys):
    code, out = run_main({"nvidia_smi": str(tmp_path / "none"), "driver_proc_dir": str(tmp_path)}, capsys)
    assert code == 1
    assert out["failed"] is True
    assert "nvidia-smi not found" in out["msg"] and "not loaded" in out["msg"]


def test_main_without_driver_can_return_instead_of_failing(tmp_path, capsys):
    args = {"nvidia_smi": str(tmp_path / "none"), "driver_proc_dir": str(tmp_path), "fail_on_missing": False}
    code, out = run_main(args, capsys)
    assert code == 0
    assert out["available"] is False and out["driver_loaded"] is False
    assert out["gpus"] == [] and "nvidia-smi not found" in out["reason"]


def process_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (Z: a zombie), None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rfind(")") + 2:].split()[0]


def test_hung_nvidia_smi_ends_at_the_timeout_and_says_so(tmp_path, capsys, monkeypatch):
    hung, pidfile = tmp_path / "nvidia-smi", tmp_path / "nvidia-smi.pid"
    hung.write_text(f'#!/bin/sh\necho $$ > "{pidfile}"\nexec sleep 600\n')  # exec: the pid stays the sleep's
    hung.chmod(0o755)
    started: list[subprocess.Popen] = []

    class Recorded(subprocess.Popen):
        """subprocess.Popen, remembering each child the module starts (subprocess.run starts it through this)."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(subprocess, "Popen", Recorded)
    rc, result = run_main({"nvidia_smi": str(hung), "timeout_s": 1, "fail_on_missing": False}, capsys)
    assert rc == 1 and result["failed"] is True and result["kind"] == "timeout"
    assert "did not finish within 1 s (timeout_s)" in result["msg"]
    # The stand-in was killed at the timeout and reaped, not left hanging (its 600 s sleep is no deadline here).
    (child,) = [proc for proc in started if proc.args[0] == str(hung)]
    assert child.returncode == -signal.SIGKILL, child.returncode
    assert process_state(child.pid) in (None, "Z"), f"the hung nvidia-smi {child.pid} still runs"
    if pidfile.exists() and pidfile.read_text().strip():  # it got as far as its first line before the kill
        assert int(pidfile.read_text()) == child.pid
