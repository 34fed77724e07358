"""Shared by the SGLang contract tests: the contract venv, running code in it, the real metric names.

The venv is built (once per cache, keyed by version and recipe) by scripts/contract-venv-sglang.sh from the
pinned lock. If it cannot be built the tests skip with the reason, except under CI (CI=true), where
the contract tests must run and a build failure fails them.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from engine_locks import load_lock  # noqa: E402

CHECK_SCRIPT = REPO_ROOT / "roles" / "sglang" / "files" / "check_sglang_args.py"
VENV_SCRIPT = REPO_ROOT / "scripts" / "contract-venv-sglang.sh"
MODELS_FILE = REPO_ROOT / "inventory" / "production" / "group_vars" / "all" / "models.yml"
BUILD_TIMEOUT_S = 900


def pinned_sglang_lock() -> dict[str, Any]:
    return load_lock("sglang")


@functools.cache
def _build_venv() -> tuple[Path | None, str]:
    env = dict(os.environ)
    # The build script reads the lock with python3 + PyYAML: the interpreter running these tests has both.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    try:
        proc = subprocess.run(["bash", str(VENV_SCRIPT)], capture_output=True, text=True, env=env,
                              timeout=BUILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None, f"{VENV_SCRIPT.name} ran past {BUILD_TIMEOUT_S} s"
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return None, f"{VENV_SCRIPT.name} failed (rc {proc.returncode}): {proc.stderr.strip()[-1500:]}"
    return Path(lines[-1]), ""


def unavailable(message: str) -> NoReturn:
    """What a contract test does when something it needs cannot be had here: skip, but fail under CI."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def contract_python() -> Path:
    """The contract venv's python; skips (fails under CI) when the venv cannot be built."""
    venv, reason = _build_venv()
    if venv is None:
        unavailable(f"the SGLang contract venv cannot be built: {reason}")
    return venv / "bin" / "python"


def run_in_venv(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run Python `code` with the contract venv's interpreter (argv[1:] = args)."""
    return subprocess.run([str(contract_python()), "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def run_json_in_venv(code: str, *args: str, timeout: float = 120) -> Any:
    """Run `code` in the venv; it must print one JSON document last."""
    proc = run_in_venv(code, *args, timeout=timeout)
    assert proc.returncode == 0, f"contract venv code failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Exported sample names of every metric defined in sglang's metrics_collector.py, with its type, read by
# ast (nothing is imported). prometheus_client exports a Counter `x` or `x_total` as `x_total` (+ `x_created`)
# whose `# TYPE` line names `x_total`; a Histogram `x` as `x_bucket`/`x_sum`/`x_count` (+ `x_created`); a
# Summary as `x_sum`/`x_count`.
METRIC_NAMES_CODE = r"""
import ast, importlib.util, json, pathlib
# Located, not imported: importing sglang costs seconds.
package = pathlib.Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
source = package / "srt" / "observability" / "metrics_collector.py"
kinds = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary"}
definitions = {}
for node in ast.walk(ast.parse(source.read_text())):
    if not isinstance(node, ast.Call):
        continue
    func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    if func not in kinds:
        continue
    values = [kw.value for kw in node.keywords if kw.arg == "name"] + node.args[:1]
    for value in values:
        if isinstance(value, ast.Constant) and str(value.value).startswith("sglang:"):
            definitions[value.value] = kinds[func]
            break
samples = {}
for name, kind in definitions.items():
    if kind == "counter":
        base = name.removesuffix("_total")
        samples.update({base + suffix: ("counter", base + "_total") for suffix in ("_total", "_created")})
    elif kind in ("histogram", "summary"):
        suffixes = ("_sum", "_count", "_created") + (("_bucket",) if kind == "histogram" else ())
        samples.update({name + s: (kind, name) for s in suffixes})
    else:
        samples[name] = (kind, name)
print(json.dumps({"source": str(source), "definitions": definitions, "samples": samples}))
"""


@functools.cache
def sglang_metric_definitions() -> dict[str, Any]:
    """{'definitions': {name: kind}, 'samples': {sample name: [kind, `# TYPE` name]}, 'source': path}."""
    return run_json_in_venv(METRIC_NAMES_CODE)
