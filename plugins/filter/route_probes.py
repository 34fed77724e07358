"""The no-key probe of every POST route: the requests from the engine's route table, and the routes that let one by."""

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


def routes_not_refused(results: dict[str, dict[str, Any]]) -> list[str]:
    """'<path> answered HTTP <status>' for every probe not refused with 401 or 403 (-1: no answer)."""
    return [f"{path} answered HTTP {answer.get('status')}" for path, answer in sorted(results.items())
            if answer.get("status") not in (401, 403)]


class FilterModule:
    def filters(self) -> dict:
        return {"unauthenticated_route_probes": unauthenticated_route_probes, "routes_not_refused": routes_not_refused}
