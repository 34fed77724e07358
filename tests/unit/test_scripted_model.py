"""The scripted model under the real front ends (tests/scripted_engine/script.py) and the tiny model it serves."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "scripted_engine"))
sys.path.insert(0, str(REPO / "tests" / "sandbox"))
import make_tiny_model  # noqa: E402
import script  # noqa: E402

KIMI_PROMPT = "<|im_user|>user<|im_middle|>What is 123 + 456? Reply with the number only.<|im_end|>" \
              "<|im_assistant|>assistant<|im_middle|>"


def test_thinking_off_answers_at_once():
    reply = script.Script().reply(KIMI_PROMPT + "<think></think>", 128)
    assert reply == script.Reply("The answer is 579.")


def test_thinking_on_reasons_then_closes_the_think_block_then_answers():
    reply = script.Script().reply(KIMI_PROMPT + "<think>", 128)
    reasoning, _, answer = reply.text.partition("</think>")
    assert "579" in reasoning and answer == "The answer is 579." and not reply.endless


def test_the_last_question_of_a_conversation_is_answered():
    prompt = "What is 1 + 1? 2. What is 20 * 3?<think></think>"
    assert script.Script().reply(prompt, 64).text == "The answer is 60."


def test_without_a_question_it_generates_until_max_tokens_as_the_benchmark_expects():
    assert script.Script().reply("Tell me a story", 5) == script.Reply("ok ok ok ok ok", endless=True)


def test_garbage_output_never_ends():
    assert script.Script(fault="garbage-output").reply(KIMI_PROMPT + "<think></think>", 3) == \
        script.Reply("foss foss foss", endless=True)


def test_unknown_fault_and_bad_numbers_fail_naming_the_input():
    with pytest.raises(SystemExit, match="unknown SCRIPTED_ENGINE_FAULT 'hnag'"):
        script.Script.from_env(env={"SCRIPTED_ENGINE_FAULT": "hnag"})
    with pytest.raises(SystemExit, match="SCRIPTED_ENGINE_TOKENS_PER_S='fast' is not a number"):
        script.Script.from_env(env={"SCRIPTED_ENGINE_TOKENS_PER_S": "fast"})


def test_speculative_steps_yield_one_plus_accepted_tokens_at_the_verify_cost():
    spec = script.Script(speculative_steps=3, accept_rate=1.0, tokens_per_s=100, spec_cost=1.5)
    assert spec.step() == (4, 3, pytest.approx(0.015))
    plain = script.Script(tokens_per_s=100)
    assert plain.step() == (1, 0, pytest.approx(0.01))


def test_crash_at_start_exits_before_ready():
    with pytest.raises(SystemExit) as exited:
        script.Script(fault="crash-at-start").on_start(log=lambda message: None)
    assert exited.value.code == 1


def test_tiny_model_has_a_kimi_style_tokenizer_and_llama_configs(tmp_path):
    assert make_tiny_model.main([str(tmp_path / "m"), "--drafter", str(tmp_path / "d")]) == 0
    model = json.loads((tmp_path / "m" / "config.json").read_text())
    drafter = json.loads((tmp_path / "d" / "config.json").read_text())
    assert model["architectures"] == ["LlamaForCausalLM"] and drafter["architectures"] == ["LlamaForCausalLMEagle3"]
    tokenizer = json.loads((tmp_path / "m" / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    assert len(set(vocab.values())) == len(vocab) == model["vocab_size"]
    added = {token["content"]: token["special"] for token in tokenizer["added_tokens"]}
    assert added["<|im_end|>"] and added["[UNK]"]
    assert added["<think>"] is added["</think>"] is False, "Kimi's reasoning markers are not special tokens"
    template = json.loads((tmp_path / "m" / "tokenizer_config.json").read_text())["chat_template"]
    assert "thinking is defined and thinking is false" in template and "<think></think>" in template
    assert (tmp_path / "m" / "model.safetensors.index.json").is_file()


def test_tiny_model_refuses_unknown_options(tmp_path, capsys):
    assert make_tiny_model.main(["--drafer", str(tmp_path)]) == 2
    assert "unknown option --drafer" in capsys.readouterr().err


def test_deadlock_lets_the_first_generations_through_then_blocks():
    import threading

    script_ = script.Script(fault="deadlock-on-generate", deadlock_after=1)
    script_.before_generate()  # the warm-up passes
    blocked = threading.Thread(target=script_.before_generate, daemon=True)
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive()


def read_bytes() -> int:
    with open("/proc/self/io", encoding="ascii") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("read_bytes:"))


class FakeTime:
    """The scripted model's clock: monotonic() is fake time, which only sleep() moves on (and records)."""

    def __init__(self) -> None:
        self.now, self.sleeps = 1000.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_slow_load_reads_from_the_disk_for_its_time_and_logs_nothing(tmp_path, monkeypatch):
    """Its only sign of progress is the bytes it reads: each read reaches the block layer (the page cache is
    dropped first), where the kernel counts them for the process (/proc/<pid>/io) and its cgroup (io.stat).
    The load lasts SCRIPTED_ENGINE_LOAD_S of the script's clock (fake time here): a read, then a pause, until then."""
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"\x01" * (256 << 10))
    with open(weights, "rb") as handle:
        os.fsync(handle.fileno())  # written pages are dirty: clean ones can be dropped from the cache
    clock = FakeTime()
    monkeypatch.setattr(script, "time", clock)
    logged: list[str] = []
    before = read_bytes()
    engine = script.Script.from_env(env={"SCRIPTED_ENGINE_FAULT": "slow-load", "SCRIPTED_ENGINE_LOAD_S": "0.9",
                                         "SCRIPTED_ENGINE_LOAD_FILE": str(weights)})
    engine.on_start(log=logged.append)
    # reads at 0, 0.2, 0.4, 0.6 and 0.8 s of the load, each followed by its pause; at 1.0 s the load is over
    assert clock.sleeps == [script.LOAD_PAUSE_S] * 5 and clock.now - 1000.0 >= 0.9, clock.sleeps
    assert logged == []
    assert read_bytes() - before >= 3 * (256 << 10), "the reads did not reach the disk"
