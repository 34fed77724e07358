"""release_file_specs: the engine roles' engine_service_files entries as engine_release file specs."""

from __future__ import annotations

from typing import Any

# What an entry may set besides name and content; unset, the module's defaults: root:<service group> 0640.
_PASSED = ("owner", "group", "mode")


def release_file_specs(files: list[dict[str, Any]], secret: bool) -> list[dict[str, str]]:
    """The entries whose `secret` flag equals `secret` (absent = false), as {name, content} plus the owner, group
    and mode an entry gives (a credential only systemd reads: root:root 0600)."""
    return [{"name": entry["name"], "content": entry["content"],
             **{key: str(entry[key]) for key in _PASSED if entry.get(key) not in (None, "")}}
            for entry in files if _truthy(entry.get("secret", False)) == secret]


def _truthy(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "yes", "on", "1")


class FilterModule:
    def filters(self) -> dict:
        return {"release_file_specs": release_file_specs}
