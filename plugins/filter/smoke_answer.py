"""Where a smoke reply put the expected answer, read the same way for the greedy and the sampled smoke request."""

from __future__ import annotations

import re
from typing import Any

# Where an engine that thought anyway may put its reasoning (the engine roster's reasoning_field names the engine's
# own; a reply carrying another of these is read from that one).
REASONING_FIELDS = ("reasoning_content", "reasoning")


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def contains_number(text: str, number: int) -> bool:
    """The number as a whole number in the text, thousands separators ignored ("1,234" holds 1234; 11234 does not)."""
    return re.search(rf"(^|[^0-9]){number}([^0-9]|$)", text.replace(",", "")) is not None


# What the smoke asks of a reply (verify_smoke_check): "sum", the expected number in it; "generates", only tokens
# (a checkpoint that cannot follow the instruction: a base model, the tests' random-weights model).
CHECKS = ("sum", "generates")


def smoke_answer(reply: dict[str, Any], expected: Any, reasoning_field: str, check: str = "sum") -> dict[str, Any]:
    """The parts of one chat-completion reply (engine_requests' form) that the smoke checks and reports.

    `reasoning_field` is the engine's (the roster's `reasoning_field`). `found` is "content", the reasoning field's
    name, or "" when the expected number is in neither; `answered` is true when the reply is HTTP 200 with at least
    one completion token and, with `check` "sum" (the default), the number found; with "generates" the text is not
    read for the number.
    """
    if check not in CHECKS:
        raise ValueError(f"smoke_answer: check must be one of {', '.join(CHECKS)}, not {check!r}")
    reply = _mapping(reply)
    body = _mapping(reply.get("json"))
    choices = body.get("choices")
    choice = _mapping(choices[0]) if isinstance(choices, list) and choices else {}
    message = _mapping(choice.get("message"))
    reasoning_field = next((field for field in (reasoning_field, *REASONING_FIELDS) if _text(message.get(field))),
                           reasoning_field)
    content, reasoning = _text(message.get("content")), _text(message.get(reasoning_field))
    number = int(expected)
    found = "content" if contains_number(content, number) else (
        reasoning_field if contains_number(reasoning, number) else "")
    usage = _mapping(body.get("usage"))
    completion_tokens = usage.get("completion_tokens")
    completion_tokens = completion_tokens if isinstance(completion_tokens, int) else None
    return {
        "answered": (reply.get("status") == 200 and (bool(found) or check == "generates")
                     and (completion_tokens or 0) > 0),
        "check": check,
        "status": reply.get("status", -1),
        "msg": _text(reply.get("msg")),
        "timed_out": reply.get("status", -1) == -1 and "timed out" in _text(reply.get("msg")),
        "content": content,
        "reasoning_field": reasoning_field,
        "reasoning": reasoning,
        "found": found,
        "completion_tokens": completion_tokens,
        "finish_reason": _text(choice.get("finish_reason")),
        "elapsed_s": reply.get("elapsed_s") if isinstance(reply.get("elapsed_s"), (int, float)) else None,
    }


class FilterModule:
    def filters(self) -> dict:
        return {"smoke_answer": smoke_answer}
