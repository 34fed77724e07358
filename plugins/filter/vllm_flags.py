"""Turn one `{key, value}` item of a vLLM flag mapping into argv words."""

from __future__ import annotations


def vllm_flag_words(item: dict) -> list[str]:
    key, value = item["key"], item["value"]
    if key.startswith("-"):
        raise ValueError(f"vLLM option {key!r}: give the flag's full name without leading dashes")
    if value is True:
        return [f"--{key}"]
    if isinstance(value, (list, tuple)):
        return [f"--{key}", *(str(v) for v in value)]
    return [f"--{key}", str(value)]


class FilterModule:
    def filters(self) -> dict:
        return {"vllm_flag_words": vllm_flag_words}
