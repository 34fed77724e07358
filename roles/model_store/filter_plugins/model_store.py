"""model_store_entries: the model and drafter directories of the requested profiles, one entry each.
Unit-tested in tests/unit/test_model_store_filters.py against the Jinja loop it replaced."""

from __future__ import annotations

from typing import Any

KINDS = ("model", "drafter")


def model_store_entries(profiles: dict[str, dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    """[{profile, kind, path, source}] for the model and (when the profile has one) the drafter of each profile of
    `names`, in that order; a missing source is {}."""
    entries = []
    for name in names:
        for kind in KINDS:
            spec = profiles[name][kind]
            if spec is not None:
                entries.append({"profile": name, "kind": kind, "path": spec["path"], "source": spec["source"] or {}})
    return entries


class FilterModule:
    def filters(self) -> dict:
        return {"model_store_entries": model_store_entries}
