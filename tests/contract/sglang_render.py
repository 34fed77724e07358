"""Render the SGLang YAML config (`sglang serve --config FILE`) from a model profile and the role defaults.

A Python mirror of what the sglang role does (roles/sglang/tasks/main.yml "Compute the SGLang flags of the
profile" + templates/sglang-config.yaml.j2), so the contract tests can feed SGLang's real parser without
running Ansible. Input = one profile of `engine_profiles` (inventory group_vars/all/models.yml) + the role's
defaults (roles/sglang/defaults/main.yml, overridable per call); output = the YAML text: one
`flag-name: <JSON value>` line per option, keys sorted, spelled like the flags without the leading dashes
(SGLang's config merger turns each key into `--<key>` verbatim). Replace it by rendering the role's own
template when the tests can run the role's flag computation.

Keys, from (later sources override earlier ones, as the role's `combine` does):
    model-path                    profile.model.path
    tokenizer-path                profile.tokenizer, else profile.model.path
    served-model-name             profile.served_model_name
    tp-size                       profile.tensor_parallel_size (required by the profile schema)
    dp-size, attn-dp-size, ep-size  profile.data_parallel_size, attention_data_parallel_size, expert_parallel_size (1)
    host                          defaults.sglang_listen_address
    port                          profile.port (required by the profile schema)
    context-length                profile.context_length
    quantization                  profile.quantization
    trust-remote-code             profile.trust_remote_code
    speculative-algorithm         profile.speculative.algorithm       } only when profile.speculative is set
    speculative-draft-model-path  profile.drafter.path                }
    speculative-num-steps         profile.speculative.num_steps       }
    speculative-eagle-topk        profile.speculative.eagle_topk      }
    speculative-num-draft-tokens  profile.speculative.num_draft_tokens}
    speculative-draft-model-quantization  unquant when profile.quantization is set (with speculation)
    <defaults.sglang_default_options>, then <profile.sglang_options>, then <defaults.sglang_extra_options>
    api-key                       defaults.sglang_api_key, when non-empty
A key whose value is null or false is left out (false drops a switch, as in the role).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

ROLE_DEFAULTS_FILE = Path(__file__).resolve().parents[2] / "roles" / "sglang" / "defaults" / "main.yml"
USED_DEFAULTS = ("sglang_listen_address", "sglang_api_key", "sglang_default_options", "sglang_extra_options")


class RenderError(ValueError):
    """The profile cannot be rendered into an SGLang config."""


def role_defaults() -> dict[str, Any]:
    """The sglang role's defaults this renderer uses, read from the role."""
    defaults = yaml.safe_load(ROLE_DEFAULTS_FILE.read_text(encoding="utf-8")) or {}
    missing = [name for name in USED_DEFAULTS if name not in defaults]
    if missing:
        raise RenderError(f"{ROLE_DEFAULTS_FILE}: missing {missing}")
    return {name: defaults[name] for name in USED_DEFAULTS}


def render_options(profile: dict[str, Any], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The flag-name -> value mapping of the config, keys sorted."""
    settings = {**role_defaults(), **(overrides or {})}
    model_path = profile["model"]["path"]
    options: dict[str, Any] = {
        "model-path": model_path,
        "tokenizer-path": profile.get("tokenizer") or model_path,
        "served-model-name": profile["served_model_name"],
        "tp-size": int(profile["tensor_parallel_size"]),
        "dp-size": int(profile.get("data_parallel_size") or 1),
        "attn-dp-size": int(profile.get("attention_data_parallel_size") or 1),
        "ep-size": int(profile.get("expert_parallel_size") or 1),
        "host": settings["sglang_listen_address"],
        "port": int(profile["port"]),
        "context-length": profile.get("context_length"),
        "quantization": profile.get("quantization"),
        "trust-remote-code": bool(profile.get("trust_remote_code")),
    }
    speculative = profile.get("speculative")
    if speculative:
        if not profile.get("drafter"):
            raise RenderError("profile.speculative is set but profile.drafter is null: name the draft model")
        options |= {
            "speculative-algorithm": speculative["algorithm"],
            "speculative-draft-model-path": profile["drafter"]["path"],
            "speculative-num-steps": int(speculative["num_steps"]),
            "speculative-eagle-topk": int(speculative["eagle_topk"]),
            "speculative-num-draft-tokens": int(speculative["num_draft_tokens"]),
            "speculative-draft-model-quantization": "unquant" if profile.get("quantization") else None,
        }
    options |= settings["sglang_default_options"] or {}
    options |= profile.get("sglang_options") or {}
    options |= settings["sglang_extra_options"] or {}
    if settings["sglang_api_key"]:
        options["api-key"] = settings["sglang_api_key"]
    # Identity, not equality: 0 is a value (node-rank: 0), only None and False drop a key.
    return {key: value for key, value in sorted(options.items()) if value is not None and value is not False}


def render_config(profile: dict[str, Any], overrides: dict[str, Any] | None = None) -> str:
    """The YAML text of the config: one `key: <JSON value>` line per option (JSON scalars are YAML)."""
    lines = ["# `sglang serve --config` file. Keys are the flags' full names without the leading dashes."]
    lines += [f"{key}: {json.dumps(value)}" for key, value in render_options(profile, overrides).items()]
    return "\n".join(lines) + "\n"
