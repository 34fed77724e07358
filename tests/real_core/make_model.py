"""Write the REAL-CORE TEST MODEL: a tiny Llama with random float32 weights, and an EAGLE-3 drafter for it.

A model the real vLLM core (tests/real_core/real_core_venv.py) loads and computes with on a CPU, made on the spot:
- the target: `LlamaForCausalLM`, 8 layers (EAGLE-3 taps the target's layers 2, 4 and 5: vLLM's default aux
  layers for 8), hidden 64, 2 heads of 32 (vLLM's CPU attention has no head size below 32:
  vllm/v1/attention/backends/cpu_attn.py get_supported_head_sizes), float32 (a bf16 model killed the CPU worker on
  its first request); the tokenizer and Kimi-style chat template of tests/sandbox/make_tiny_model.py, so the
  engine's kimi_k2 reasoning parser runs as it does for Kimi;
- the drafter: `LlamaForCausalLMEagle3`, one layer, its tensors under the names of EAGLE-3 checkpoints, which vLLM
  maps in (vllm/model_executor/models/llama_eagle3.py: `midlayer.` -> `layers.0.`, `fc`, `norm`, `lm_head`; no
  embed_tokens, so it shares the target's). Its own weights, so the target keeps its own (with --load-format dummy
  both would be random anew at each start).
Random weights: the text is noise, and a drafter that was never trained is rarely accepted; the engine still runs
every step of a real generation: prefill, the KV cache, sampling, drafting and verification, with its own counters.
Seeded: the same files each time. Runs with the real-core venv's python (torch, safetensors, transformers).

    make_model.py TARGET_DIR DRAFTER_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))
import make_tiny_model as tiny  # (the tokenizer and chat template)

HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE, LAYERS = 64, 2, 32, 128, 8
SEED = 20261207


def config(drafter: bool) -> dict:
    base = tiny.llama_config(drafter)
    base.update(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=HEAD_DIM,
                intermediate_size=INTERMEDIATE, num_hidden_layers=1 if drafter else LAYERS, torch_dtype="float32",
                max_position_embeddings=2048)
    if drafter:
        base["target_hidden_size"] = HIDDEN
    return base


def randn(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, dtype=torch.float32) * 0.2


def llama_layer(generator: torch.Generator, prefix: str, attention_input: int) -> dict[str, torch.Tensor]:
    q, kv = HEADS * HEAD_DIM, HEADS * HEAD_DIM
    return {
        f"{prefix}input_layernorm.weight": torch.ones(HIDDEN),
        f"{prefix}post_attention_layernorm.weight": torch.ones(HIDDEN),
        f"{prefix}self_attn.q_proj.weight": randn(generator, q, attention_input),
        f"{prefix}self_attn.k_proj.weight": randn(generator, kv, attention_input),
        f"{prefix}self_attn.v_proj.weight": randn(generator, kv, attention_input),
        f"{prefix}self_attn.o_proj.weight": randn(generator, HIDDEN, q),
        f"{prefix}mlp.gate_proj.weight": randn(generator, INTERMEDIATE, HIDDEN),
        f"{prefix}mlp.up_proj.weight": randn(generator, INTERMEDIATE, HIDDEN),
        f"{prefix}mlp.down_proj.weight": randn(generator, HIDDEN, INTERMEDIATE),
    }


def target_tensors(generator: torch.Generator, vocab: int) -> dict[str, torch.Tensor]:
    tensors = {"model.embed_tokens.weight": randn(generator, vocab, HIDDEN) * 5,
               "model.norm.weight": torch.ones(HIDDEN), "lm_head.weight": randn(generator, vocab, HIDDEN)}
    for layer in range(LAYERS):
        tensors.update(llama_layer(generator, f"model.layers.{layer}.", HIDDEN))
    return tensors


def drafter_tensors(generator: torch.Generator, vocab: int) -> dict[str, torch.Tensor]:
    # EAGLE-3's one layer attends over [input embedding, fused hidden state]: twice the hidden size.
    tensors = llama_layer(generator, "midlayer.", 2 * HIDDEN)
    tensors.update({"midlayer.hidden_norm.weight": torch.ones(HIDDEN),
                    "fc.weight": randn(generator, HIDDEN, 3 * HIDDEN), "norm.weight": torch.ones(HIDDEN),
                    "lm_head.weight": randn(generator, vocab, HIDDEN)})
    return tensors


def write(directory: Path, drafter: bool, tensors: dict[str, torch.Tensor]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config(drafter), indent=2) + "\n")
    tiny.write_tokenizer(directory)


def make(target: Path, drafter: Path) -> None:
    vocab = len(tiny.vocabulary())
    generator = torch.Generator().manual_seed(SEED)
    write(target, False, target_tensors(generator, vocab))
    write(drafter, True, drafter_tensors(generator, vocab))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: make_model.py TARGET_DIR DRAFTER_DIR", file=sys.stderr)
        return 2
    make(Path(argv[0]), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
