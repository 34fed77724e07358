"""The model store's list building: the directories of the requested profiles (model_store_entries) and the
transfers of their plans (model_store_batches). Unit-tested in tests/unit/plugins/filter/test_model_store_filters.py
against the Jinja loops they replaced."""

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


def model_store_batches(plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The transfers of each plan (model_fetch results with `batches`), flattened in order:
    [{plan (index of the plan), dest, paths, label}]."""
    return [{"plan": index, "dest": plan["dest"], "paths": batch["paths"], "label": batch["label"]}
            for index, plan in enumerate(plans) for batch in plan["batches"]]


class FilterModule:
    def filters(self) -> dict:
        return {"model_store_entries": model_store_entries, "model_store_batches": model_store_batches}
