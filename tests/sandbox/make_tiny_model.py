#!/usr/bin/env python3
"""Write a tiny, well-formed model directory (config.json, safetensors shards and their index, a tokenizer).

Used to give sandbox and test hosts weights that the real completeness check accepts, and a model the real
SGLang and vLLM front ends start on (tests/scripted_engine/): a 2-layer llama `config.json` (an EAGLE-3
drafter's with --drafter), and a word-level tokenizer with a Kimi-K2.5-style chat template: Kimi's turn
markers, and the `thinking` switch that leaves the generation prompt open on `<think>` (the model thinks) or
closes it with `<think></think>` (it answers at once), so that the engines' real `kimi_k2` reasoning parsers
route text as they do for Kimi. Stdlib only; it runs on the test host with the distribution's python3.
Not a model: the tensors are zeros, and nothing computes with them.

    make_tiny_model.py MODEL_DIR [--drafter DRAFTER_DIR] [MORE_MODEL_DIRS...]
"""

import json
import struct
import sys
from pathlib import Path


def write_shard(path: Path, tensors: dict[str, int]) -> dict[str, str]:
    """Write a safetensors file with float32 zero tensors of the given element counts."""
    header, offset = {}, 0
    for name, count in tensors.items():
        header[name] = {"dtype": "F32", "shape": [count], "data_offsets": [offset, offset + 4 * count]}
        offset += 4 * count
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))
    return {name: path.name for name in tensors}


def write_weights(directory: Path, shards: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for index in range(1, shards + 1):
        shard = directory / f"model-{index:05d}-of-{shards:05d}.safetensors"
        weight_map.update(write_shard(shard, {f"layers.{index}.weight": 256 * index}))
        total += 4 * 256 * index
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")

def make_model(directory: Path, shards: int = 2, drafter: bool = False) -> None:
    write_weights(directory, shards)
    write_json(directory / "config.json", llama_config(drafter))
    write_tokenizer(directory)


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# Added tokens of Kimi-K2.5's tokenizer that its chat template and the engines' kimi_k2 parsers use. The turn
# markers are special (a detokenizer skips them); the reasoning and tool-call markers are not, as in Kimi's: SGLang
# 0.5.23 detokenizes Kimi's output with skip_special_tokens (srt/entrypoints/openai/serving_chat.py
# `_patch_reasoning_skip_special_tokens`), and its KimiK2Detector must still see `</think>` in the text.
SPECIAL = ["[UNK]", "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
           "<|im_middle|>"]
MARKERS = ["<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
           "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"]
WORDS = ["system", "user", "assistant", "What", "is", "The", "answer", "asks", "for", "It", "ok", "foss", "Hello",
         "Answer", "Reply", "with", "a", "number", "only", "the", "of", "and", "you", "I", "to", "in", "it", "that",
         "this"]
PUNCTUATION = list(".,?!:;+-*/=()[]{}'\"")
DIGITS = [str(digit) for digit in range(10)]
METASPACE = "\u2581"
# Kimi-K2.5's template, reduced to text turns: the generation prompt ends in `<think>` unless the request's
# chat_template_kwargs say `thinking: false`, then in `<think></think>`.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- else -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}{%- if part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}")


def vocabulary() -> dict[str, int]:
    tokens = SPECIAL + MARKERS + [METASPACE] + DIGITS + PUNCTUATION + WORDS + [METASPACE + word for word in WORDS]
    return {token: index for index, token in enumerate(tokens)}


def llama_config(drafter: bool) -> dict[str, object]:
    vocab = vocabulary()
    config: dict[str, object] = {
        "architectures": ["LlamaForCausalLMEagle3" if drafter else "LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 1 if drafter else 2, "head_dim": 16, "vocab_size": len(vocab),
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "torch_dtype": "bfloat16", "tie_word_embeddings": False,
        "bos_token_id": vocab["[BOS]"], "eos_token_id": vocab["<|im_end|>"], "pad_token_id": vocab["[UNK]"]}
    if drafter:
        config["draft_vocab_size"] = len(vocab)
    return config


def write_tokenizer(directory: Path) -> None:
    vocab = vocabulary()
    metaspace = {"type": "Metaspace", "replacement": METASPACE, "prepend_scheme": "always", "split": True}
    write_json(directory / "tokenizer.json", {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": vocab[token], "content": token, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": token in SPECIAL}
                         for token in SPECIAL + MARKERS],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            metaspace, {"type": "Punctuation", "behavior": "Isolated"},
            {"type": "Digits", "individual_digits": True}]},
        "post_processor": None,
        "decoder": metaspace,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}})
    write_json(directory / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192, "bos_token": "[BOS]",
        "eos_token": "<|im_end|>", "unk_token": "[UNK]", "pad_token": "[UNK]", "add_bos_token": False,
        "add_eos_token": False, "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE})
    write_json(directory / "generation_config.json", {
        "bos_token_id": vocab["[BOS]"], "eos_token_id": [vocab["<|im_end|>"], vocab["[EOS]"]]})


def main(argv: list[str]) -> int:
    models, drafters = [], []
    arguments = iter(argv)
    for argument in arguments:
        if argument == "--drafter":
            drafters.append(next(arguments, ""))
        elif argument.startswith("-"):
            print(f"usage: make_tiny_model.py MODEL_DIR [--drafter DRAFTER_DIR] ... (unknown option {argument})",
                  file=sys.stderr)
            return 2
        else:
            models.append(argument)
    if not models + drafters or "" in drafters:
        print("usage: make_tiny_model.py MODEL_DIR [--drafter DRAFTER_DIR] ...", file=sys.stderr)
        return 2
    for target in models:
        make_model(Path(target))
    for target in drafters:
        make_model(Path(target), drafter=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
