"""The interconnect_proof module's logic: what of the unit is passed to systemd-run, the environment it reads from
the unit (Environment= as the engine_service template writes it, EnvironmentFile=), the record key, record
matching, what changed since the last proof, and the failure message. The module running the proof through
systemd-run as the unit's user is shown on a systemd host in tests/integration/test_interconnect_proof_deploy.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
from tests.module_utils_loader import use_repository_module_utils  # noqa: E402

use_repository_module_utils()
sys.path.insert(0, str(REPO / "plugins" / "modules"))
sys.path.insert(0, str(REPO / "plugins" / "filter"))

import importlib.util  # noqa: E402

import interconnect_proof as proof  # noqa: E402
from ansible.module_utils.testing import patch_module_args  # noqa: E402
from systemd_quote import systemd_env_value  # noqa: E402

ENV = {"NCCL_DEBUG": "WARN", "NCCL_P2P_LEVEL": "SYS", "CUDA_HOME": "/usr/local/cuda", "HOME": "/var/lib/sglang",
       "ODD": 'a "quoted" 100% \\ value'}


def unit_text(env: dict[str, str], env_file: str = "") -> str:
    """The [Service] part of roles/engine_service/templates/engine.service.j2, rendered the way the template does."""
    lines = ["[Unit]", "Description=x", "StartLimitBurst=3", "", "[Service]", "Type=exec", "User=sglang",
             "Group=sglang", "WorkingDirectory=/var/lib/sglang", "StateDirectory=sglang", "UMask=0027"]
    lines += [f'Environment="{key}={systemd_env_value(value)}"' for key, value in sorted(env.items())]
    if env_file:
        lines.append(f"EnvironmentFile={env_file}")
    lines += ["ExecStart=/opt/sglang/venv/bin/sglang serve --config /x/config.yaml", "KillMode=mixed",
              "TimeoutStopSec=180", "Restart=on-failure", "RestartSec=30", "NoNewPrivileges=yes",
              "ProtectSystem=strict", "PrivateTmp=yes", "DeviceAllow=char-nvidia* rw", "", "[Install]",
              "WantedBy=multi-user.target"]
    return "\n".join(lines) + "\n"


def test_the_unit_environment_is_read_back_exactly_as_the_template_wrote_it():
    settings = proof.service_settings(unit_text(ENV))
    assert proof.unit_environment(settings) == ENV


def test_environment_file_values_override_and_only_interconnect_variables_are_kept(tmp_path):
    env_file = tmp_path / "api-key.env"
    env_file.write_text("# secrets\nVLLM_API_KEY=s3cr3t\nNCCL_DEBUG='INFO'\n")
    settings = proof.service_settings(unit_text(ENV, str(env_file)))
    environment = proof.interconnect_environment(proof.unit_environment(settings))
    assert environment == {"CUDA_HOME": "/usr/local/cuda", "NCCL_DEBUG": "INFO", "NCCL_P2P_LEVEL": "SYS"}
    assert "s3cr3t" not in json.dumps(environment)


def test_a_missing_environment_file_fails_unless_optional(tmp_path):
    missing = str(tmp_path / "nope.env")
    with pytest.raises(OSError, match="cannot be read"):
        proof.unit_environment(proof.service_settings(unit_text({}, missing)))
    assert proof.unit_environment(proof.service_settings(unit_text({}, "-" + missing))) == {}


def test_systemd_run_gets_the_units_user_environment_and_hardening_but_not_its_lifecycle():
    settings = proof.service_settings(unit_text(ENV))
    params = {"systemd_run": "systemd-run", "timeout_s": 60, "python": "/opt/sglang/venv/bin/python",
              "script": "/usr/local/libexec/llm-serving/interconnect_proof.py", "world_size": 8, "backend": "nccl",
              "sizes_mib": [1.0, 64.0, 256.0], "nvidia_smi": "nvidia-smi", "gpus": ["0", "1"], "engine": "sglang",
              "engine_model": "/usr/local/libexec/llm-serving/interconnect_engine_sglang.py",
              "engine_env_prefixes": ["SGLANG_"], "engine_flags": ["enable-nccl-nvls"], "custom_all_reduce": True}
    argv = proof.systemd_run_argv(params, settings, "sglang-interconnect-proof")
    props = [argv[i + 1] for i, word in enumerate(argv) if word == "-p"]
    assert "User=sglang" in props and "NoNewPrivileges=yes" in props and "ProtectSystem=strict" in props
    assert "DeviceAllow=char-nvidia* rw" in props and "StateDirectory=sglang" in props
    assert 'Environment="ODD=a \\"quoted\\" 100% \\\\ value"' in props, "%% is a unit-file escape only"
    assert "RuntimeMaxSec=90" in props
    assert not [p for p in props if p.split("=", 1)[0] in ("Type", "ExecStart", "KillMode", "TimeoutStopSec",
                                                           "Restart", "RestartSec")]
    assert argv[argv.index("--") + 1:] == [
        "/opt/sglang/venv/bin/python", "/usr/local/libexec/llm-serving/interconnect_proof.py", "--world-size", "8",
        "--backend", "nccl", "--timeout-s", "60", "--sizes-mib", "1,64,256", "--nvidia-smi", "nvidia-smi",
        "--engine", "sglang", "--engine-model", "/usr/local/libexec/llm-serving/interconnect_engine_sglang.py",
        "--env-prefixes", "SGLANG_", "--engine-flags", "enable-nccl-nvls", "--custom-all-reduce", "--gpus", "0,1"]
    assert {"--wait", "--pipe", "--collect", "--unit=sglang-interconnect-proof"} <= set(argv)


IDENTITY = {"driver_version": "580.105.08", "gpus": ["GPU-a", "GPU-b"], "engine": "sglang 0.5.23"}


def test_a_path_inside_the_release_directory_does_not_make_the_next_release_prove_again():
    """SGLang's unit points SGLANG_LOGGING_CONFIG_PATH at its release's logging.json: the key must not name the
    release, or every deploy would prove again on an unchanged fabric."""
    def key(release: str, level: str = "1") -> str:
        directory = f"/var/lib/llm-serving/releases/{release}"
        env = proof.interconnect_environment({**ENV, "NCCL_P2P_LEVEL": level,
                                              "SGLANG_LOGGING_CONFIG_PATH": f"{directory}/logging.json"})
        return proof.proof_key(IDENTITY, 2, "nccl", "/py", proof.release_neutral(env, directory))
    assert key("sglang-aaaa") == key("sglang-bbbb")
    assert key("sglang-aaaa") != key("sglang-bbbb", level="2")
    assert proof.release_neutral({"SGLANG_X": "/var/lib/llm-serving/releases/a/x"}, "/var/lib/llm-serving/releases/a/")[
        "SGLANG_X"] == "<release>/x"


def test_the_key_changes_with_driver_gpus_engine_world_size_python_and_interconnect_environment_only():
    env = proof.interconnect_environment(ENV)
    key = proof.proof_key(IDENTITY, 2, "nccl", "/py", env)
    assert key == proof.proof_key(dict(IDENTITY), 2, "nccl", "/py", proof.interconnect_environment(
        {**ENV, "HOME": "/elsewhere", "VLLM_API_KEY": "x"})), "other variables are not part of the key"
    changed = [proof.proof_key({**IDENTITY, "driver_version": "580.95.05"}, 2, "nccl", "/py", env),
               proof.proof_key({**IDENTITY, "gpus": ["GPU-a", "GPU-c"]}, 2, "nccl", "/py", env),
               proof.proof_key({**IDENTITY, "engine": "vllm 0.33.0"}, 2, "nccl", "/py", env),
               proof.proof_key(IDENTITY, 4, "nccl", "/py", env),
               proof.proof_key(IDENTITY, 2, "nccl", "/other/py", env),
               proof.proof_key(IDENTITY, 2, "nccl", "/py", {**env, "NCCL_P2P_DISABLE": "1"})]
    assert len({key, *changed}) == 7


LSPCI_REDIRECTING = """\
00:01.1 PCI bridge: Advanced Micro Devices, Inc. [AMD] Starship/Matisse GPP Bridge
\tCapabilities: [2a0 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
"""


def fabric_fixture(tmp_path, boot_id: str = "b1", cmdline: str = "ro quiet", lspci: str | None = LSPCI_REDIRECTING,
                   translated: bool = False) -> dict:
    """Fixture files for the fabric facts: a boot id, a command line, IOMMU groups and an lspci that prints."""
    (tmp_path / "boot_id").write_text(boot_id + "\n")
    (tmp_path / "cmdline").write_text(cmdline + "\n")
    groups = tmp_path / "iommu_groups"
    (groups / "0" / "devices").mkdir(parents=True, exist_ok=True)
    (groups / "0" / "type").write_text("DMA\n" if translated else "identity\n")
    lspci_program = tmp_path / "lspci"
    (tmp_path / "lspci.txt").write_text(lspci or "")
    lspci_program.write_text(f"#!/bin/sh\n{'cat ' + str(tmp_path / 'lspci.txt') if lspci is not None else 'exit 1'}\n")
    lspci_program.chmod(0o755)
    return {"cmdline": str(tmp_path / "cmdline"), "boot_id": str(tmp_path / "boot_id"), "iommu_groups": str(groups),
            "lspci": str(lspci_program)}


def test_the_fabric_facts_are_read_from_the_host_and_each_one_changes_the_key(tmp_path):
    env = proof.interconnect_environment(ENV)
    fabric = proof.fabric_facts(fabric_fixture(tmp_path))
    assert fabric == {"boot_id": "b1", "cmdline": "ro quiet", "iommu_mode": "passthrough",
                      "acs_redirecting": ["0000:00:01.1 ReqRedir+CmpltRedir+"]}
    key = proof.proof_key(IDENTITY, 2, "nccl", "/py", env, fabric=fabric)
    assert key == proof.proof_key(IDENTITY, 2, "nccl", "/py", env, fabric=proof.fabric_facts(fabric_fixture(tmp_path)))
    changes = {"a reboot": {"boot_id": "b2"}, "another command line": {"cmdline": "ro quiet pci=noacs"},
               "the IOMMU translating": {"translated": True}, "the ACS fix applied": {"lspci": ""},
               "lspci gone": {"lspci": None}}
    for what, change in changes.items():
        other = proof.fabric_facts(fabric_fixture(tmp_path, **change))
        assert proof.proof_key(IDENTITY, 2, "nccl", "/py", env, fabric=other) != key, what
        found = proof.differences({"identity": IDENTITY, "world_size": 2, "python": "/py", "environment": env,
                                   "fabric": fabric}, IDENTITY, 2, "/py", env, fabric=other)
        assert len(found) == 1, (what, found)
    assert proof.fabric_facts(fabric_fixture(tmp_path, lspci=None))["acs_redirecting"].startswith("not checked")
    # A record from before the fabric was keyed names what it lacks.
    found = proof.differences({"identity": IDENTITY, "world_size": 2, "python": "/py", "environment": env},
                              IDENTITY, 2, "/py", env, fabric=fabric)
    assert "boot id: (not recorded) -> b1" in found


def record(key: str, when: str, release: str, **more) -> dict:
    return {"key": key, "proven_at": when, "release": release, "identity": IDENTITY, "world_size": 2,
            "python": "/py", "environment": {"NCCL_DEBUG": "WARN"}, **more}


def test_records_match_by_key_and_the_newest_other_one_says_what_changed(tmp_path):
    for rec in (record("aaaa", "2026-11-01T10:00:00Z", "sglang-old"),
                record("bbbb", "2026-11-20T10:00:00Z", "sglang-new")):
        proof.write_record(str(tmp_path), rec)
    (tmp_path / "garbage.json").write_text("{not json")
    records = proof.read_records(str(tmp_path))
    assert proof.find_record(records, "aaaa")["release"] == "sglang-old"
    assert proof.find_record(records, "cccc") is None
    last = proof.newest_record(records)
    assert last["release"] == "sglang-new"
    found = proof.differences(last, {**IDENTITY, "driver_version": "580.126.09"}, 2, "/py",
                              {"NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1"})
    assert found == ["driver_version: 580.105.08 -> 580.126.09", "NCCL_DEBUG: WARN -> INFO",
                     "NCCL_P2P_DISABLE: (unset) -> 1"]
    message = proof.not_proven_message(last, found)
    assert "last proof on 2026-11-20T10:00:00Z by release sglang-new" in message
    assert "NCCL_DEBUG: WARN -> INFO" in message
    assert proof.proven_message(records[0]).startswith(
        "interconnect proven on 2026-11-01T10:00:00Z by release sglang-old")
    assert proof.not_proven_message(None, []) == "no interconnect proof is recorded on this host"


FAILED_REPORT = {
    "backend": "nccl", "world_size": 8, "uid": 998, "user": "sglang", "ok": False, "exit": 1,
    "unfinished_ranks": [3, 5],
    "reason": "rank(s) 3, 5 did not finish within 60 s [rank 3: all_reduce 64 MiB (killed)]",
    "diagnostics": {
        "pcie": {"iommu": {"mode": "translated", "source": "iommu_groups/*/type"},
                 "acs": {"checked": True,
                         "redirecting": [{"bdf": "0000:40:01.1", "redirecting": ["ReqRedir", "CmpltRedir"]}]}},
        "topo_p2p_read": " \tGPU0\tGPU1\n GPU0\tX\tCNS\n GPU1\tCNS\tX\n"},
}


def test_the_failure_message_names_ranks_iommu_acs_ports_topo_and_the_fix():
    message = proof.failure_message(FAILED_REPORT, 1, "", "sglang-interconnect-proof")
    assert "ranks that did not finish: 3, 5" in message
    assert "IOMMU mode: translated (iommu_groups/*/type)" in message
    assert "PCIe ports with ACS ReqRedir+/CmpltRedir+: 0000:40:01.1 (ReqRedir+ CmpltRedir+)" in message
    assert "nvidia-smi topo -p2p r:\n \tGPU0\tGPU1\n GPU0\tX\tCNS" in message
    assert message.endswith("Fix: docs/provisioning.md, section 'Interconnect: IOMMU and ACS'")
    assert "uid 998 sglang" in message
    unchecked = json.loads(json.dumps(FAILED_REPORT))
    unchecked["diagnostics"]["pcie"]["acs"] = {"checked": False, "redirecting": [], "error": "lspci not found"}
    assert "ReqRedir+/CmpltRedir+: not checked (lspci not found)" in proof.failure_message(unchecked, 1, "", "u")
    assert "ended with exit 217 without a report: Failed to set up mount namespacing" in proof.failure_message(
        None, 217, "Failed to set up mount namespacing\n", "sglang-interconnect-proof")


def test_the_report_is_read_from_stdout():
    assert proof.parse_report('{"ok": true}\n') == {"ok": True}
    assert proof.parse_report("Running as unit: x\n" + json.dumps({"ok": False})) == {"ok": False}
    assert proof.parse_report("Traceback: boom") is None


def test_a_recorded_proof_is_reported_and_nothing_runs(tmp_path, capsys):
    unit = tmp_path / "sglang.service"
    unit.write_text(unit_text(ENV))
    args = {"state": "proven", "unit_file": str(unit), "script": "/nonexistent/proof.py", "python": "/py",
            "world_size": 2, "identity": IDENTITY, "records_dir": str(tmp_path / "records"), "release": "sglang-new",
            "systemd_run": "/nonexistent/systemd-run", "fabric_sources": fabric_fixture(tmp_path)}
    fabric = proof.fabric_facts(args["fabric_sources"])
    key = proof.proof_key(IDENTITY, 2, "nccl", "/py", proof.interconnect_environment(ENV), fabric=fabric)
    proof.write_record(str(tmp_path / "records"), record(key, "2026-11-20T10:00:00Z", "sglang-abc", fabric=fabric))
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        proof.main()
    result = json.loads(capsys.readouterr().out)
    assert exc.value.code == 0 and result["proven"] is True and result["ran"] is False and not result["changed"]
    assert result["message"].startswith("interconnect proven on 2026-11-20T10:00:00Z by release sglang-abc")
    # another environment: not recorded; check mode says it would run and runs nothing
    unit.write_text(unit_text({**ENV, "NCCL_DEBUG": "INFO"}))
    with patch_module_args({**args, "_ansible_check_mode": True}), pytest.raises(SystemExit) as exc:
        proof.main()
    result = json.loads(capsys.readouterr().out)
    assert exc.value.code == 0 and result["proven"] is False and result["ran"] is False and result["changed"]
    assert "NCCL_DEBUG: WARN -> INFO" in result["message"]
    assert "would run the proof as sglang-interconnect-proof" in result["message"]
    # the same unit after a reboot: the record does not outlive the boot it proved
    unit.write_text(unit_text(ENV))
    fabric_fixture(tmp_path, boot_id="b2")
    with patch_module_args({**args, "state": "recorded"}), pytest.raises(SystemExit) as exc:
        proof.main()
    result = json.loads(capsys.readouterr().out)
    assert exc.value.code == 0 and result["proven"] is False and "boot id: b1 -> b2" in result["message"]


def test_gpu_facts_reads_the_mig_mode_from_the_nvidia_smi_double(tmp_path, capsys):
    """The preflight's MIG check reads gpu_facts' mig_mode (RTX PRO 6000 and H200 report Enabled/Disabled, other
    boards [N/A]); the NVIDIA-SMI TEST DOUBLE answers mig.mode.current per GPU from its config."""
    import gpu_facts

    double = REPO / "tests" / "doubles" / "nvidia_smi_double.py"
    gpus = [{"index": i, "minor": i, "uuid": f"GPU-{i}", "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
             "pci_bus_id": f"00000000:{i + 1:02X}:00.0", "memory_total_mib": 97887, "mig_mode": mode}
            for i, mode in enumerate(["Disabled", "Enabled", "[N/A]"])]
    (tmp_path / "dev").mkdir()
    (tmp_path / "proc").mkdir()
    config = tmp_path / "sim.json"
    config.write_text(json.dumps({"dev_dir": str(tmp_path / "dev"), "driver_version": "580.105.08", "gpus": gpus}))
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} {double} --config {config} "$@"\n')
    smi.chmod(0o755)
    with patch_module_args({"nvidia_smi": str(smi), "driver_proc_dir": str(tmp_path / "proc"), "mig": True}), \
            pytest.raises(SystemExit):
        gpu_facts.main()
    result = json.loads(capsys.readouterr().out)
    assert [g["mig_mode"] for g in result["gpus"]] == ["Disabled", "Enabled", None]


def load_script():
    """The proof script itself (standard library at import; torch only in its ranks)."""
    spec = importlib.util.spec_from_file_location(
        "interconnect_proof_script", REPO / "roles" / "engine_service" / "files" / "interconnect_proof.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_model(path: str):
    """An engine role's interconnect model (standard library), loaded by path as the proof script loads it."""
    spec = importlib.util.spec_from_file_location("interconnect_engine_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_key_holds_engine_variables_engine_settings_and_the_script_but_no_secret():
    env = proof.interconnect_environment({**ENV, "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1", "VLLM_API_KEY": "s3cr3t",
                                          "SGLANG_ADMIN_API_KEY": "x", "HF_TOKEN": "y", "NCCL_TOKEN_DUMMY": "z",
                                          "VLLM_USE_V1": "1"}, ["SGLANG_"])
    assert env == {"CUDA_HOME": "/usr/local/cuda", "NCCL_DEBUG": "WARN", "NCCL_P2P_LEVEL": "SYS",
                   "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    script = load_script()
    assert script.proof_environment({**ENV, "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1", "VLLM_API_KEY": "s",
                                     "VLLM_USE_V1": "1"}, ("SGLANG_",)) == env, \
        "the script reports exactly what the module keys"
    base = proof.engine_settings()
    key = proof.proof_key(IDENTITY, 2, "nccl", "/py", env, engine=base)
    assert key == proof.proof_key(IDENTITY, 2, "nccl", "/py", env), "records from before engine settings still match"
    sglang = proof.engine_settings("sglang", [], False)
    changed = [proof.proof_key(IDENTITY, 2, "nccl", "/py", env, engine=sglang),
               proof.proof_key(IDENTITY, 2, "nccl", "/py", env, engine=proof.engine_settings("vllm")),
               proof.proof_key(IDENTITY, 2, "nccl", "/py", env, engine=proof.engine_settings("sglang", [], True)),
               proof.proof_key(IDENTITY, 2, "nccl", "/py", env,
                               engine=proof.engine_settings("sglang", ["enable-nccl-nvls"])),
               proof.proof_key(IDENTITY, 2, "nccl", "/py", env, engine=sglang, script="0123456789abcdef"),
               proof.proof_key(IDENTITY, 2, "nccl", "/py", {**env, "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "0"},
                               engine=sglang),
               proof.proof_key(IDENTITY, 2, "nccl", "/py", {**env, "VLLM_BATCH_INVARIANT": "1"}, engine=sglang),
               proof.proof_key(IDENTITY, 2, "nccl", "/py", env, engine=proof.engine_settings("sglang", model="ab12"))]
    assert len({key, *changed}) == 9
    assert proof.proof_key(IDENTITY, 2, "nccl", "/py", {**env, "SGLANG_API_KEY": "k"}) == key, "no secret is keyed"
    last = {"identity": IDENTITY, "world_size": 2, "python": "/py", "environment": env, "script": "aaaa"}
    found = proof.differences(last, IDENTITY, 2, "/py", env, engine=proof.engine_settings("sglang", [], True),
                              script="bbbb")
    assert found == ["engine settings (custom_all_reduce): False -> True", "engine settings (engine): none -> sglang",
                     "proof script: aaaa -> bbbb"]
    modelled = proof.differences(last, IDENTITY, 2, "/py", env, engine=proof.engine_settings("sglang", model="ab12"))
    assert "engine settings (model): None -> ab12" in modelled


ENGINE_MODELS = {name: str(REPO / "roles" / name / "files" / "interconnect_engine.py") for name in ("sglang", "vllm")}


def test_the_engine_sets_its_nccl_environment_in_the_ranks_as_its_own_code_does():
    script = load_script()
    sglang, vllm = (script.load_engine_model(ENGINE_MODELS[name]) for name in ("sglang", "vllm"))
    assert script.engine_environment(sglang, {}, [], 1) == {
        "NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    # Where the unit sets them SGLang keeps them, except CUDA_DEVICE_MAX_CONNECTIONS, which it always sets.
    assert script.engine_environment(sglang, {"NCCL_CUMEM_ENABLE": "1", "NCCL_NVLS_ENABLE": "1",
                                              "CUDA_DEVICE_MAX_CONNECTIONS": "1"}, [], 1) == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    nvls = script.engine_environment(sglang, {"NCCL_NVLS_ENABLE": "0"}, ["enable-nccl-nvls"], 1)
    assert nvls["NCCL_NVLS_ENABLE"] == "1"
    assert script.engine_environment(sglang, {"NCCL_CUMEM_ENABLE": "0"}, ["enable-symm-mem"], 1) == {
        "NCCL_CUMEM_ENABLE": "1", "NCCL_NVLS_ENABLE": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    assert script.engine_environment(vllm, {}, [], 1) == {}, "vLLM 0.33.0 sets none on its default CUDA path"
    assert script.engine_environment(vllm, {"VLLM_BATCH_INVARIANT": "1"}, [], 1)["NCCL_PROTO"] == "Simple"
    assert script.engine_environment(script.NO_ENGINE, {}, [], 1) == {}
    assert script.load_engine_model("") is script.NO_ENGINE


def test_sglang_turns_nccl_graph_buffer_registration_off_when_its_graphs_may_capture_collectives():
    """SGLang 0.5.23 sets NCCL_GRAPH_REGISTER=0 where unset when more than one rank may capture a collective in a CUDA
    graph (srt/arg_groups/parallel_hook.py): not for one rank, not with every phase's graph off, never over the
    unit's own value. The proof script passes its world size to the model, so its ranks get what SGLang sets for that
    many (the sglang role passes the graph switches among the engine flags)."""
    model = load_model(ENGINE_MODELS["sglang"])
    base = {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    assert model.process_environment({}, [], 8) == {**base, "NCCL_GRAPH_REGISTER": "0"}
    assert model.process_environment({}, [], 2)["NCCL_GRAPH_REGISTER"] == "0"
    assert model.process_environment({}, [], 1) == base == model.process_environment({}, [])
    assert model.process_environment({}, ["disable-cuda-graph"], 8) == base
    assert model.process_environment({}, ["disable-decode-cuda-graph", "disable-prefill-cuda-graph"], 8) == base
    assert model.process_environment({}, ["disable-decode-cuda-graph"], 8)["NCCL_GRAPH_REGISTER"] == "0"
    assert model.process_environment({}, ["disable-prefill-cuda-graph"], 8)["NCCL_GRAPH_REGISTER"] == "0"
    assert "NCCL_GRAPH_REGISTER" not in model.process_environment({"NCCL_GRAPH_REGISTER": "1"}, [], 8)
    script = load_script()
    sglang = script.load_engine_model(ENGINE_MODELS["sglang"])
    assert {"disable-cuda-graph", "disable-decode-cuda-graph", "disable-prefill-cuda-graph"} <= set(sglang.flags)
    assert script.engine_environment(sglang, {}, ["disable-cuda-graph"], 8) == base
    assert script.engine_environment(sglang, {}, [], 8) == {**base, "NCCL_GRAPH_REGISTER": "0"}
    assert script.engine_environment(sglang, {}, [], 1) == base


def test_vllms_flashinfer_pcie_ipc_all_reduce_is_a_peer_to_peer_switch_of_its_own():
    """VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC, read as vLLM reads it (vllm/envs.py: int), turns it on whatever
    --disable-custom-all-reduce says, unless VLLM_BATCH_INVARIANT=1 (cuda_communicator.py)."""
    model = load_model(ENGINE_MODELS["vllm"])
    assert model.PEER_ALL_REDUCE_SWITCHES == ("VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC",)
    on = "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC (FlashInfer PCIe IPC all-reduce)"
    assert model.peer_all_reduce({"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"}) == on
    assert model.peer_all_reduce({"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "2"}) == on
    for env in ({}, {"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "0"}, {"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": ""},
                {"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "true"},  # vLLM itself stops at start on it
                {"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1", "VLLM_BATCH_INVARIANT": "1"}):
        assert model.peer_all_reduce(env) is None, env
    script = load_script()
    vllm = script.load_engine_model(ENGINE_MODELS["vllm"])
    assert script.ipc_reason(vllm, {"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"}, False) == on
    assert script.ipc_reason(vllm, {}, False) is None


def test_a_broken_engine_model_is_refused_naming_what_it_lacks(tmp_path, capsys):
    script = load_script()
    partial = tmp_path / "model.py"
    partial.write_text("FLAGS = ()\n")
    with pytest.raises(SystemExit):
        script.parse_args(["--world-size", "1", "--engine-model", str(partial)])
    assert "the engine model lacks PEER_ALL_REDUCE_SWITCHES, process_environment, peer_all_reduce" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.parse_args(["--world-size", "1", "--engine-model", str(tmp_path / "absent.py")])


def plan(script, *argv: str, env: dict | None = None) -> dict:
    args = script.parse_args(["--world-size", "1", *argv])
    return dict(script.step_plan(args, env or {}))


def test_steps_that_cannot_run_are_reported_skipped_or_not_run_with_the_reason(monkeypatch):
    monkeypatch.delenv("BWS_PROOF_TEST_HANG_RANK", raising=False)
    script = load_script()
    on_cpu = "skipped: needs the nccl backend on CUDA GPUs (gloo runs on the CPU)"
    sglang = ("--engine", "sglang", "--engine-model", ENGINE_MODELS["sglang"])
    gloo = plan(script, "--backend", "gloo", *sglang, env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"})
    assert gloo == {"bf16 small messages": on_cpu, "cuda graph all_reduce": on_cpu, "ipc peer-write all_reduce": on_cpu}
    one_gpu = plan(script, *sglang, env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "true"})
    assert one_gpu == {"bf16 small messages": None, "cuda graph all_reduce": None,
                       "ipc peer-write all_reduce": "not run: needs >= 2 GPUs"}
    assert plan(script, "--custom-all-reduce")["ipc peer-write all_reduce"] == "not run: needs >= 2 GPUs"
    assert plan(script)["ipc peer-write all_reduce"] == "not run: needs >= 2 GPUs"
    vllm = ("--engine", "vllm", "--engine-model", ENGINE_MODELS["vllm"])
    off = plan(script, "--world-size", "8", *vllm, env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"})
    assert off["ipc peer-write all_reduce"] == ("not run: the profile turns on no peer-to-peer all-reduce "
                                                "(VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC, custom all-reduce)")
    # vLLM's FlashInfer PCIe IPC all-reduce writes peer to peer with its custom all-reduce off (no --custom-all-reduce).
    assert plan(script, "--world-size", "8", *vllm,
                env={"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"})["ipc peer-write all_reduce"] is None
    assert plan(script, "--world-size", "8", *sglang, env={})["ipc peer-write all_reduce"] == (
        "not run: the profile turns on no peer-to-peer all-reduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE, "
        "custom all-reduce)")
    assert plan(script, "--world-size", "8", *sglang,
                env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"})["ipc peer-write all_reduce"] is None
    with pytest.raises(SystemExit):
        script.parse_args(["--world-size", "1", *sglang, "--engine-flags", "enable-everything"])
    with pytest.raises(SystemExit):  # no model, no switch
        script.parse_args(["--world-size", "1", "--engine-flags", "enable-nccl-nvls"])
    # The module's one line says what ran and why the rest did not.
    report = {"engine": "sglang", "engine_environment": {"NCCL_NVLS_ENABLE": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "8"},
              "ranks": [{"steps": [{"step": "bf16 small messages", "status": "skipped", "reason": on_cpu},
                                   {"step": "ipc peer-write all_reduce", "status": "not run",
                                    "reason": "not run: needs >= 2 GPUs"}]}]}
    assert proof.steps_summary(report) == (
        "engine sglang settings CUDA_DEVICE_MAX_CONNECTIONS=8, NCCL_NVLS_ENABLE=0; bf16 small messages: skipped "
        "(needs the nccl backend on CUDA GPUs (gloo runs on the CPU)); ipc peer-write all_reduce: not run "
        "(needs >= 2 GPUs)")
