"""Build the engine benchmark client's arguments from the `bench:` recipe of the engine's lock file.

The lock (roles/<engine>/locks/<engine>-<version>.yml) is the one list of the client's flags; verify only
supplies values. The argument list is `argv`, then the `workloads` entry of the level's workload, then, for
each `options` setting that has a value (not None), each of its flags followed by the value, then the flags of
each `switches` setting that is true. A setting the recipe names but verify does not supply is an error, so a
lock that grows an option the role does not know fails loudly instead of being dropped.
"""

from __future__ import annotations

import json
from typing import Any


def _text(value: Any) -> str:
    if isinstance(value, bool):
        raise ValueError(f"a boolean {value!r} is no option value (booleans go in `switches`)")
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def bench_argv(recipe: dict, workload: str, settings: dict) -> list[str]:
    """The client's arguments (after `python -m <module>`) for one run of `workload` with these settings."""
    for key in ("argv", "workloads", "options", "switches"):
        if key not in recipe:
            raise ValueError(f"the lock's bench recipe lacks {key!r}")
    if workload not in recipe["workloads"]:
        raise ValueError(f"the lock's bench recipe has no workload {workload!r} "
                         f"(it has {', '.join(sorted(recipe['workloads']))})")
    unknown = sorted((set(recipe["options"]) | set(recipe["switches"] or {})) - set(settings))
    if unknown:
        raise ValueError(f"the lock's bench recipe names settings verify does not supply: {', '.join(unknown)}")
    args = [str(word) for word in recipe["argv"]] + [str(word) for word in recipe["workloads"][workload]]
    for setting, flags in recipe["options"].items():
        value = settings[setting]
        if value is None:
            continue
        for flag in flags:
            args += [flag, _text(value)]
    for setting, flags in (recipe["switches"] or {}).items():
        if settings[setting]:
            args += list(flags)
    return args


def bench_output_path(recipe: dict, settings: dict) -> str:
    """Where the client writes its result for these settings: the file the recipe's options name."""
    if "output_file" in recipe["options"]:
        return str(settings["output_file"])
    return f"{settings['result_dir']}/{settings['result_filename']}"


class FilterModule:
    def filters(self) -> dict:
        return {"bench_argv": bench_argv, "bench_output_path": bench_output_path}
