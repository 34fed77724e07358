#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Abort every request an SGLang unit still has in flight (the sglang role's drain entry point runs it on the host).

SGLang 0.5.23 drains on SIGTERM without a limit (srt/managers/tokenizer_manager.py sigterm_watchdog); once the
deploy's drain bound has passed, ``POST /abort_request {"abort_all": true}`` ends what is in flight, the drain ends
and SGLang shuts its schedulers down itself. /abort_request is an admin route (srt/utils/auth.py): with an admin key
set only it is accepted, so the unit's config file gives the key (admin-api-key, else api-key); it is read here, on
the host, and never printed. Only units that run ``sglang serve --config FILE`` are SGLang's to abort; anything else
is left to its own stop. Stdlib only. Prints one line saying what it did; exit 0 unless the config cannot be read.

    bws_sglang_abort.py --unit sglang.service --exec-start JSON   (the unit's command line, as engine_drain returns it)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

PROGRAM = "sglang"


def serve_config_path(argv: list[str]) -> str | None:
    """The --config file of `sglang serve --config FILE`; None for anything else."""
    if len(argv) < 4 or os.path.basename(argv[0]) != PROGRAM or argv[1] != "serve" or "--config" not in argv:
        return None
    index = argv.index("--config")
    return argv[index + 1] if index + 1 < len(argv) else None


def flat_config(text: str) -> dict:
    """The flat `key: <JSON value>` YAML that the sglang role renders (templates/sglang-config.yaml.j2)."""
    config = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "---")) or ":" not in line:
            continue
        key, _, value = line.partition(":")
        try:
            config[key.strip()] = json.loads(value.strip())
        except ValueError:
            config[key.strip()] = value.strip()
    return config


def abort_url(config: dict) -> str:
    host = str(config.get("host") or "127.0.0.1")
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{host}:{int(config.get('port') or 30000)}/abort_request"


def post_abort_all(url: str, api_key: str | None, timeout_s: float = 10.0) -> str:
    request = urllib.request.Request(url, data=b'{"abort_all": true}', method="POST",
                                     headers={"Content-Type": "application/json"})
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"not answered ({exc})"


def abort_in_flight(unit: str, exec_start: list[str]) -> str:
    config_path = serve_config_path(exec_start)
    if config_path is None:
        return f"{unit} does not run `{PROGRAM} serve --config`: its own stop applies"
    with open(config_path, encoding="utf-8") as handle:
        config = flat_config(handle.read())
    answer = post_abort_all(abort_url(config), config.get("admin-api-key") or config.get("api-key"))
    return f"aborted them (POST /abort_request abort_all: {answer}); the stop follows"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unit", required=True)
    parser.add_argument("--exec-start", required=True, type=json.loads,
                        help="the unit's ExecStart= argv as a JSON list (engine_drain's exec_start)")
    args = parser.parse_args(argv)
    try:
        print(abort_in_flight(args.unit, args.exec_start))
    except OSError as exc:
        print(f"cannot read what {args.unit} runs: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
