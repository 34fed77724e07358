"""verify's reading of a smoke reply (plugins/filter/smoke_answer.py), the same for the greedy and the
sampled request: where the expected number is, and whether the reply counts as an answer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
_spec = importlib.util.spec_from_file_location("smoke_answer", REPO / "plugins/filter/smoke_answer.py")
smoke_answer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(smoke_answer)


def reply(message: dict, completion_tokens: object = 5, status: int = 200, finish_reason: str = "stop") -> dict:
    return {"status": status, "json": {"choices": [{"message": message, "finish_reason": finish_reason}],
                                       "usage": {"completion_tokens": completion_tokens}}}


def test_the_answer_in_content_counts() -> None:
    answer = smoke_answer.smoke_answer(reply({"content": "The answer is 1,168."}), "1168", "reasoning_content")
    assert answer["found"] == "content" and answer["answered"] is True
    assert answer["reasoning_field"] == "reasoning_content" and answer["completion_tokens"] == 5


def test_a_number_that_only_contains_the_answer_does_not_count() -> None:
    answer = smoke_answer.smoke_answer(reply({"content": "11168 or 11680"}), 1168, "reasoning")
    assert answer["found"] == "" and answer["answered"] is False


def test_the_answer_in_the_engines_reasoning_field_counts_and_is_named() -> None:
    vllm = smoke_answer.smoke_answer(reply({"content": None, "reasoning": "so it is 579"}), 579, "reasoning")
    assert vllm["found"] == "reasoning" and vllm["answered"] is True and vllm["content"] == ""
    sglang = smoke_answer.smoke_answer(reply({"content": "", "reasoning_content": "579"}), 579, "reasoning_content")
    assert sglang["found"] == "reasoning_content"


def test_a_reply_without_completion_tokens_is_not_an_answer() -> None:
    for tokens in (0, None, "5"):
        answer = smoke_answer.smoke_answer(reply({"content": "579"}, completion_tokens=tokens), 579, "reasoning")
        assert answer["answered"] is False, tokens


def test_an_error_or_a_timeout_is_not_an_answer_and_a_timeout_is_named() -> None:
    refused = smoke_answer.smoke_answer({"status": 500, "msg": "HTTP Error 500", "json": {"detail": "x"}}, 579,
                                        "reasoning")
    assert refused["answered"] is False and refused["timed_out"] is False and refused["finish_reason"] == ""
    stuck = smoke_answer.smoke_answer({"status": -1, "msg": "Request failed: timed out", "elapsed_s": 40.012}, 579,
                                      "sglang")
    assert stuck["timed_out"] is True and stuck["answered"] is False and stuck["completion_tokens"] is None
    assert stuck["elapsed_s"] == 40.012 and refused["elapsed_s"] is None


def test_a_request_never_sent_is_neither_answered_nor_timed_out() -> None:
    """The sampled request is not sent when the greedy one failed first (engine_requests stops the sequence)."""
    absent = smoke_answer.smoke_answer({}, 579, "reasoning_content")
    assert absent["answered"] is False and absent["timed_out"] is False and absent["status"] == -1


def test_with_the_generates_check_any_generated_reply_answers_and_the_number_is_still_looked_for() -> None:
    """verify_smoke_check: generates (a checkpoint that cannot follow the instruction): HTTP 200 with tokens is an
    answer; where the number is is still reported, and nothing else about the reply changes."""
    noise = smoke_answer.smoke_answer(reply({"content": "it;asks isAnswer"}), 579, "reasoning", check="generates")
    assert noise["answered"] is True and noise["found"] == "" and noise["check"] == "generates"
    right = smoke_answer.smoke_answer(reply({"content": "579"}), 579, "reasoning", check="generates")
    assert right["found"] == "content"
    assert smoke_answer.smoke_answer(reply({"content": "x"}), 579, "reasoning")["check"] == "sum"


def test_with_the_generates_check_an_error_a_timeout_or_no_tokens_is_still_no_answer() -> None:
    for answer in (smoke_answer.smoke_answer(reply({"content": "x"}, completion_tokens=0), 1, "r", check="generates"),
                   smoke_answer.smoke_answer({"status": 500, "msg": "HTTP Error 500"}, 1, "r", check="generates"),
                   smoke_answer.smoke_answer({"status": -1, "msg": "timed out"}, 1, "r", check="generates")):
        assert answer["answered"] is False, answer


def test_an_unknown_check_is_refused_by_name() -> None:
    try:
        smoke_answer.smoke_answer(reply({"content": "579"}), 579, "reasoning", check="summ")
    except ValueError as refused:
        assert "sum, generates" in str(refused) and "'summ'" in str(refused)
    else:
        raise AssertionError("an unknown check was accepted")
