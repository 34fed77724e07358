"""The semantic half of the SGLang argument check: `check_sglang_args.py --resolve` runs SGLang 0.5.23's own
`ServerArgs.resolve_once()` (srt/server_args.py -> srt/arg_groups/pipeline.py), which the parser alone never
reaches.

Real SGLang code on a CPU machine: the contract venv plus the resolution overlay (tests/contract/sglang_resolve.py:
transformers and the other modules the pipeline imports, and labelled test stubs for CUDA-only packages).
The model is a tiny DeepSeek-V3-shaped config.json (architecture, MLA and MoE keys, no weights) and an EAGLE-3
drafter config, in temporary directories; the configs are the production EAGLE-3 profile rendered as the role
renders it, pointed at them.

Shown: a config with `attention-backend: flex_attention` passes the parser but SGLang's attention-backend hook
rejects it ("Speculative decoding is currently not supported with Flex Attention backend"), and the check reports
SGLang's own message with exit 2; the control config, one key different (the role's default `triton`), resolves.

`--device cuda` is given to both: on the GPU host SGLang detects CUDA itself; here it finds no accelerator
(`get_device()` raises) before any hook runs, so the test states the device the host would have.

The drafter's context (the check's step 5): resolution passes a drafter whose context is shorter than the profile's
`context_length`, and SGLang refuses it only in its scheduler, after the switch (the draft worker's ModelConfig,
`_derive_context_length`). The check builds that ModelConfig and calls SGLang's own function: the drafters of
tests/fixtures/eagle3-drafters/ (32768 tokens, plain or with a YaRN factor that SGLang does not apply) are refused
naming both lengths and the two ways out; the same drafter passes with the profile's context_length lowered to its
own, or with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 in the environment (the role's
sglang_allow_longer_draft_context), then with a warning; a drafter as long as the target (the control) or longer
(DeepSeek-V3's YaRN keys) passes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from sglang_helpers import CHECK_SCRIPT, MODELS_FILE, REPO_ROOT, pinned_sglang_lock, run_json_in_venv
from sglang_render import render_config
from sglang_resolve import resolve_path

pytestmark = pytest.mark.contract

PROFILES: dict[str, dict[str, Any]] = yaml.safe_load(MODELS_FILE.read_text(encoding="utf-8"))["engine_profiles"]
SPEC_PROFILE = next(name for name, p in PROFILES.items() if p.get("speculative"))
FLEX_MESSAGE = "AssertionError: Speculative decoding is currently not supported with Flex Attention backend"
DRAFTERS = REPO_ROOT / "tests" / "fixtures" / "eagle3-drafters"
OPT_IN = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"

# DeepSeek-V3's config.json keys (MLA: kv_lora_rank, q_lora_rank, qk_*_head_dim; MoE: n_routed_experts, ...),
# sizes shrunk. Kimi-K2.5's text model is this architecture.
TINY_DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 8, "n_routed_experts": 8, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
    "kv_lora_rank": 64, "q_lora_rank": 96, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32,
    "vocab_size": 1024, "max_position_embeddings": 131072, "rope_theta": 10000, "rms_norm_eps": 1e-6,
    "routed_scaling_factor": 1.0, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
    "tie_word_embeddings": False,
}
TINY_EAGLE3_DRAFTER = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "torch_dtype": "bfloat16",
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 8,
    "num_key_value_heads": 8, "vocab_size": 1024, "draft_vocab_size": 1024, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
}

# In the venv: the stubs and packages first on the path, the stub shim, then check_sglang_args.main() per case, with and
# without --resolve, with the case's environment variables set (argv[5]); its output captured. Results as JSON to
# argv[1].
BATCH_CODE = r"""
import contextlib, io, json, os, sys
sys.path[0:0] = json.loads(sys.argv[2])
import bws_resolve_shim  # noqa: F401
sys.path.insert(0, sys.argv[3])
import check_sglang_args
results, environments = {}, json.loads(sys.argv[5])
for case, argv in json.loads(sys.argv[4]).items():
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.update(environments.get(case, {}))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = check_sglang_args.main(argv)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    results[case] = {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}
with open(sys.argv[1], "w") as handle:
    json.dump(results, handle)
print(json.dumps({"checked": len(results)}))
"""


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("sglang-resolve")
    model, drafter = directory / "tiny-deepseek-v3", directory / "tiny-eagle3"
    for path, config in ((model, TINY_DEEPSEEK_V3), (drafter, TINY_EAGLE3_DRAFTER)):
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    profile = json.loads(json.dumps(PROFILES[SPEC_PROFILE]))
    profile["model"]["path"], profile["drafter"]["path"] = str(model), str(drafter)
    configs = {}
    for name, backend in (("control", None), ("flex", "flex_attention")):
        options = {"sglang_extra_options": {"attention-backend": backend}} if backend else {}
        configs[name] = directory / f"{name}.yaml"
        configs[name].write_text(render_config(profile, {"sglang_api_key": "", **options}), encoding="utf-8")
    # The control profile with another drafter (and context_length), one config each.
    for name, fixture, context in (("short", "short-constructed", None), ("yarn", "yarn-factor-constructed", None),
                                   ("longer", "deepseek-yarn-constructed", None),
                                   ("short-smaller-context", "short-constructed", 32768)):
        variant = json.loads(json.dumps(profile))
        variant["drafter"]["path"] = str(DRAFTERS / fixture)
        variant["context_length"] = context or variant["context_length"]
        configs[name] = directory / f"{name}.yaml"
        configs[name].write_text(render_config(variant, {"sglang_api_key": ""}), encoding="utf-8")
    host_device = ["--device", "cuda"]
    cases = {
        "control-resolved": ["--resolve", str(configs["control"]), *host_device],
        "flex-resolved": ["--resolve", str(configs["flex"]), *host_device],
        "flex-parsed-only": [str(configs["flex"]), *host_device],
        **{f"{name}-drafter": ["--resolve", str(configs[name]), *host_device]
           for name in ("short", "yarn", "longer", "short-smaller-context")},
        "short-drafter-opted-in": ["--resolve", str(configs["short"]), *host_device],
        "short-drafter-parsed-only": [str(configs["short"]), *host_device],
    }
    environments = {"short-drafter-opted-in": {OPT_IN: "1"}}
    results_file = directory / "results.json"
    search_path = json.dumps([str(p) for p in resolve_path()])
    run_json_in_venv(BATCH_CODE, str(results_file), search_path, str(CHECK_SCRIPT.parent), json.dumps(cases),
                     json.dumps(environments), timeout=600)
    output = json.loads(results_file.read_text(encoding="utf-8"))
    for case in output.values():
        case["configs"] = {name: yaml.safe_load(path.read_text()) for name, path in configs.items()}
    return output


def differing_keys(configs: dict[str, dict[str, Any]], name: str) -> set[str]:
    control, other = configs["control"], configs[name]
    return {k for k in control.keys() | other.keys() if control.get(k) != other.get(k)}


def test_the_two_configs_differ_in_one_key(checked: dict[str, dict[str, Any]]):
    configs = checked["control-resolved"]["configs"]
    assert differing_keys(configs, "flex") == {"attention-backend"}
    assert configs["control"]["attention-backend"] == "triton"
    assert differing_keys(configs, "short") == {"speculative-draft-model-path"}
    assert differing_keys(configs, "short-smaller-context") == {"speculative-draft-model-path", "context-length"}


def test_parser_alone_accepts_what_resolution_rejects(checked: dict[str, dict[str, Any]]):
    parsed = checked["flex-parsed-only"]
    assert parsed["rc"] == 0, parsed["stderr"][-2000:]
    assert json.loads(parsed["stdout"])["resolved"] is False


def test_resolution_rejects_with_sglangs_own_message(checked: dict[str, dict[str, Any]]):
    rejected = checked["flex-resolved"]
    assert rejected["rc"] == 2, rejected
    assert FLEX_MESSAGE in rejected["stderr"]
    version = pinned_sglang_lock()["version"]
    assert f"REJECTED by sglang {version}'s resolution (ServerArgs.resolve_once)" in rejected["stderr"]
    assert rejected["stdout"] == ""


def test_control_config_resolves(checked: dict[str, dict[str, Any]]):
    control = checked["control-resolved"]
    assert control["rc"] == 0, control["stderr"][-3000:]
    resolved = json.loads(control["stdout"])
    assert resolved["resolved"] is True
    assert resolved["attention_backend"] == "triton"
    assert resolved["speculative_algorithm"] == "EAGLE3"
    assert resolved["tp_size"] == PROFILES[SPEC_PROFILE]["tensor_parallel_size"]
    assert Path(resolved["model_path"]).name == "tiny-deepseek-v3"


def draft_context(result: dict[str, Any]) -> dict[str, Any]:
    assert result["rc"] == 0, result["stderr"][-3000:]
    return json.loads(result["stdout"])["draft_context"]


@pytest.mark.parametrize("case", ["short-drafter", "yarn-drafter"])
def test_a_drafter_shorter_than_the_profile_is_refused_before_the_switch(checked: dict[str, dict[str, Any]], case):
    """Resolution accepts it (the parse-only run too); SGLang's own draft ModelConfig refuses it. The YaRN drafter's
    factor 4 would reach 131072, but SGLang derives 32768 from it (tests/fixtures/eagle3-drafters/README.md)."""
    rejected = checked[case]
    assert rejected["rc"] == 2, rejected
    stderr = " ".join(rejected["stderr"].split())
    assert "Target model's context_length (131072) is greater than the derived context_length (32768)" in stderr
    assert "derives a context of 32768 tokens, shorter than the target's 131072" in stderr
    assert "set the profile's context_length to 32768 or less" in stderr
    assert "set sglang_allow_longer_draft_context: true (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in stderr
    version = pinned_sglang_lock()["version"]
    assert f"REJECTED by sglang {version}'s draft model config (ModelConfig._derive_context_length" in stderr
    assert rejected["stdout"] == ""
    assert checked["short-drafter-parsed-only"]["rc"] == 0, "the parser alone never reads the drafter"


def test_a_drafter_as_long_as_the_profile_or_longer_passes(checked: dict[str, dict[str, Any]]):
    assert draft_context(checked["control-resolved"]) == {
        "draft_context_length": 131072, "target_context_length": 131072, "runs_past_its_context": False}
    assert draft_context(checked["longer-drafter"]) == {
        "draft_context_length": 163840, "target_context_length": 131072, "runs_past_its_context": False}
    assert "WARNING" not in checked["control-resolved"]["stderr"] + checked["longer-drafter"]["stderr"]


def test_the_two_ways_out_pass(checked: dict[str, dict[str, Any]]):
    """A context_length the drafter reaches; or the opt-in variable, with a warning naming both lengths."""
    assert draft_context(checked["short-smaller-context-drafter"]) == {
        "draft_context_length": 32768, "target_context_length": 32768, "runs_past_its_context": False}
    opted_in = checked["short-drafter-opted-in"]
    assert draft_context(opted_in) == {
        "draft_context_length": 32768, "target_context_length": 131072, "runs_past_its_context": True}
    warning = [line for line in opted_in["stderr"].splitlines() if line.startswith("WARNING: ")]
    assert len(warning) == 1, opted_in["stderr"][-2000:]
    assert "derives a context of 32768 tokens, shorter than the target's 131072" in warning[0]
    assert f"{OPT_IN}=1 (sglang_allow_longer_draft_context) lets SGLang run it at 131072" in warning[0]
