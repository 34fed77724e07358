"""Every locked vLLM's `bench` recipe against the option strings of that version's real `vllm bench serve`.

Importing the client costs about ten seconds, so its parser is read with ast from the installed source
(vllm/benchmarks/**.py, where serve.py and datasets/ define the options): every flag the lock passes, in
`argv`, a workload, `options` or `switches`, must be one the client defines, spelled in full, and every
`--backend` a name its request functions are registered under. The pinned version's client also runs for real
against the engine double (test_verify_real_clients.py).
"""

from __future__ import annotations

import json
import subprocess

import pytest
from vllm_helpers import contract_venv, other_locked_vllm_versions, pinned_vllm_version

pytestmark = pytest.mark.contract

OPTIONS_CODE = r"""
import ast, importlib.util, json, pathlib
package = pathlib.Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
options, backends = set(), set()
for path in (package / "benchmarks").rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            options |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")}
        # ASYNC_REQUEST_FUNCS: dict[str, RequestFunc] = {"openai": ..., "openai-chat": ...}: what --backend takes
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if isinstance(node, ast.Assign | ast.AnnAssign) and any(getattr(n, "id", None) == "ASYNC_REQUEST_FUNCS"
                                                              for n in targets):
            backends |= {k.value for k in getattr(node.value, "keys", []) if isinstance(k, ast.Constant)}
print(json.dumps({"options": sorted(options), "backends": sorted(backends)}))
"""


def _lock_flags(bench: dict) -> list[str]:
    words = list(bench["argv"]) + [w for argv in bench["workloads"].values() for w in argv]
    return ([w for w in words if str(w).startswith("--")]
            + [flag for names in bench["options"].values() for flag in names]
            + [flag for names in (bench["switches"] or {}).values() for flag in names])


@pytest.mark.parametrize("version", [pinned_vllm_version(), *other_locked_vllm_versions()])
def test_every_bench_flag_exists_in_that_versions_client(version: str) -> None:
    python = contract_venv(version) / "bin" / "python"
    proc = subprocess.run([str(python), "-c", OPTIONS_CODE], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    client = json.loads(proc.stdout)
    options, backends = set(client["options"]), set(client["backends"])
    assert {"openai", "vllm"} <= backends  # the reader found the request functions
    assert {"--dataset-path", "--temperature", "--trust-remote-code"} <= options  # the reader found the parser
    assert "--random-input" not in options  # prefixes are not options
    from engine_locks import load_lock  # tests/ is on the path once vllm_helpers is imported

    bench = load_lock("vllm", version)["bench"]
    assert bench["module"] == "vllm.entrypoints.cli.main"
    unknown = [flag for flag in _lock_flags(bench) if flag not in options]
    assert unknown == [], f"flags vllm {version}'s client does not define: {unknown}"
    for argv in [bench["argv"], *bench["workloads"].values()]:
        if "--backend" in argv:
            assert argv[argv.index("--backend") + 1] in backends, f"vllm {version}: --backend {argv}"
