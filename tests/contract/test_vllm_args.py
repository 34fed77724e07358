"""roles/vllm/files/check_vllm_args.py against the real `vllm serve` parser of the pinned vLLM.

The pinned version comes from the lock files (roles/vllm/locks/, `pinned: true`). Its CPU contract venv is
built by scripts/contract-venv-vllm.sh. Importing vLLM takes 10-20 s, so every case below is checked in one
`--many` run, plus one single-argv run through stdin (the way the role's preflight calls it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from vllm_helpers import (
    CHECK_SCRIPT,
    REPO_ROOT,
    contract_venv,
    other_locked_vllm_versions,
    pinned_vllm_version,
)

pytestmark = pytest.mark.contract

MODELS_FILE = REPO_ROOT / "inventory" / "production" / "group_vars" / "all" / "models.yml"
ROLE_DEFAULTS = REPO_ROOT / "roles" / "vllm" / "defaults" / "main.yml"

EAGLE3 = json.dumps({"method": "eagle3", "model": "/srv/models/drafter", "num_speculative_tokens": 3})
GOOD = ["serve", "/srv/models/kimi", "--tensor-parallel-size", "8", "--trust-remote-code",
        "--speculative-config", EAGLE3, "--gpu-memory-utilization", "0.85", "--port", "8000",
        "--host", "127.0.0.1", "--max-model-len", "131072", "--served-model-name", "kimi-k2.5",
        "--max-num-seqs", "16", "--disable-custom-all-reduce"]


def _speculative(**config) -> list[str]:
    return ["serve", "/srv/models/kimi", "--speculative-config", json.dumps(config)]


# name -> (argv, None for accepted, else a fragment of the expected parser message)
CASES: dict[str, tuple[list[str], str | None]] = {
    "good_eagle3": (GOOD, None),
    "good_with_program_path": (["/opt/vllm/venv/bin/vllm", *GOOD], None),
    "abbreviated_tensor_parallel": (["serve", "/m", "--tensor-parallel", "8"],
                                    "unrecognized arguments: --tensor-parallel 8"),
    "abbreviated_gpu_memory": (["serve", "/m", "--gpu-memory-util", "0.9"],
                               "unrecognized arguments: --gpu-memory-util 0.9"),
    # vLLM's `--speculative-num-step` trap: a prefix of --spec-tokens that argparse would take silently.
    "abbreviated_spec_tokens": (["serve", "/m", "--spec-method", "eagle3", "--spec-model", "/d",
                                 "--spec-tok", "3"], "unrecognized arguments: --spec-tok 3"),
    "misspelled_flag": (["serve", "/m", "--tensor-paralel-size", "8"],
                        "unrecognized arguments: --tensor-paralel-size 8"),
    "bad_choice": (["serve", "/m", "--dtype", "float7"], "argument --dtype: invalid choice: 'float7'"),
    "bad_int": (["serve", "/m", "--tensor-parallel-size", "eight"], "invalid int value: 'eight'"),
    "broken_speculative_json": (["serve", "/m", "--speculative-config", '{"method": "eagle3",'],
                                "argument --speculative-config/-sc"),
    "unknown_speculative_key": (_speculative(method="eagle3", model="/d", num_speculative_tokens=3,
                                             draft_attention_backend="TRITON_MLA"),
                                "unknown key 'draft_attention_backend'"),
    "bad_speculative_method": (_speculative(method="eagle9", model="/d", num_speculative_tokens=3),
                               "'method'='eagle9'"),
    "bad_speculative_type": (_speculative(method="eagle3", model="/d", num_speculative_tokens="three"),
                             "'num_speculative_tokens'='three'"),
}


def _merged_argv(flags: dict) -> list[str]:
    from ansible_collections.blackwell.serving.plugins.filter.engine_flags import argv_words, merged_flags

    return argv_words(merged_flags([flags]))


def role_argv(profile: dict) -> list[str]:
    """The argv the vllm role renders for a profile (mirror of roles/vllm/tasks/main.yml, with the role's
    own flag filter), as a list: what the role writes to argv.json and the checker reads."""
    defaults = yaml.safe_load(ROLE_DEFAULTS.read_text())
    flags: dict = {
        "served-model-name": profile["served_model_name"],
        "tokenizer": profile.get("tokenizer") or profile["model"]["path"],
        "tensor-parallel-size": int(profile["tensor_parallel_size"]),
        "data-parallel-size": int(profile.get("data_parallel_size") or 1),
        "enable-expert-parallel": int(profile.get("expert_parallel_size") or 1) > 1,
        "host": defaults["vllm_listen_address"],
        "port": int(profile["port"]),
        "max-model-len": profile.get("context_length"),
        "quantization": profile.get("quantization"),
        "trust-remote-code": bool(profile.get("trust_remote_code", False)),
    }
    spec = profile.get("speculative")
    if spec:
        flags["speculative-config"] = json.dumps({
            "method": spec["algorithm"].lower(), "model": profile["drafter"]["path"],
            "num_speculative_tokens": int(spec["num_steps"]), **defaults["vllm_speculative_extra"]})
    flags.update(defaults["vllm_default_options"])
    flags.update(profile.get("vllm_options") or {})
    flags.update(defaults["vllm_extra_options"])
    return ["serve", profile["model"]["path"], *_merged_argv(flags)]


def production_profiles() -> dict[str, dict]:
    """The example profiles the vllm role takes: its input check refuses the others (a layout vLLM has not)."""
    from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import load_roster
    from ansible_collections.blackwell.serving.plugins.plugin_utils.parallel_layout import engine_problems

    vllm = load_roster()["vllm"]
    return {name: profile for name, profile in yaml.safe_load(MODELS_FILE.read_text())["engine_profiles"].items()
            if not engine_problems(profile, vllm)}


def test_the_example_profiles_vllm_refuses_are_the_attention_data_parallel_one() -> None:
    every = yaml.safe_load(MODELS_FILE.read_text())["engine_profiles"]
    assert sorted(set(every) - set(production_profiles())) == ["kimi-k25-int4-attndp2-ep8"]


@pytest.fixture(scope="module")
def venv() -> Path:
    return contract_venv(pinned_vllm_version())


@pytest.fixture(scope="module")
def batch(venv: Path, tmp_path_factory) -> dict[str, dict]:
    cases = {name: argv for name, (argv, _) in CASES.items()}
    cases.update({f"profile:{name}": role_argv(p) for name, p in production_profiles().items()})
    path = tmp_path_factory.mktemp("vllm-args") / "cases.json"
    path.write_text(json.dumps(list(cases.values())))
    proc = subprocess.run([str(venv / "bin" / "python"), str(CHECK_SCRIPT), "--many", str(path)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode in (0, 2), proc.stderr[-3000:]
    output = json.loads(proc.stdout)
    assert output["vllm_version"] == pinned_vllm_version()
    results = dict(zip(cases, output["results"], strict=True))
    assert proc.returncode == (0 if all(r["ok"] for r in results.values()) else 2)
    return results


@pytest.mark.parametrize("name", list(CASES))
def test_case(batch: dict[str, dict], name: str):
    _, rejected_with = CASES[name]
    result = batch[name]
    if rejected_with is None:
        assert result["ok"], result.get("error")
    else:
        assert not result["ok"], f"{name} was accepted: {result.get('non_default')}"
        assert result["exit"] == 2
        assert rejected_with in result["error"]


def test_good_eagle3_values_are_parsed_as_meant(batch: dict[str, dict]):
    parsed = batch["good_eagle3"]["non_default"]
    assert parsed["model_tag"] == "/srv/models/kimi"
    assert parsed["tensor_parallel_size"] == 8
    assert parsed["speculative_config"] == json.loads(EAGLE3)
    assert parsed["trust_remote_code"] is True
    assert parsed["max_model_len"] == 131072
    assert parsed["disable_custom_all_reduce"] is True


@pytest.mark.parametrize("name", sorted(production_profiles()))
def test_every_production_profile_renders_an_argv_the_parser_accepts(batch: dict[str, dict], name: str):
    result = batch[f"profile:{name}"]
    assert result["ok"], result.get("error")
    profile = production_profiles()[name]
    assert result["non_default"].get("tensor_parallel_size", 1) == profile["tensor_parallel_size"]
    assert result["non_default"].get("data_parallel_size", 1) == profile.get("data_parallel_size", 1)
    assert result["non_default"].get("enable_expert_parallel", False) is (profile.get("expert_parallel_size", 1) > 1)
    if profile.get("speculative"):
        assert result["non_default"]["speculative_config"]["method"] == "eagle3"


def test_single_argv_from_stdin_exit_codes_and_messages(venv: Path):
    """The preflight form: one argv on stdin; 0 + JSON when accepted, 2 + the parser's message when not."""
    python, script = str(venv / "bin" / "python"), str(CHECK_SCRIPT)
    bad = ["/opt/vllm/venv/bin/vllm", "serve", "/m", "--speculative-conf", EAGLE3]
    proc = subprocess.run([python, script, "-"], input=json.dumps(bad), capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 2
    assert "vllm: error: unrecognized arguments: --speculative-conf" in proc.stderr
    assert proc.stdout == ""
    not_a_list = subprocess.run([python, script, "-"], input='"serve /m"', capture_output=True, text=True,
                                timeout=60, check=False)
    assert not_a_list.returncode == 1
    assert "must be a JSON list of strings" in not_a_list.stderr


@pytest.mark.parametrize("version", other_locked_vllm_versions())
def test_other_locked_versions_accept_the_rendered_profiles(version: str, tmp_path: Path):
    """A deploy may select another locked vLLM (vllm_version): its parser must take the same argv."""
    venv = contract_venv(version)
    cases = [role_argv(p) for p in production_profiles().values()]
    cases.append(CASES["abbreviated_tensor_parallel"][0])
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    proc = subprocess.run([str(venv / "bin" / "python"), str(CHECK_SCRIPT), "--many", str(path)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    output = json.loads(proc.stdout)
    assert output["vllm_version"] == version
    *profiles, abbreviated = output["results"]
    assert all(r["ok"] for r in profiles), [r.get("error") for r in profiles]
    assert "unrecognized arguments: --tensor-parallel 8" in abbreviated["error"]


# Names the pinned vLLM registers for --reasoning-parser and --tool-call-parser. Its argument parser takes
# any string there (vllm/engine/arg_utils.py; entrypoints/common/cli_args.py validate_parsed_serve_args only
# checks that --enable-auto-tool-choice comes with a tool parser), so a misspelled name would pass it.
REGISTERED_PARSERS_CODE = """
import json
from vllm.reasoning import ReasoningParserManager
try:
    from vllm.tool_parsers import ToolParserManager
except ImportError:
    from vllm.entrypoints.openai.tool_parsers import ToolParserManager
print(json.dumps({"reasoning-parser": sorted(ReasoningParserManager.list_registered()),
                  "tool-call-parser": sorted(ToolParserManager.list_registered())}))
"""
PARSER_FLAGS = ("reasoning-parser", "tool-call-parser")


def parsers_registered_in(venv: Path) -> dict[str, list[str]]:
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", REGISTERED_PARSERS_CODE], capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def registered_parsers(venv: Path) -> dict[str, list[str]]:
    return parsers_registered_in(venv)


@pytest.mark.parametrize("name", sorted(production_profiles()))
def test_vllm_profile_has_the_kimi_parsers_of_the_sglang_profile(batch: dict[str, dict], name: str,
                                                                  registered_parsers: dict[str, list[str]]):
    """Served by either engine, a profile answers the same way: Kimi's tool calls parsed, its thinking split off."""
    profile = production_profiles()[name]
    wanted = {flag: value for flag, value in (profile.get("sglang_options") or {}).items() if flag in PARSER_FLAGS}
    parsed = batch[f"profile:{name}"]["non_default"]
    for flag, value in wanted.items():
        assert parsed.get(flag.replace("-", "_")) == value, f"{name}: vLLM gets no --{flag} {value}"
        assert value in registered_parsers[flag], f"{flag} {value} is not registered in vLLM"
    if "tool-call-parser" in wanted:
        assert parsed.get("enable_auto_tool_choice") is True, f"{name}: vLLM ignores tool calls without it"


def test_parser_registry_reader_rejects_a_made_up_name(registered_parsers: dict[str, list[str]]):
    assert "kimi_k2" in registered_parsers["reasoning-parser"]
    assert "kimi_k2" in registered_parsers["tool-call-parser"]
    assert "kimi_k22" not in registered_parsers["reasoning-parser"]


@pytest.mark.parametrize("version", other_locked_vllm_versions())
def test_other_locked_versions_register_the_profiles_parsers(version: str):
    registered = parsers_registered_in(contract_venv(version))
    for name, profile in production_profiles().items():
        for flag, value in (profile.get("vllm_options") or {}).items():
            if flag in PARSER_FLAGS:
                assert value in registered[flag], f"{name}: vLLM {version} has no {flag} {value}"
