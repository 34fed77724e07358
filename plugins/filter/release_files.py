"""release_file_specs: the engine roles' engine_service_files entries as engine_release file specs."""

from __future__ import annotations

from typing import Any


def release_file_specs(files: list[dict[str, Any]], secret: bool) -> list[dict[str, str]]:
    """The entries whose `secret` flag equals `secret` (absent = false), as {name, content}: configuration files
    are root:<service group> 0640, the module's defaults."""
    return [{"name": entry["name"], "content": entry["content"]}
            for entry in files if _truthy(entry.get("secret", False)) == secret]


def _truthy(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "yes", "on", "1")


class FilterModule:
    def filters(self) -> dict:
        return {"release_file_specs": release_file_specs}
