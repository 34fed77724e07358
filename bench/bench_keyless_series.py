#!/usr/bin/env python3
"""Keyless requests under SGLang's open prefixes against its metrics: what the sglang role's guard plugin bounds.

SGLang 0.5.23 lets every path under /health, /ready and /metrics through without a key (srt/utils/auth.py
decide_request_auth) and its HTTP metrics label a path no route matches by its raw text
(srt/observability/http_request_metrics.py): each keyless `GET /health<random>` adds series to /metrics, for the
life of the process. The release's plugin (roles/sglang/files/bws_sglang_guard.py) answers such a path 404 before
SGLang's metrics see it.

This starts SGLang's real front end over the scripted scheduler (tests/scripted_engine/, its test-engine venv, CPU
only) with an API key and an admin key, as the sglang role runs it (the release's logging configuration and plugin),
sends --requests keyless `GET /health<random hex>` over one keep-alive connection, and prints the statuses, the
request rate, the number of series in /metrics (every sample line, and those of sglang:http_*) and the HTTP
server's resident memory (VmRSS of SGLang's main process) before and after. `--alone` runs SGLang without what the
role adds, for comparison (upstream's behaviour: the series grow with every request).

    source scripts/env.sh; python bench/bench_keyless_series.py --requests 20000 [--alone]
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "scripted_engine"))

import engine_venv  # noqa: E402
from front_end import RealFrontEnd  # noqa: E402

API_KEY = "sk-bench-" + secrets.token_hex(8)
ADMIN_KEY = "admin-bench-" + secrets.token_hex(8)


def main_pid(front_end: RealFrontEnd) -> int:
    """SGLang's main process (the HTTP server): the only child of `unshare --fork`."""
    children = Path(f"/proc/{front_end.process.pid}/task/{front_end.process.pid}/children").read_text().split()
    return int(children[0])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def samples(front_end: RealFrontEnd) -> set[str]:
    """The series of /metrics: each sample line's name and labels."""
    status, body = front_end.request("/metrics", key=None)
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    return {line.rsplit(" ", 1)[0] for line in body.decode().splitlines() if line and not line.startswith("#")}


def series(names: set[str]) -> dict[str, int]:
    return {"all": len(names), "sglang:http_*": sum(name.startswith("sglang:http_") for name in names)}


def flood(front_end: RealFrontEnd, count: int) -> tuple[dict[int, int], float]:
    """`count` keyless GET /health<random> over one keep-alive connection; the statuses and the seconds taken."""
    connection = http.client.HTTPConnection("127.0.0.1", front_end.port, timeout=30)
    statuses: collections.Counter[int] = collections.Counter()
    start = time.monotonic()
    for _ in range(count):
        connection.request("GET", "/health" + secrets.token_hex(8))
        response = connection.getresponse()
        response.read()
        statuses[response.status] += 1
    connection.close()
    return dict(statuses), time.monotonic() - start


def measure(workdir: Path, count: int, guarded: bool) -> dict:
    python = engine_venv.build("sglang") / "bin" / "python"
    front_end = RealFrontEnd(python, workdir, "guarded" if guarded else "alone", "sglang", api_key=API_KEY,
                             admin_api_key=ADMIN_KEY, deploy_guards=guarded)
    try:
        started = front_end.wait_ready()
        samples(front_end)  # the first scrape adds /metrics' own series
        pid = main_pid(front_end)
        names_before = samples(front_end)
        before = {"series": series(names_before), "rss_kib": rss_kib(pid)}
        statuses, took = flood(front_end, count)
        time.sleep(1)
        names_after = samples(front_end)
        after = {"series": series(names_after), "rss_kib": rss_kib(pid)}
    finally:
        front_end.stop()
    return {"sglang": "with the sglang role's guard plugin" if guarded else "alone (upstream)",
            "ready_s": round(started, 1), "requests": count, "statuses": statuses, "seconds": round(took, 2),
            "requests_per_s": round(count / took), "before": before, "after": after,
            "new_series": after["series"]["all"] - before["series"]["all"],
            "new_http_series": after["series"]["sglang:http_*"] - before["series"]["sglang:http_*"],
            "some_new_series": sorted(names_after - names_before)[:5],
            "rss_growth_kib": after["rss_kib"] - before["rss_kib"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--alone", action="store_true", help="also run SGLang without the role's guard")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="bws-keyless-") as scratch:
        for guarded in ([True, False] if args.alone else [True]):
            result = measure(Path(scratch) / ("guarded" if guarded else "alone"), args.requests, guarded)
            results.append(result)
            print(f"SGLang {result['sglang']}: {result['requests']} keyless GET /health<random> in "
                  f"{result['seconds']} s ({result['requests_per_s']}/s), statuses {result['statuses']}; "
                  f"/metrics series {result['before']['series']} -> {result['after']['series']} "
                  f"({result['new_series']:+d}: {result['some_new_series']}); "
                  f"HTTP server RSS {result['before']['rss_kib']} KiB -> {result['after']['rss_kib']} KiB "
                  f"({result['rss_growth_kib']:+d} KiB)", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0 if all(r["new_http_series"] == 0 for r in results if r["sglang"].startswith("with")) else 1


if __name__ == "__main__":
    sys.exit(main())
