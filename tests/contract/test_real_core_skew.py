"""The REAL-CORE TEST ENGINE (vLLM 0.32.0 CPU build, tests/real_core/) against the pinned vLLM 0.33.0: the flags of
the two real `vllm serve` parsers and the `vllm:` metric names of the two versions' sources differ exactly as
tests/real_core/skew-0.32.0-cpu-vs-0.33.0.yml says, and everything the real-core host scenario leans on is in both:
the real-core profile's options and the role's flags, the speculative-decoding counters verify reads (the engine
roster's), and the flags of the benchmark recipe."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.contract

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "real_core"))
import real_core_venv  # noqa: E402

SKEW = REPO / "tests" / "real_core" / "skew-0.32.0-cpu-vs-0.33.0.yml"
PINNED_FLAGS = REPO / "roles" / "vllm" / "files" / "flags-0.33.0.txt"
METRIC_SOURCES = ("vllm/v1/metrics", "vllm/v1/spec_decode/metrics.py")
METRIC_NAME = re.compile(r"""["'](vllm:[a-z0-9_]+)["']""")


@pytest.fixture(scope="module")
def real_core() -> Path:
    try:
        return real_core_venv.build()
    except SystemExit as failed:
        pytest.fail(f"the {real_core_venv.LABEL} venv cannot be built: {failed}")


def flag_list(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")}


def real_core_flags(venv: Path) -> set[str]:
    proc = subprocess.run([str(venv / "bin" / "python"), str(REPO / "tests" / "contract" / "engine_flag_names.py"),
                           "vllm"], cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return flag_list(proc.stdout)


def metric_names(site: Path) -> set[str]:
    names: set[str] = set()
    for source in METRIC_SOURCES:
        path = site / source
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            names.update(METRIC_NAME.findall(file.read_text(encoding="utf-8")))
    return names


def pinned_site() -> Path:
    from vllm_helpers import contract_venv

    venv = contract_venv("0.33.0")
    return next(venv.glob("lib/python3.*/site-packages"))


def skew_message(key_a: str, only_a: set[str], key_b: str, only_b: set[str]) -> str:
    return ("the skew changed; the lists now are:\n"
            + yaml.safe_dump({key_a: sorted(only_a), key_b: sorted(only_b)}, default_flow_style=False))


def test_the_two_parsers_differ_by_the_recorded_flags(real_core):
    skew = yaml.safe_load(SKEW.read_text())
    mine, pinned = real_core_flags(real_core), flag_list(PINNED_FLAGS.read_text())
    assert len(mine) > 300 and {"port", "speculative-config", "dtype", "enforce-eager"} <= mine
    only_mine, only_pinned = mine - pinned, pinned - mine
    recorded = (skew["flags_only_in_0_32_0_cpu"], skew["flags_only_in_0_33_0"])
    assert (sorted(only_mine), sorted(only_pinned)) == recorded, \
        skew_message("flags_only_in_0_32_0_cpu", only_mine, "flags_only_in_0_33_0", only_pinned)


def test_the_real_core_profile_and_the_roles_flags_are_flags_of_both(real_core):
    """What the real-core deploy sets (the profile's options, the flags the vllm role renders from any profile) means
    the same flag in both versions: a pass on the real core is not a pass on a flag the pin lacks."""
    profiles = yaml.safe_load((REPO / "inventory" / "sandbox" / "group_vars" / "all" / "models.yml").read_text())
    options = set(profiles["engine_profiles"]["real-core-tiny-eagle3"]["vllm_options"])
    rendered = {"served-model-name", "tokenizer", "tensor-parallel-size", "host", "port", "max-model-len",
                "quantization", "trust-remote-code", "speculative-config", "middleware"}
    both = real_core_flags(real_core) & flag_list(PINNED_FLAGS.read_text())
    assert options | rendered <= both, sorted((options | rendered) - both)


def test_the_metric_names_differ_as_recorded_and_verify_reads_names_of_both(real_core):
    skew = yaml.safe_load(SKEW.read_text())
    mine = metric_names(next(real_core.glob("lib/python3.*/site-packages")))
    pinned = metric_names(pinned_site())
    assert len(mine) > 20, sorted(mine)
    only_mine, only_pinned = mine - pinned, pinned - mine
    assert (sorted(only_mine), sorted(only_pinned)) == (skew["metrics_only_in_0_32_0_cpu"],
                                                        skew["metrics_only_in_0_33_0"]), \
        skew_message("metrics_only_in_0_32_0_cpu", only_mine, "metrics_only_in_0_33_0", only_pinned)
    roster = yaml.safe_load((REPO / "meta" / "engines.yml").read_text())
    counters = {name.removesuffix("_total") for name in roster_counters(roster)}
    assert counters <= mine & pinned, sorted(counters - (mine & pinned))


def roster_counters(roster: dict) -> list[str]:
    """The vLLM counters verify reads (meta/engines.yml `metrics.counters`), wherever the roster nests them."""
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "counters" and isinstance(value, dict):
                    found.extend(str(name) for name in value.values() if str(name).startswith("vllm:"))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(roster)
    assert found, "the roster names no vllm: counters"
    return found


def test_the_benchmark_recipe_flags_are_flags_of_the_real_cores_client(real_core):
    """verify runs the real core's own `vllm bench serve` with the lock's recipe (the pinned lock's, copied)."""
    lock = real_core_venv.load_lock()
    recipe = lock["bench"]
    flags = {word for word in recipe["argv"] if word.startswith("--")}
    for workload in recipe["workloads"].values():
        flags |= {word for word in workload if word.startswith("--")}
    for option in (*recipe["options"].values(), *recipe["switches"].values()):
        flags |= set(option)
    proc = subprocess.run([str(real_core / "bin" / "python"), "-m", "vllm.entrypoints.cli.main", "bench", "serve",
                           "--help=all"], capture_output=True, text=True, timeout=600, check=False,
                          env={"VLLM_LOGGING_LEVEL": "ERROR", "PATH": "/usr/bin:/bin", "HOME": str(real_core)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    known = set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", proc.stdout))
    assert flags <= known, sorted(flags - known)
