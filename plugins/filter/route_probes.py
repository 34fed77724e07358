"""The no-key probe of every POST route: the requests from the engine's route table, and the routes that let one by.
With an API key every POST route of the table is asked, with the engine's known generating and admin routes; without
one, only the admin routes (the others serve without a key by design), those of the table when the engine serves one."""

from __future__ import annotations

from typing import Any

# A bare JSON string: no route's request model accepts it, so a route that lets the probe through answers 4xx
# instead of generating.
PROBE_BODY = "verify: a request without the API key"


def post_paths(route_table: dict[str, Any], open_routes: list[str], known: list[str]) -> list[str]:
    """The POST paths of an /openapi.json answer (engine_requests' form), less templated and open ones, with the
    engine's known generating routes: a route outside the schema (include_in_schema=False) is still asked."""
    paths = (route_table.get("json") or {}).get("paths") if route_table.get("status") == 200 else None
    table = [path for path, methods in (paths.items() if isinstance(paths, dict) else [])
             if isinstance(methods, dict) and "post" in methods and "{" not in path and path not in open_routes]
    return sorted(set(table) | set(known))


def unauthenticated_route_probes(route_table: dict[str, Any], open_routes: list[str], known: list[str],
                                 timeout_s: int) -> list[dict[str, Any]]:
    return [{"name": path, "path": path, "method": "POST", "auth": False, "body": PROBE_BODY, "timeout": timeout_s}
            for path in post_paths(route_table, open_routes, known)]


def _table_post_paths(route_table: dict[str, Any]) -> set[str] | None:
    paths = (route_table.get("json") or {}).get("paths") if route_table.get("status") == 200 else None
    if not isinstance(paths, dict):
        return None
    return {path for path, methods in paths.items() if isinstance(methods, dict) and "post" in methods}


def admin_route_probes(route_table: dict[str, Any], admin_routes: list[str], timeout_s: int) -> list[dict[str, Any]]:
    """The admin routes asked without any key: those the engine's route table lists (an engine serves only some of
    them, a double fewer), or every one where it serves no table."""
    table = _table_post_paths(route_table)
    paths = sorted(path for path in set(admin_routes) if table is None or path in table)
    return [{"name": path, "path": path, "method": "POST", "auth": False, "body": PROBE_BODY, "timeout": timeout_s}
            for path in paths]


def routes_not_refused(results: dict[str, dict[str, Any]]) -> list[str]:
    """'<path> answered HTTP <status>' for every probe not refused with 401 or 403 (-1: no answer)."""
    return [f"{path} answered HTTP {answer.get('status')}" for path, answer in sorted(results.items())
            if answer.get("status") not in (401, 403)]


class FilterModule:
    def filters(self) -> dict:
        return {"unauthenticated_route_probes": unauthenticated_route_probes, "admin_route_probes": admin_route_probes,
                "routes_not_refused": routes_not_refused}
