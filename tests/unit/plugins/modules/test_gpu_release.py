"""gpu_release selection rules, /proc and cgroup parsing, /dev/shm rules, and main() in check mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
from tests.module_utils_loader import use_repository_module_utils  # noqa: E402

use_repository_module_utils()
sys.path.insert(0, str(REPO / "plugins" / "modules"))

import gpu_release as gpu_release_module  # noqa: E402  (plugins/modules/: argument handling and output)
from ansible.module_utils.testing import patch_module_args  # noqa: E402
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release import gpus as release_gpus  # noqa: E402
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release import release as gpu_release  # noqa: E402  (the logic)
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release import scope as release_scope  # noqa: E402
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release import shm as release_shm  # noqa: E402
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release import signals as release_signals  # noqa: E402
from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release import units as release_units  # noqa: E402
from ansible_collections.blackwell.serving.plugins.module_utils.host import procfs as pf  # noqa: E402
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import (  # noqa: E402
    field_values,
    load_roster,
)

RTX8 = REPO / "tests" / "fixtures" / "nvidia-smi" / "rtxpro6000-8gpu-constructed"
# What the gpu_release role passes: every engine's process patterns, units and service users of the engine roster.
ROSTER = load_roster()
DEFAULT_PATTERNS = field_values(ROSTER, "process_patterns")
ROSTER_PARAMS = {"units": field_values(ROSTER, "unit"), "patterns": DEFAULT_PATTERNS,
                 "service_users": field_values(ROSTER, "service_user")}


@pytest.mark.parametrize(
    ("argv", "pattern"),
    [
        (["sglang::scheduler_TP0"], "sglang::*"),
        (["sglang::detokenizer"], "sglang::*"),
        (["VLLM::EngineCore"], "VLLM::*"),
        (["VLLM::Worker_TP3"], "VLLM::*"),
        (["python3", "-m", "sglang.launch_server", "--model-path", "m"], "sglang.launch_server"),
        (["/usr/bin/python3.12", "-u", "-X", "dev", "-m", "sglang.launch_server"], "sglang.launch_server"),
        (["/opt/sglang/bin/sglang", "serve", "--config", "c.yaml"], "sglang serve"),
        (
            ["/opt/sglang/bin/python3", "/opt/sglang/bin/sglang", "serve", "--config", "c.yaml"],
            "sglang serve",
        ),
        (["/opt/vllm/bin/vllm", "serve", "moonshotai/Kimi-K2.5"], "vllm serve"),
        (["python3", "-m", "vllm.entrypoints.openai.api_server"], "vllm.entrypoints.openai.api_server"),
    ],
)
def test_engine_processes_match(argv, pattern):
    assert pf.first_matching_pattern(argv, DEFAULT_PATTERNS) == pattern


@pytest.mark.parametrize(
    "argv",
    [
        ["journalctl", "-u", "sglang"],
        ["journalctl", "-u", "sglang.service", "-f"],
        ["grep", "sglang::"],
        ["vim", "sglang.launch_server.py"],
        ["python3", "-c", "import sglang.launch_server"],
        ["python3", "tail_sglang_serve.py", "sglang serve"],
        ["/usr/bin/sglang", "version"],
        ["/opt/vllm/bin/vllm", "bench", "serve"],
        ["ssh", "gpu01", "vllm serve"],
        ["bash", "-c", "sglang serve --config x"],
        ["nvidia-persistenced", "--user", "nvidia-persistenced"],
        [],
    ],
)
def test_bystanders_never_match(argv):
    assert pf.first_matching_pattern(argv, DEFAULT_PATTERNS) is None


def test_identity_rules():
    assert pf.identity(["python3", "-m", "sglang.launch_server"]) == pf.ProcessIdentity(
        "python3", "sglang.launch_server", ""
    )
    assert pf.identity(["/opt/sglang/bin/sglang", "serve"]).prog == "sglang"
    assert pf.identity(["/v/bin/python3", "/v/bin/vllm", "serve", "m"]) == pf.ProcessIdentity(
        "/v/bin/python3", "vllm", "serve"
    )


def test_stat_with_spaces_and_parens_in_comm():
    text = "4242 (sglang::sch (x) y) S 4000 4242 4000 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 3 0 987654 1 1 1"
    assert pf.parse_stat(text) == ("S", 4000, 987654)


def test_cmdline_with_process_title_padding():
    assert pf.parse_cmdline(b"sglang::scheduler_TP0   \0\0\0\0") == ["sglang::scheduler_TP0"]
    assert pf.parse_cmdline(b"python3\0-m\0sglang.launch_server\0") == [
        "python3",
        "-m",
        "sglang.launch_server",
    ]


def test_cgroup_v1_and_v2_lines():
    v2 = "0::/system.slice/sglang.service\n"
    v1 = "12:memory:/system.slice/vllm.service\n1:name=systemd:/system.slice/vllm.service/payload\n0::/\n"
    assert pf.parse_cgroup_file(v2) == ["/system.slice/sglang.service"]
    assert pf.parse_cgroup_file(v1) == [
        "/system.slice/vllm.service",
        "/system.slice/vllm.service/payload",
        "/",
    ]
    root = {"": "/"}
    assert pf.in_system_unit([("", "/system.slice/vllm.service/payload")], root, "vllm.service")
    assert not pf.in_system_unit([("", "/system.slice/vllm.service-helper.service")], root, "vllm.service")
    assert not pf.in_system_unit([("", "/user.slice/user-0.slice/session-1.scope")], root, "sglang.service")


USER_UNIT = "/user.slice/user-1000.slice/user@1000.service/app.slice/sglang.service"


@pytest.mark.parametrize(
    ("own", "path", "kind"),
    [
        ("/", "/system.slice/sglang.service", "system"),
        ("/", "/user.slice/user-1000.slice/session-4.scope", "session"),
        ("/", USER_UNIT, "session"),
        ("/", "/machine.slice/libpod-0a1b.scope/container", "container"),
        ("/", "/libpod_parent/libpod-0a1b", "container"),
        ("/", "/system.slice/docker-0a1b.scope", "container"),
        ("/", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-2.scope", "container"),  # noqa: E501
        ("/", "/../../system.slice/other.service", "outside"),
        # the module inside a container that shares the host's cgroup namespace: its root is the container
        ("/libpod_parent/libpod-0a1b/x.scope", "/libpod_parent/libpod-0a1b/system.slice/sglang.service", "system"),
        ("/libpod_parent/libpod-0a1b", "/libpod_parent/libpod-0a1b/user.slice/user-0.slice/session-1.scope", "session"),
        ("/libpod_parent/libpod-0a1b", "/libpod_parent/libpod-ffff/system.slice/sglang.service", "outside"),
        ("/libpod_parent/libpod-0a1b", "/system.slice/sglang.service", "outside"),
    ],
)
def test_placement_is_judged_below_the_modules_own_cgroup_root(own, path, kind):
    roots = pf.own_cgroup_roots([("", own)])
    assert pf.placement([("", path)], roots).kind == kind


def test_own_cgroup_root_is_cut_at_the_deepest_container_component():
    entries = [("", "/libpod_parent/libpod-0a1b/system.slice/ansible.scope"), ("name=systemd", "/user.slice/u.slice")]
    assert pf.own_cgroup_roots(entries) == {"": "/libpod_parent/libpod-0a1b", "name=systemd": "/"}


def test_a_user_level_unit_named_like_ours_is_not_our_unit():
    roots = {"": "/"}
    assert pf.in_system_unit([("", "/system.slice/sglang.service/payload")], roots, "sglang.service")
    assert not pf.in_system_unit([("", USER_UNIT)], roots, "sglang.service")
    in_container = "/machine.slice/libpod-1.scope/system.slice/sglang.service"
    assert not pf.in_system_unit([("", in_container)], roots, "sglang.service")
    # cgroup v1: a container shows in some hierarchies only; the strongest placement wins
    v1 = [("name=systemd", "/system.slice/sglang.service"), ("memory", "/libpod_parent/libpod-9")]
    assert not pf.in_system_unit(v1, {"name=systemd": "/", "memory": "/"}, "sglang.service")


def test_unit_cgroup_pids_v2_and_v1_layouts(tmp_path):
    v2 = tmp_path / "v2" / "system.slice" / "sglang.service"
    (v2 / "sub").mkdir(parents=True)
    (v2 / "cgroup.procs").write_text("10\n11\n")
    (v2 / "sub" / "cgroup.procs").write_text("12\n")
    assert pf.unit_cgroup_pids(str(tmp_path / "v2"), "/system.slice/sglang.service") == {10, 11, 12}
    v1 = tmp_path / "v1" / "systemd" / "system.slice" / "vllm.service"
    v1.mkdir(parents=True)
    (v1 / "cgroup.procs").write_text("20\n")
    assert pf.unit_cgroup_pids(str(tmp_path / "v1"), "/system.slice/vllm.service") == {20}
    assert pf.unit_cgroup_pids(str(tmp_path / "v1"), "") == set()


def proc(pid, ppid, argv, *, fds=(), comm=None, cgroups=("/",), uid=0, pidns="pid:[1]"):
    return pf.Proc(
        pid,
        ppid,
        1000 + pid,
        "S",
        uid,
        comm or os.path.basename(argv[0])[:15] if argv else "",
        list(argv),
        list(fds),
        list(cgroups),
        [("", c) for c in cgroups],
        pidns,
    )


def test_descendants_and_ancestors():
    procs = {p.pid: p for p in [proc(1, 0, ["init"]), proc(10, 1, ["a"]), proc(11, 10, ["b"]), proc(12, 11, ["c"])]}
    assert pf.descendants({10}, procs) == {11: 10, 12: 10}
    assert pf.ancestors(12, procs) == {11, 10, 1}


def test_device_files_tell_compute_from_monitor():
    compute = proc(5, 1, ["x"], fds=["/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/null"])
    monitor = proc(6, 1, ["y"], fds=["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"])
    other = proc(7, 1, ["z"], fds=["/dev/null"])
    assert release_gpus.device_files(compute, "/dev") == ({3}, True, True)
    assert release_gpus.device_files(monitor, "/dev") == ({0, 1}, False, True)
    assert release_gpus.device_files(other, "/dev") == (set(), False, False)


class FakeModule:
    check_mode = True

    def run_command(self, argv):
        return 1, "", "no systemd here"


def selection_params(**over):
    params = {k: v.get("default") for k, v in gpu_release.ARGUMENT_SPEC.items()} | ROSTER_PARAMS
    params.update(over)
    return params


def scope_of(params, procs, pidns="pid:[1]"):
    scope = release_scope.Scope(params, procs)
    scope.pidns, scope.roots = pidns, {"": "/"}
    return scope


def test_selection_spares_self_ancestors_and_protected(monkeypatch):
    me = os.getpid()
    procs = {
        1: proc(1, 0, ["/sbin/init"]),
        50: proc(50, 1, ["sglang::caller"]),  # an ancestor that happens to look like an engine
        me: proc(me, 50, ["python3", "-m", "pytest"]),
        100: proc(100, 1, ["/opt/sglang/bin/sglang", "serve"], cgroups=["/system.slice/sglang.service"]),
        101: proc(101, 100, ["sglang::scheduler_TP0"]),
        102: proc(102, 101, ["python3", "-c", "child"]),  # descendant, matched through its parent
        103: proc(103, 100, ["nvidia-persistenced"]),  # protected even as a descendant
        200: proc(200, 1, ["python3", "train.py"], cgroups=["/system.slice/sglang.service"]),  # unit member
        300: proc(300, 1, ["journalctl", "-u", "sglang.service"]),
        400: proc(400, 1, ["my-monitor"], comm="my-monitor"),
    }
    params = selection_params(units=["sglang.service"], extra_protected=["my-*"], service_users=["0"])
    targets, spared, foreign = release_scope.select(params, FakeModule(), procs, scope_of(params, procs))
    assert foreign == {}
    assert set(targets) == {100, 101, 102, 200}
    assert targets[102] == "descendant of 101"
    assert "member of sglang.service" in targets[200]
    reasons = {s["pid"]: s["reason"] for s in spared}
    assert set(reasons) == {50, 103, me}  # the module descends from a look-alike: still spared
    assert reasons[me].startswith("this module itself")
    assert reasons[50].startswith("ancestor of this module")
    assert reasons[103].startswith("protected daemon (nvidia-persistenced)")


def test_scope_default_takes_service_users_outside_sessions_and_containers_and_names_the_rest():
    daemon, nobody = 1, 65534
    session = "/user.slice/user-1000.slice/session-7.scope"
    procs = {
        1: proc(1, 0, ["/sbin/init"]),
        10: proc(10, 1, ["sglang::scheduler_TP0"], uid=daemon, cgroups=["/system.slice/stray.service"]),
        11: proc(11, 10, ["python3", "tokenizer.py"], uid=daemon, cgroups=["/system.slice/stray.service"]),
        20: proc(20, 1, ["sglang::scheduler_TP0"], uid=daemon, cgroups=[session]),
        30: proc(30, 1, ["VLLM::EngineCore"], uid=nobody, cgroups=["/system.slice/other.service"]),
        40: proc(40, 1, ["sglang::scheduler_TP0"], uid=daemon, cgroups=[USER_UNIT]),
        50: proc(50, 1, ["sglang::scheduler_TP0"], uid=daemon, cgroups=["/libpod_parent/libpod-ab"], pidns="pid:[2]"),
        60: proc(60, 1, ["vllm", "serve"], uid=daemon, cgroups=["/system.slice/docker-1.scope"]),
        70: proc(70, 1, ["python3", "train.py"], uid=nobody, cgroups=["/system.slice/sglang.service"]),
    }
    params = selection_params(units=["sglang.service"], service_users=["daemon"])
    targets, _, foreign = release_scope.select(params, FakeModule(), procs, scope_of(params, procs))
    assert set(targets) == {10, 11, 70}
    assert targets[11] == "descendant of 10" and "member of sglang.service" in targets[70]
    reasons = {pid: f["reason"] for pid, f in foreign.items()}
    assert set(reasons) == {20, 30, 40, 50, 60}
    assert "in a user session (/user.slice/user-1000.slice/session-7.scope)" in reasons[20]
    assert "runs as nobody (uid 65534), not an engine service user (daemon)" in reasons[30]
    assert "in a user session" in reasons[40]
    assert "in another PID namespace (pid:[2])" in reasons[50]
    assert "in a container or pod cgroup (/system.slice/docker-1.scope)" in reasons[60]

    host = selection_params(units=["sglang.service"], service_users=["daemon"], scope="host")
    targets, _, foreign = release_scope.select(host, FakeModule(), procs, scope_of(host, procs))
    assert set(targets) == {10, 11, 20, 30, 40, 70}
    assert set(foreign) == {50, 60}


def make_params(tmp_path, **over):
    return selection_params(shm_dir=str(tmp_path), **over)


def owners(*names):
    return release_scope.resolve_users(list(names))


def test_shm_removes_only_stale_engine_entries(tmp_path):
    for name in ["nccl-AbC123", "psm_1f2e", "sem.mp-xyz", "torch_1_2_3", "keep-me", "psm_open", "psm_mapped"]:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "nccl-dir").mkdir()
    procs = {
        7: proc(7, 1, ["holder"], fds=[str(tmp_path / "psm_open")]),
        8: proc(8, 1, ["deleted"], fds=[str(tmp_path / "nccl-gone") + " (deleted)"]),
    }
    real_maps = pf.read_mapped_paths
    release_shm.read_mapped_paths = lambda pid: {str(tmp_path / "psm_mapped")} if pid == 8 else real_maps(pid)
    try:
        result = release_shm.clean_shm(make_params(tmp_path), procs, False, set(), owners(str(os.geteuid())))
    finally:
        release_shm.read_mapped_paths = real_maps
    removed = sorted(os.path.basename(p) for p in result["removed"])
    assert removed == ["nccl-AbC123", "psm_1f2e", "sem.mp-xyz", "torch_1_2_3"]
    kept = {os.path.basename(k["path"]): k["reason"] for k in result["kept"]}
    assert kept == {
        "nccl-dir": "not a regular file",
        "psm_mapped": "open or mapped by PIDs 8",
        "psm_open": "open or mapped by PIDs 7",
    }
    assert sorted(os.listdir(tmp_path)) == ["keep-me", "nccl-dir", "psm_mapped", "psm_open"]


def role_shm_patterns() -> list[str]:
    """The gpu_release role's default: the engine-neutral names, then every engine's of the roster (shm_patterns)."""
    import ast
    import re

    import yaml

    default = yaml.safe_load((REPO / "roles" / "gpu_release" / "defaults" / "main.yml").read_text())[
        "gpu_release_shm_patterns"]
    lookup = re.escape("query('blackwell.serving.engine_roster', 'shm_patterns')")
    found = re.fullmatch(rf"\{{\{{ (\[[^]]*\]) \+ {lookup} \}}\}}", default)
    assert found, default
    return ast.literal_eval(found.group(1)) + field_values(ROSTER, "shm_patterns")


def test_shm_removes_the_engines_own_stale_entries_named_by_the_roster(tmp_path):
    """SGLang 0.5.23's /dev/shm names (meta/engines.yml): pid-stamped sgl_shm_<kind>_<pid>_<hex> segments and the
    sglang_loads_ slot files are removed once no process holds them, kept while one does; the module's own default
    (engine-neutral names and multi_tokenizer_*) never matched them."""
    names = ["sgl_shm_mq_4242_0a1b2c3d", "sglang_loads_scheduler_1f2e3d4c.shm", "multi_tokenizer_args_4242",
             "sgl_shm_mm_77_deadbeef", "sglang_loads_held_0badf00d.shm", "vllm_offload_0.mmap", "sglang_other"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    procs = {77: proc(77, 1, ["sglang::scheduler_TP0"], fds=[str(tmp_path / "sgl_shm_mm_77_deadbeef")])}
    real_maps = pf.read_mapped_paths
    held = str(tmp_path / "sglang_loads_held_0badf00d.shm")
    release_shm.read_mapped_paths = lambda pid: {held} if pid == 77 else real_maps(pid)
    try:
        result = release_shm.clean_shm(make_params(tmp_path, shm_patterns=role_shm_patterns()), procs, False, set(),
                                       owners(str(os.geteuid())))
    finally:
        release_shm.read_mapped_paths = real_maps
    assert sorted(os.path.basename(p) for p in result["removed"]) == [
        "multi_tokenizer_args_4242", "sgl_shm_mq_4242_0a1b2c3d", "sglang_loads_scheduler_1f2e3d4c.shm",
        "vllm_offload_0.mmap"]
    kept = {os.path.basename(k["path"]): k["reason"] for k in result["kept"]}
    assert kept == {"sgl_shm_mm_77_deadbeef": "open or mapped by PIDs 77",
                    "sglang_loads_held_0badf00d.shm": "open or mapped by PIDs 77"}
    assert sorted(os.listdir(tmp_path)) == ["sgl_shm_mm_77_deadbeef", "sglang_loads_held_0badf00d.shm", "sglang_other"]
    module_default = gpu_release.ARGUMENT_SPEC["shm_patterns"]["default"]
    assert {"sgl_shm_*", "sglang_loads_*"} <= set(role_shm_patterns()) - set(module_default)
    assert set(module_default) <= set(role_shm_patterns()), "the role passes at least what the module would remove"


def test_shm_owner_and_check_mode(tmp_path):
    (tmp_path / "psm_a").write_bytes(b"x")
    (tmp_path / "psm_b").write_bytes(b"x")
    os.chown(tmp_path / "psm_b", 4321, 4321) if os.geteuid() == 0 else None
    procs = {9: proc(9, 1, ["sglang::x"], fds=[str(tmp_path / "psm_a")])}
    me = str(os.geteuid())
    result = release_shm.clean_shm(make_params(tmp_path), procs, True, {9}, owners(me))
    assert result["removed"] == []
    assert result["would_remove"] == [str(tmp_path / "psm_a")]  # held only by a target that would be gone
    if os.geteuid() == 0:
        assert result["kept"] == [{"path": str(tmp_path / "psm_b"), "reason": f"owned by uid 4321, not by {me}"}]
    assert sorted(os.listdir(tmp_path)) == ["psm_a", "psm_b"]


def test_shm_owners_default_to_the_service_users_and_unknown_users_own_nothing():
    params = selection_params(service_users=["daemon", "no-such-user-xyz"])
    scope = scope_of(params, {})
    assert release_shm.shm_owners(params, scope).uids == {1}
    assert scope.users.absent == ["no-such-user-xyz"]
    assert release_shm.shm_owners({**params, "shm_owner": ["nobody"]}, scope).uids == {65534}


def test_gpu_table_maps_device_minor_not_index():
    from ansible_collections.blackwell.serving.plugins.module_utils.nvidia import smi as nv

    gpus = nv.gpus_from_csv((RTX8 / "query-gpu-busy.csv").read_text())
    nv.attach_minors(gpus, nv.read_driver_gpus(str(RTX8 / "proc-driver-nvidia")))
    table = release_gpus.gpu_table(gpus, {}, "/dev", [])
    assert table[0]["index"] == 2 and table[2]["index"] == 0 and table[7]["index"] == 5
    only = release_gpus.gpu_table(gpus, {}, "/dev", ["3", "GPU-5a1c0b0e-7d2f-4c1a-9b3e-00c4d5e6f7a8"])
    assert sorted(e["index"] for e in only.values()) == [0, 3]


# ---------------------------------------------------------------- main() in check mode (nothing is signalled)


def sim(tmp_path: Path, mode: str = "ok", wedged: dict[int, dict] | None = None) -> dict:
    """The nvidia-smi double over stand-in device files; ``wedged`` adds per GPU index utilization_pct/leaked_mib."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in [*(f"nvidia{i}" for i in range(8)), "nvidiactl", "nvidia-uvm"]:
        (dev / name).write_bytes(b"")
    lines = (RTX8 / "query-gpu-idle.csv").read_text().splitlines()
    minors = [2, 3, 0, 1, 6, 7, 4, 5]
    gpus = []
    for i, line in enumerate(lines):
        parts = line.split(", ")
        gpus.append(
            {
                "index": i,
                "minor": minors[i],
                "uuid": parts[1],
                "name": parts[2],
                "pci_bus_id": parts[3],
                "compute_cap": "12.0",
                "memory_total_mib": 97887,
                **(wedged or {}).get(i, {}),
            }
        )
    config = tmp_path / "sim.json"
    config.write_text(json.dumps({"dev_dir": str(dev), "driver_version": "580.105.08", "mode": mode, "gpus": gpus}))
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" "{REPO}/tests/doubles/nvidia_smi_double.py" --config "{config}" "$@"\n'
    )
    smi.chmod(0o755)
    return {
        **ROSTER_PARAMS,
        "nvidia_smi": str(smi),
        "driver_proc_dir": str(RTX8 / "proc-driver-nvidia"),
        "dev_dir": str(dev),
        "shm_dir": str(tmp_path / "shm"),
    }


def this_tests_tree(procs: dict[int, pf.Proc]) -> dict[int, pf.Proc]:
    """The processes of this test: the test process, its ancestors (which the module spares) and its descendants."""
    me = os.getpid()
    keep = {me} | pf.ancestors(me, procs) | set(pf.descendants({me}, procs))
    return {pid: proc for pid, proc in procs.items() if pid in keep}


@pytest.fixture(autouse=True)
def only_this_tests_processes(monkeypatch):
    """main() sees and signals this test's own processes only, and fails closed otherwise.

    The module's scope is every process of the service users that matches an engine pattern; the tests make the
    test's own user a service user, so without this the module would select (and SIGTERM, then SIGKILL after its
    10 s grace) whatever engine-titled process that user runs elsewhere on the machine: another test's engine, a
    sandbox's. A signal to a process outside this test's tree fails the test and is not sent."""
    real_snapshot, real_send = gpu_release.snapshot, release_signals.send
    monkeypatch.setattr(gpu_release, "snapshot", lambda *args, **kw: this_tests_tree(real_snapshot(*args, **kw)))

    def guarded_send(proc: pf.Proc, sig: int) -> bool:
        if proc.pid not in pf.descendants({os.getpid()}, real_snapshot()):
            pytest.fail(f"gpu_release would signal PID {proc.pid} ({proc.title}), which this test did not start")
        return real_send(proc, sig)

    monkeypatch.setattr(release_signals, "send", guarded_send)


def run_main(args, capsys, check=True):
    with patch_module_args({**args, "_ansible_check_mode": check}), pytest.raises(SystemExit) as exc:
        gpu_release_module.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


def test_main_check_mode_reports_and_touches_nothing(tmp_path, capsys):
    args = {**sim(tmp_path), "service_users": [str(os.geteuid())]}
    (tmp_path / "shm").mkdir()
    (tmp_path / "shm" / "psm_stale").write_bytes(b"x")
    dev = tmp_path / "dev"
    code = (
        f"import time; fs=[open('{dev}/nvidia0'), open('{dev}/nvidia-uvm')]; print('ready', flush=True); time.sleep(60)"
    )
    p = subprocess.Popen(
        ["sglang::scheduler_TP0", "-c", code],
        executable=sys.executable,
        stdout=subprocess.PIPE,
        env={**os.environ, "NVSIM_MEM_MIB": "0:2048"},
    )
    try:
        assert p.stdout.readline() == b"ready\n"
        rc, out = run_main(args, capsys)
        assert p.poll() is None, "check mode must not signal"
    finally:
        p.kill()
        p.wait()
    assert rc == 0
    assert out["changed"] is True and out["check_mode"] is True
    assert p.pid in out["signalled"]["TERM"] and out["signalled"]["KILL"] == []
    (target,) = [t for t in out["targets"] if t["pid"] == p.pid]
    assert target["gpus"] == [2] and target["reason"] == "matches engine pattern 'sglang::*'"
    gpu2 = next(g for g in out["gpus"] if g["index"] == 2)
    assert gpu2["memory_used_before_mib"] == 2048 and gpu2["minor"] == 0
    assert [h["used_mib"] for h in gpu2["holders"] if h["pid"] == p.pid] == [2048]
    assert out["shm"]["would_remove"] == [str(tmp_path / "shm" / "psm_stale")]
    assert (tmp_path / "shm" / "psm_stale").exists()


def test_main_without_driver_says_verification_was_skipped(tmp_path, capsys):
    args = sim(tmp_path, mode="no_driver")
    args["driver_proc_dir"] = str(tmp_path / "absent")
    rc, out = run_main(args, capsys)
    assert rc == 0
    assert out["gpu_verification"] == "skipped" and out["driver_loaded"] is False
    assert "couldn't communicate with the NVIDIA driver" in out["gpu_verification_reason"]
    assert out["summary"][0].startswith("scope default: targets are ")
    assert out["summary"][1].startswith("no NVIDIA driver on this host: GPU verification skipped")


def test_main_rejects_timeout_shorter_than_grace(tmp_path, capsys):
    rc, out = run_main({**ROSTER_PARAMS, "grace_s": 5, "timeout_s": 2, "shm_dir": str(tmp_path)}, capsys)
    assert rc == 1 and "grace_s <= timeout_s" in out["msg"]


def test_main_fails_naming_pid_command_and_gpu_when_a_target_outlives_the_timeout(tmp_path, capsys, monkeypatch):
    # Signals are swallowed (send() is replaced), so the target stays: the module must say who and where.
    sent = []
    monkeypatch.setattr(release_signals, "send", lambda proc, sig: sent.append((proc.pid, sig)) or True)
    args = {**sim(tmp_path), "grace_s": 0.1, "timeout_s": 0.4, "settle_s": 0.1, "service_users": [str(os.geteuid())]}
    (tmp_path / "shm").mkdir()
    dev = tmp_path / "dev"
    code = (
        f"import time; fs=[open('{dev}/nvidia1'), open('{dev}/nvidia-uvm')]; print('ready', flush=True); time.sleep(60)"
    )
    p = subprocess.Popen(
        ["sglang::stuck_TP3", "-c", code],
        executable=sys.executable,
        stdout=subprocess.PIPE,
        env={**os.environ, "NVSIM_MEM_MIB": "1:1024"},
    )
    try:
        assert p.stdout.readline() == b"ready\n"
        rc, out = run_main(args, capsys, check=False)
    finally:
        p.kill()
        p.wait()
    assert rc == 1
    assert f"PID {p.pid} sglang::stuck_TP3 ({pf.user_name(os.geteuid())}) on GPUs" in out["msg"]
    assert "import time" not in out["msg"], "a process is named by its title, never its arguments"
    assert "on GPUs [3]" in out["msg"]  # minor 1 is index 3 on the constructed host
    assert "after 0.4 s" in out["msg"]
    assert (p.pid, 15) in sent and (p.pid, 9) in sent
    assert out["summary"][-1].startswith("FAILED: still running or holding GPU memory")


def _fake_stat(root: Path, pid: int, state: str, tids: list[int], starttime: int = 777) -> None:
    d = root / str(pid)
    (d / "task").mkdir(parents=True)
    for tid in tids:
        (d / "task" / str(tid)).mkdir()
    fields = [state, "1", *["0"] * 17, str(starttime), "0"]
    (d / "stat").write_text(f"{pid} (python3) " + " ".join(fields) + "\n")


def test_is_alive_counts_a_zombie_leader_with_exiting_threads_as_alive(tmp_path):
    _fake_stat(tmp_path, 10, "S", [10, 11])
    _fake_stat(tmp_path, 20, "Z", [20, 21, 22])  # main thread done, CUDA threads still tearing down
    _fake_stat(tmp_path, 30, "Z", [30])  # exited, waiting to be reaped
    assert pf.is_alive(10, 777, str(tmp_path))
    assert pf.is_alive(20, 777, str(tmp_path))
    assert not pf.is_alive(30, 777, str(tmp_path))
    assert not pf.is_alive(10, 778, str(tmp_path))  # same PID, another process: never ours
    assert not pf.is_alive(40, 777, str(tmp_path))


class SystemctlDouble:
    """Answers the systemctl calls of stop_units() the way systemctl prints them; records what was run."""

    check_mode = False

    def __init__(self, states: dict[str, dict[str, str]]) -> None:
        self.states = states
        self.calls: list[list[str]] = []

    def run_command(self, argv):
        self.calls.append(argv[1:])
        verb, units = argv[1], [a for a in argv[2:] if not a.startswith("--")]
        if verb == "show":
            blocks = ["\n".join(f"{k}={v}" for k, v in {"Id": u, **self.states[u]}.items()) for u in units]
            return 0, "\n\n".join(blocks) + "\n", ""
        for unit in units:
            if verb == "stop":
                self.states[unit].update(ActiveState="failed", Result="timeout", ControlGroup="")
            elif verb == "disable":
                self.states[unit]["UnitFileState"] = "disabled"
            elif verb == "reset-failed":
                self.states[unit].update(ActiveState="inactive")
        return 0, "", ""


def test_stop_units_stops_disables_and_says_a_stop_ended_in_sigkill(monkeypatch):
    monkeypatch.setattr(release_units, "systemd_runs_here", lambda: "/bin/systemctl")
    loaded = {"LoadState": "loaded", "SubState": "running", "ControlGroup": "/system.slice/sglang.service"}
    double = SystemctlDouble(
        {
            "sglang.service": {**loaded, "ActiveState": "active", "Result": "success", "UnitFileState": "enabled"},
            "vllm.service": {"LoadState": "not-found", "ActiveState": "inactive", "UnitFileState": "", "Result": ""},
        }
    )
    units = release_units.stop_units(double, ["sglang.service", "vllm.service"], check_mode=False)
    assert [c[0] for c in double.calls] == ["show", "stop", "disable", "show", "reset-failed"]
    assert units["stopped"] == ["sglang.service"] and units["reset_failed"] == ["sglang.service"]
    lines = release_units.unit_lines(units, check_mode=False)
    assert lines == [
        "unit sglang.service: failed, disabled, last result timeout (the stop ran into TimeoutStopSec and ended"
        " in SIGKILL); failed state cleared",
        "unit vllm.service: not installed",
    ]
    again = release_units.stop_units(double, ["sglang.service", "vllm.service"], check_mode=False)
    assert again["stopped"] == [] and again["disabled"] == []  # a clean host: one show, nothing else


def serving_sglang() -> SystemctlDouble:
    """sglang.service runs and is enabled."""
    return SystemctlDouble(
        {"sglang.service": {"LoadState": "loaded", "ActiveState": "active", "Result": "success",
                            "UnitFileState": "enabled", "ControlGroup": "/system.slice/sglang.service"}}
    )  # fmt: skip


def test_a_switch_stops_without_disabling_and_an_enabled_unit_is_then_no_problem(monkeypatch):
    """A deploy's switch (disable_units false): the unit the host boots into stays enabled until the gate passed."""
    monkeypatch.setattr(release_units, "systemd_runs_here", lambda: "/bin/systemctl")
    double = serving_sglang()
    units = release_units.stop_units(double, ["sglang.service"], check_mode=False, disable=False)
    assert "disable" not in [c[0] for c in double.calls]
    assert units["units"]["sglang.service"]["UnitFileState"] == "enabled" and units["disabled"] == []
    assert release_units.units_left(units, {}, {}) == []
    disabled = release_units.stop_units(double, ["sglang.service"], check_mode=False)
    assert disabled["disabled"] == ["sglang.service"]
    double.states["sglang.service"]["UnitFileState"] = "enabled"
    assert release_units.units_left({**units, "disable": True}, {}, {}) == ["sglang.service still enabled"]


def test_stop_units_in_check_mode_only_reads(monkeypatch):
    monkeypatch.setattr(release_units, "systemd_runs_here", lambda: "/bin/systemctl")
    double = serving_sglang()
    units = release_units.stop_units(double, ["sglang.service"], check_mode=True)
    assert [c[0] for c in double.calls] == ["show"]
    assert release_units.unit_lines(units, check_mode=True)[-1] == "check mode: would stop/disable sglang.service"


# ---------------------------------------------------------------- wedged GPUs, nvidia-smi timeouts


def test_a_busy_gpu_with_no_process_is_wedged_and_fails_the_preflight_check(tmp_path, capsys):
    # The report-only path is the deploy preflight's (roles/gpu_release/tasks/holders.yml).
    wedged = {3: {"utilization_pct": 100, "leaked_mib": 40960}, 5: {"leaked_mib": 200}}  # GPU 5: below idle level
    args = {**sim(tmp_path, wedged=wedged), "report_only": True, "fail_on_foreign_holders": True,
            "wedged_window_s": 0.3, "clean_shm": False}  # fmt: skip
    rc, out = run_main(args, capsys, check=False)
    assert rc == 1
    assert out["msg"].startswith("wedged GPU, needs `nvidia-smi -r` (with nothing using it) or a reboot: GPU 3 (GPU-")
    text = "100 % utilisation and 40960 MiB used (idle <= 256 MiB) with no compute process over 3 readings in 0.3 s"
    assert text in out["msg"]
    assert out["msg"].endswith("Report only: nothing was stopped, signalled or removed.")
    (gpu3,) = out["wedged"]
    assert gpu3["index"] == 3 and gpu3["seconds"] == 0.3
    assert [r["utilization_pct"] for r in gpu3["readings"]] == [100] * 3
    assert any(line.startswith("GPU 3 (minor 1): no holders; ") and "WEDGED: 100 % utilisation" in line
               and line.endswith("needs `nvidia-smi -r` or a reboot") for line in out["summary"])  # fmt: skip


def test_an_idle_host_is_read_once(tmp_path, capsys, monkeypatch):
    calls = []
    real = release_gpus.Gpu.query_both
    monkeypatch.setattr(release_gpus.Gpu, "query_both", lambda self: calls.append(1) or real(self))
    rc, out = run_main({**sim(tmp_path), "report_only": True, "clean_shm": False}, capsys, check=False)
    assert rc == 0 and out["wedged"] == [] and len(calls) == 1


def test_wedged_needs_every_reading_busy_and_reads_again_only_what_looked_busy():
    from ansible_collections.blackwell.serving.plugins.module_utils.nvidia import health

    def gpu(uuid, util, used):
        return {"uuid": uuid, "bus_id": uuid.lower(), "index": 0, "utilization_gpu_pct": util, "memory_used_mib": used}

    first = [gpu("A", 0, 0), gpu("B", 7, 0), gpu("C", 0, 3000), gpu("D", 100, 9000), gpu("E", 100, 9000)]
    apps = [{"pid": 1, "gpu_uuid": "E", "bus_id": "e"}]  # E is in use: never suspicious
    later = [gpu("A", 0, 0), gpu("B", 0, 0), gpu("C", 0, 3000), gpu("D", 100, 9000), gpu("E", 100, 9000)]
    pauses = []
    wedged, _, _ = health.wedged_gpus(first, apps, sample=lambda: (later, apps), keys={"A", "B", "C", "D", "E"},
                                      window_s=1.5, sleep=pauses.append)  # fmt: skip
    assert sorted(wedged) == ["C", "D"]  # B's utilisation was the tail of an average: idle on the next reading
    assert pauses == [0.1, 0.2, 0.4, 0.8] and wedged["D"]["seconds"] == 1.5 and len(wedged["D"]["readings"]) == 5
    pauses.clear()
    wedged, _, _ = health.wedged_gpus(first[:2], [], sample=lambda: (later[:2], []), keys={"A", "B"},
                                      sleep=pauses.append)  # fmt: skip
    assert wedged == {} and pauses == [0.1], "a GPU that reads idle again costs one reading"
    assert health.wedged_gpus(first, [], sample=None, keys={"A"}, sleep=pauses.append)[0] == {}


def record_smi_waits(monkeypatch) -> dict:
    """Every timeout the nvidia-smi runner waits with (communicate, the reap after a kill) and the groups it killed."""
    from ansible_collections.blackwell.serving.plugins.module_utils.nvidia import smi as nv

    waits: dict = {"communicate": [], "reap": [], "killed_groups": 0}
    real_start, real_killpg = nv._start, os.killpg

    def start(argv):
        proc = real_start(argv)
        real_communicate, real_wait = proc.communicate, proc.wait

        def communicate(timeout=None):
            waits["communicate"].append(timeout)
            return real_communicate(timeout=timeout)

        def wait(timeout=None):
            waits["reap"].append(timeout)
            return real_wait(timeout=timeout)

        proc.communicate, proc.wait = communicate, wait
        return proc

    def killpg(pgid, sig):
        waits["killed_groups"] += 1
        return real_killpg(pgid, sig)

    monkeypatch.setattr(nv, "_start", start)
    monkeypatch.setattr(nv.os, "killpg", killpg)
    return waits


def test_a_hung_nvidia_smi_ends_at_its_timeout_with_a_message_and_the_release_goes_on(tmp_path, capsys, monkeypatch):
    (tmp_path / "shm").mkdir()
    (tmp_path / "shm" / "psm_stale").write_bytes(b"x")
    args = {**sim(tmp_path, mode="hang"), "nvidia_smi_timeout_s": 0.5, "service_users": [str(os.geteuid())]}
    waits = record_smi_waits(monkeypatch)
    rc, out = run_main(args, capsys, check=False)
    assert rc == 1
    # the bound, without a clock: each nvidia-smi call was given what was left of the 0.5 s, nothing was signalled
    # (so no grace period ran), and what follows the timeout waits at most 1 s per killed call (abandon)
    assert waits["communicate"] and all(0 < w <= 0.5 for w in waits["communicate"]), waits
    assert waits["killed_groups"] == 2 and all(w <= 1 for w in waits["reap"]), waits
    assert out["targets"] == [] and out["signalled"] == {"TERM": [], "KILL": []}
    assert " --query-gpu=index," in out["msg"]
    assert out["msg"].endswith("did not answer within 0.5 s (nvidia_smi_timeout_s) and was killed: the driver or a "
                               "GPU is hung. Check dmesg for Xid errors; `nvidia-smi -r` (GPUs idle) or a reboot "
                               "clears it.")
    assert out["summary"][1].startswith("nvidia-smi gave no answer: GPU verification skipped")
    assert not (tmp_path / "shm" / "psm_stale").exists(), "the release itself goes on without nvidia-smi"
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "sim.json")], capture_output=True, text=True, check=False)
    assert left.stdout == "", "the hung calls (which ignore SIGTERM) were killed"


def test_timed_runner_kills_the_whole_call_and_names_the_setting(tmp_path):
    from ansible_collections.blackwell.serving.plugins.module_utils.nvidia import smi as nv

    script = tmp_path / "slow"
    script.write_text("#!/bin/sh\nsleep 30\necho late\n")  # sh waits for its child: the group must be killed
    script.chmod(0o755)
    with pytest.raises(nv.NvidiaError) as exc:
        nv.run_query(str(script), ["--query-gpu=index"], nv.timed_runner(0.2, "gpu_facts_timeout_s"))
    assert exc.value.kind == "timeout"
    assert str(exc.value).startswith(f"{script} --query-gpu=index did not answer within 0.2 s (gpu_facts_timeout_s)")


# ---------------------------------------------------------------- state.json (teardown's record, state_dir)


def serving_host(state_dir: Path, status: str = "serving") -> None:
    release = state_dir / "releases" / "sglang-20261201-a"
    release.mkdir(parents=True)
    (release / "release.json").write_text(json.dumps(
        {"id": "sglang-20261201-a", "engine": "sglang", "profile": "kimi", "unit": "sglang-kimi.service"}))
    (state_dir / "state.json").write_text(json.dumps(
        {"current": "sglang-20261201-a", "previous": "vllm-x", "status": status}, indent=2))


def test_state_dir_records_the_release_as_stopped_honestly_in_check_mode_and_once(tmp_path, capsys):
    state_dir = tmp_path / "state"
    serving_host(state_dir)
    before = (state_dir / "state.json").read_text()
    args = {**sim(tmp_path), "state_dir": str(state_dir), "service_users": ["no-such-user-xyz"], "clean_shm": False,
            "_ansible_diff": True}  # fmt: skip
    rc, out = run_main(args, capsys, check=True)
    assert rc == 0 and out["changed"] is True
    assert (state_dir / "state.json").read_text() == before, "check mode writes nothing"
    assert out["diff"]["before"] == before and '\n    "status": "stopped"\n' in out["diff"]["after"]
    assert out["diff"]["before_header"] == str(state_dir / "state.json")
    assert out["summary"][-1] == ("release sglang-20261201-a (sglang, profile kimi) would be recorded as stopped; "
                                  "a deploy starts it again")  # fmt: skip
    assert "sglang-kimi.service" in out["scope_description"], "the recorded release's unit is one of the units"

    rc, out = run_main(args, capsys, check=False)
    assert rc == 0 and out["changed"] is True
    assert json.loads((state_dir / "state.json").read_text()) == {
        "current": "sglang-20261201-a", "previous": "vllm-x", "status": "stopped"}
    assert (state_dir / "state.json").read_text().startswith('{\n    "current": ')  # as to_nice_json writes it
    assert out["summary"][-1].startswith("release sglang-20261201-a (sglang, profile kimi) is recorded as stopped")
    rc, out = run_main(args, capsys, check=False)
    assert rc == 0 and out["changed"] is False and out["release"]["state_changed"] is False


def test_state_dir_without_a_deploy_and_after_a_failed_release(tmp_path, capsys):
    args = {**sim(tmp_path, wedged={0: {"utilization_pct": 100}}), "state_dir": str(tmp_path / "none"),
            "service_users": ["no-such-user-xyz"], "clean_shm": False, "wedged_window_s": 0.1}  # fmt: skip
    rc, out = run_main(args, capsys, check=False)
    assert rc == 1 and out["summary"][-2] == "no release recorded on this host"
    serving_host(tmp_path / "none")
    rc, out = run_main(args, capsys, check=False)
    assert rc == 1 and out["msg"].startswith("wedged GPU") and "diff" not in out
    assert json.loads((tmp_path / "none" / "state.json").read_text())["status"] == "serving", "a failed teardown"
    assert out["summary"][-2] == "release sglang-20261201-a (sglang, profile kimi): state.json left as it was (serving)"


# --- scope decisions fail closed ----------------------------------------------------------------------------------
def test_nspid_depth_is_read_from_status() -> None:
    assert pf.parse_nspid_depth("Name:\tsglang\nNSpid:\t4242\n") == 1
    assert pf.parse_nspid_depth("NSpid:\t4242\t17\t1\n") == 3
    assert pf.parse_nspid_depth("Name:\told kernel\n") is None


def _scheduler(pidns: str | None, depth: int | None, **kwargs) -> pf.Proc:
    engine = proc(4242, 1, ["sglang::scheduler_TP0"], pidns=pidns,
                  **{"cgroups": ["/system.slice/sglang.service"], **kwargs})
    engine.pidns_depth = depth
    return engine


def test_an_unreadable_namespace_link_falls_back_to_nspid_and_spares_a_nested_process() -> None:
    """Inside a systemd container without CAP_SYS_PTRACE root cannot readlink another user's ns/pid; the NSpid: line
    still shows the process one namespace deeper: a container's, never a target."""
    params = selection_params(service_users=["0"])
    scope = scope_of(params, {})
    scope.pidns_depth = 1
    assert scope.out_of_scope(_scheduler(None, 2)) == (
        "in another PID namespace (nested 1 level(s) below this one, from NSpid): a container's process")
    assert scope.out_of_scope(_scheduler(None, 1)) is None  # the same namespace, shown by NSpid


@pytest.mark.parametrize(("engine", "why"), [
    (_scheduler(None, None), "its PID namespace cannot be read: not known to be ours"),
    (_scheduler("pid:[1]", 1, uid=None), "its owner cannot be read: not known to be ours"),
    (_scheduler("pid:[1]", 1, cgroups=[]), "its cgroup cannot be read: not known to be ours"),
])
def test_what_cannot_be_read_about_a_process_makes_it_not_a_target(engine: pf.Proc, why: str) -> None:
    for scope_name in ("default", "host"):
        params = selection_params(service_users=["0"], scope=scope_name)
        scope = scope_of(params, {})
        scope.pidns_depth = None if engine.pidns_depth is None else 1
        assert scope.out_of_scope(engine) == why


def test_a_compute_apps_peer_device_files_do_not_make_it_a_holder_of_those_gpus():
    """A tensor-parallel job with memory on GPU 0 has GPU 1's device file open for peer-to-peer access: nvidia-smi
    lists it on GPU 0 only, so it is a holder (here foreign) of GPU 0 and a `peer` on GPU 1."""
    job = proc(70, 1, ["python3", "train.py"],
               fds=["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1"])
    table = {m: {"index": m, "uuid": f"GPU-{m}", "bus_id": None, "minor": m, "holders": []} for m in (0, 1)}
    foreign = release_gpus.classify_holders(procs={70: job}, table=table, app_mem={70: {0: 4096}}, targets={},
                                           spared=[], dev_dir="/dev", protected=[], apps_authoritative=True,
                                           foreign_by_pid={})
    assert [f["gpus"] for f in foreign] == [[0]]
    assert [(h["pid"], h["role"], h["used_mib"]) for h in table[0]["holders"]] == [(70, "foreign", 4096)]
    assert [(h["pid"], h["role"], h["compute"]) for h in table[1]["holders"]] == [(70, "peer", False)]
    # Without nvidia-smi's list (another PID namespace, no driver) every open device file still counts as held.
    table = {m: {"index": m, "uuid": f"GPU-{m}", "bus_id": None, "minor": m, "holders": []} for m in (0, 1)}
    foreign = release_gpus.classify_holders(procs={70: job}, table=table, app_mem={}, targets={}, spared=[],
                                           dev_dir="/dev", protected=[], apps_authoritative=False, foreign_by_pid={})
    assert [f["gpus"] for f in foreign] == [[0, 1]]


def test_main_requires_the_engines_from_its_caller(tmp_path, capsys):
    """No engine list of its own: the role passes the roster's units, patterns and service users."""
    rc, out = run_main({"shm_dir": str(tmp_path)}, capsys)
    assert rc == 1 and out["msg"] == "missing required arguments: patterns, service_users, units"


# ---------------------------------------------------------------- what a result says of a process: never its arguments


@pytest.mark.parametrize(
    ("argv", "title"),
    [
        (["sglang::scheduler_TP0"], "sglang::scheduler_TP0"),
        (["/opt/sglang/bin/sglang", "serve", "--api-key", "SECRET"], "/opt/sglang/bin/sglang"),
        (["/opt/venv/bin/python3.12", "serve.py", "--api-key", "SECRET"], "python3.12"),
        (["python3", "-c", "import x", "--api-key", "SECRET"], "python3"),
        # setproctitle: one NUL-padded argv[0] that holds a whole command line
        (pf.parse_cmdline(b"gunicorn: master [app --api-key SECRET]\0\0\0\0"), "gunicorn:"),
        (pf.parse_cmdline(b"python3 serve.py --api-key SECRET   \0\0"), "python3"),
        (["trainer\t--api-key=SECRET"], "trainer"),
        ([], "[kworker/0:1]"),
        (["", "--api-key", "SECRET"], "[kworker/0:1]"),
        (["x" * 500], "x" * pf.TITLE_MAX),
    ],
)
def test_a_process_is_named_by_its_title_never_its_arguments(argv, title):
    brief = pf.Proc(42, 1, 1042, "S", 0, "kworker/0:1", list(argv)).brief()
    assert brief == {"pid": 42, "ppid": 1, "user": pf.user_name(0), "title": title}
    assert "SECRET" not in json.dumps(brief)


def test_nvidia_smis_process_names_are_cut_as_titles_are():
    apps = [{"pid": 7, "name": "trainer --api-key SECRET"}, {"pid": 8, "name": "/usr/bin/python3"},
            {"pid": 9, "name": "[Not Found]"}, {"pid": 10, "name": None}]
    assert [a["name"] for a in release_gpus.titled(apps)] == ["trainer", "python3", "[Not Found]", None]


def hold_gpu(argv: list[str], dev: Path, minor: int, mib: int, children: list[subprocess.Popen]) -> int:
    """A process with this argv (argv[0] may be a process title) that holds GPU ``minor`` with ``mib`` MiB."""
    code = (f"import time; fs=[open('{dev}/nvidia{minor}'), open('{dev}/nvidia-uvm')]; print('ready', flush=True); "
            "time.sleep(60)")
    child = subprocess.Popen([argv[0], "-c", code, *argv[1:]], executable=sys.executable, stdout=subprocess.PIPE,
                             env={**os.environ, "NVSIM_MEM_MIB": f"{minor}:{mib}"})
    children.append(child)
    assert child.stdout.readline() == b"ready\n"
    return child.pid


def test_a_key_on_a_foreign_command_line_never_reaches_the_result_or_the_report(tmp_path, capsys):
    """A stranger's process holding a GPU with a key in its arguments, or in a title set to a whole command line, is
    named by pid, user and title; so is an engine of ours started with a key on its command line."""
    args = {**sim(tmp_path), "service_users": [str(os.geteuid())], "report_only": True,
            "fail_on_foreign_holders": True, "clean_shm": False}  # fmt: skip
    dev, children = tmp_path / "dev", []
    try:
        engine = hold_gpu(["sglang::scheduler_TP0", "--api-key", "SECRET-engine"], dev, 0, 1024, children)
        stranger = hold_gpu(["python3", "serve.py", "--api-key", "SECRET-argv"], dev, 1, 2048, children)
        titled = hold_gpu(["trainer --api-key SECRET-title"], dev, 4, 512, children)
        rc, out = run_main(args, capsys, check=False)
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert rc == 1
    assert "SECRET" not in json.dumps(out), [line for line in out["summary"] if "SECRET" in line]
    user = pf.user_name(os.geteuid())
    assert [(t["pid"], t["title"], t["user"]) for t in out["targets"]] == [(engine, "sglang::scheduler_TP0", user)]
    holders = {f["pid"]: (f["title"], f["user"]) for f in out["foreign_holders"]}
    assert holders == {stranger: ("python3", user), titled: ("trainer", user)}
    assert f"PID {stranger} python3 ({user}) on GPUs [3]" in out["msg"]  # minor 1 is index 3
    assert f"PID {titled} trainer ({user}) on GPUs [6]" in out["msg"]
    assert any(line.startswith(f"foreign, not signalled: {stranger} python3 ({user}) on GPUs [3]")
               for line in out["summary"]), out["summary"]
    named = {h["pid"]: h["title"] for g in out["gpus"] for h in g["holders"]}
    assert named[engine] == "sglang::scheduler_TP0" and named[titled] == "trainer"
