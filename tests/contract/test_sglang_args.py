"""The rendered SGLang config of every model profile against SGLang's real parser (pinned version).

roles/sglang/files/check_sglang_args.py runs in the contract venv (CPU torch, sglang --no-deps): SGLang's
own `--config` merger, then its `ServerArgs.add_cli_args` parser with abbreviations off.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from sglang_helpers import CHECK_SCRIPT, MODELS_FILE, contract_python, pinned_sglang_lock, run_json_in_venv
from sglang_render import render_config, role_defaults

pytestmark = pytest.mark.contract

SECRET = "s3cr%t $key 'q\" tail"
DEFAULTS = {"sglang_api_key": SECRET}
PROFILES: dict[str, dict[str, Any]] = yaml.safe_load(MODELS_FILE.read_text(encoding="utf-8"))[
    "engine_profiles"]
SPEC_PROFILE = next(name for name, p in PROFILES.items() if p.get("speculative"))

# Every config is checked in one venv process (importing SGLang costs seconds): check_sglang_args.main()
# per file, its stdout/stderr captured; and, for UPSTREAM_CASES, what SGLang's own `prepare_server_args`
# (the `sglang serve --config` path, abbreviations on) makes of the same file. Results as JSON to argv[1].
BATCH_CODE = r"""
import contextlib, io, json, sys
sys.path.insert(0, sys.argv[2])
import check_sglang_args
from sglang.srt.server_args import prepare_server_args
results, upstream = {}, {}
for path in sys.argv[4:]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = check_sglang_args.main([path])
    results[path] = {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}
for path in json.loads(sys.argv[3]):
    args = prepare_server_args(["--config", path])
    upstream[path] = {"mem_fraction_static": args.mem_fraction_static, "tp_size": args.tp_size}
with open(sys.argv[1], "w") as handle:
    json.dump({"results": results, "upstream": upstream}, handle)
print(json.dumps({"checked": len(results)}))
"""
UPSTREAM_CASES = ("misspelled-flag", "abbreviated-flag", "abbreviation-sets-a-value")

# Bad configs: (profile, defaults, extra sglang_options) and the parser message expected.
BAD_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "misspelled-flag": ({}, {"speculative-num-step": 3},
                        "unrecognized arguments: --speculative-num-step"),
    "abbreviated-flag": ({}, {"tp": 8}, "unrecognized arguments: --tp"),
    "abbreviation-sets-a-value": ({}, {"mem-fraction-stat": 0.5},
                                  "unrecognized arguments: --mem-fraction-stat"),
    "bad-choice": ({"sglang_extra_options": {"attention-backend": "tritonx"}}, {},
                   "argument --attention-backend: invalid choice: 'tritonx'"),
    "removed-flag": ({}, {"cuda-graph-max-bs": 16}, "unrecognized arguments: --cuda-graph-max-bs"),
    "underscored-key": ({}, {"max_running_requests": 8}, "unrecognized arguments: --max_running_requests"),
    "bad-int": ({}, {"cuda-graph-max-bs-decode": "sixteen"},
                "argument --cuda-graph-max-bs-decode: invalid int value: 'sixteen'"),
    "misspelled-secret-key": ({"sglang_api_key": ""}, {"api-keyy": SECRET},
                              "unrecognized arguments: --api-keyy"),
}


def profile_with(name: str, extra_options: dict[str, Any]) -> dict[str, Any]:
    profile = json.loads(json.dumps(PROFILES[name]))
    options = dict(profile.get("sglang_options") or {})
    options.update(extra_options)
    # An option the profile already sets is replaced, so each bad case changes exactly one thing.
    profile["sglang_options"] = options
    return profile


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Render every profile and every bad case, check all in one venv process; results by case name."""
    directory = tmp_path_factory.mktemp("sglang-configs")
    paths: dict[str, Path] = {}
    for name, profile in PROFILES.items():
        paths[f"profile:{name}"] = directory / f"{name}.yaml"
        paths[f"profile:{name}"].write_text(render_config(profile, DEFAULTS), encoding="utf-8")
    for case, (defaults, options, _) in BAD_CASES.items():
        paths[case] = directory / f"bad-{case}.yaml"
        text = render_config(profile_with(SPEC_PROFILE, options), {**DEFAULTS, **defaults})
        paths[case].write_text(text, encoding="utf-8")
    results_file = directory / "results.json"
    upstream_paths = json.dumps([str(paths[case]) for case in UPSTREAM_CASES])
    run_json_in_venv(BATCH_CODE, str(results_file), str(CHECK_SCRIPT.parent), upstream_paths,
                     *map(str, paths.values()), timeout=300)
    output = json.loads(results_file.read_text(encoding="utf-8"))
    return {case: {**output["results"][str(path)], "path": path,
                   "upstream": output["upstream"].get(str(path))} for case, path in paths.items()}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profile_config_passes_the_real_parser(checked: dict[str, dict[str, Any]], name: str) -> None:
    result = checked[f"profile:{name}"]
    assert result["rc"] == 0, result["stderr"]
    parsed = json.loads(result["stdout"])
    profile = PROFILES[name]
    assert parsed["sglang_version"] == pinned_sglang_lock()["version"]
    assert parsed["abbreviations"] is False
    assert parsed["model_path"] == profile["model"]["path"]
    assert parsed["tp_size"] == profile["tensor_parallel_size"]
    for key, field in (("data_parallel_size", "dp_size"), ("attention_data_parallel_size", "attn_dp_size"),
                       ("expert_parallel_size", "ep_size")):
        assert parsed[field] == profile.get(key, 1), key
    assert parsed["served_model_name"] == profile["served_model_name"]
    assert parsed["context_length"] == profile["context_length"]
    assert parsed["port"] == profile["port"]
    assert parsed["trust_remote_code"] is bool(profile["trust_remote_code"])
    assert parsed["host"] == role_defaults()["sglang_listen_address"]
    assert parsed["api_key_set"] is True
    speculative = profile.get("speculative")
    if speculative:
        assert parsed["speculative_algorithm"] == speculative["algorithm"]
        assert parsed["speculative_draft_model_path"] == profile["drafter"]["path"]
        assert parsed["speculative_num_steps"] == speculative["num_steps"]
        assert parsed["speculative_eagle_topk"] == speculative["eagle_topk"]
        assert parsed["speculative_num_draft_tokens"] == speculative["num_draft_tokens"]
    else:
        assert parsed["speculative_algorithm"] is None
    options = {**role_defaults()["sglang_default_options"], **(profile.get("sglang_options") or {})}
    for flag, value in options.items():
        field = flag.replace("-", "_")
        if field in parsed:
            assert parsed[field] == value, flag


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_config_is_rejected_with_the_parsers_message(checked: dict[str, Any], case: str) -> None:
    result = checked[case]
    assert result["rc"] == 2, result
    assert BAD_CASES[case][2] in result["stderr"]
    assert "REJECTED by sglang" in result["stderr"]
    assert result["stdout"] == ""


@pytest.mark.parametrize("case", ["misspelled-secret-key", *(f"profile:{n}" for n in sorted(PROFILES))])
def test_secret_is_never_printed(checked: dict[str, dict[str, Any]], case: str) -> None:
    result = checked[case]
    config = yaml.safe_load(result["path"].read_text(encoding="utf-8"))
    assert SECRET in config.values()  # the secret really was in the config
    assert SECRET not in result["stdout"] + result["stderr"]
    assert "s3cr%t" not in result["stdout"] + result["stderr"]


def test_upstream_parser_takes_the_abbreviations_the_check_refuses(checked: dict[str, Any]) -> None:
    """Why the check exists: SGLang's own `prepare_server_args` (what `sglang serve --config` runs) silently
    takes `speculative-num-step` as `--speculative-num-steps`, `tp` as `--tp-size` and sets
    `mem_fraction_static` from a misspelled `mem-fraction-stat` (it raises SystemExit on what it refuses)."""
    for case in UPSTREAM_CASES:
        assert checked[case]["rc"] == 2, case  # while the check refuses it
    assert checked["misspelled-flag"]["upstream"] is not None
    assert checked["abbreviated-flag"]["upstream"]["tp_size"] == 8
    assert checked["abbreviation-sets-a-value"]["upstream"]["mem_fraction_static"] == 0.5


def test_command_line_interface(checked: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """The script as the role runs it: a subprocess of the venv's python, extra argv after the config."""
    python = str(contract_python())
    good = str(checked[f"profile:{SPEC_PROFILE}"]["path"])
    argv = [python, str(CHECK_SCRIPT), good, "--port", "31000", "--api-key", "other-secret"]
    accepted = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["port"] == 31000  # command line wins over the config, as in SGLang
    assert "other-secret" not in accepted.stdout + accepted.stderr
    rejected = subprocess.run([python, str(CHECK_SCRIPT), str(checked["removed-flag"]["path"])],
                              capture_output=True, text=True, timeout=120, check=False)
    assert rejected.returncode == 2
    assert "unrecognized arguments: --cuda-graph-max-bs" in rejected.stderr
    missing = subprocess.run([python, str(CHECK_SCRIPT), str(tmp_path / "absent.yaml")],
                             capture_output=True, text=True, timeout=120, check=False)
    assert missing.returncode == 1
    assert "absent.yaml" in missing.stderr
    duplicate = tmp_path / "duplicate.yaml"
    duplicate.write_text("model-path: /a\nmodel-path: /b\n", encoding="utf-8")
    dup = subprocess.run([python, str(CHECK_SCRIPT), str(duplicate)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert dup.returncode == 1
    assert "duplicate key 'model-path'" in dup.stderr
