"""The pinned SGLang lock's `bench` recipe against the real benchmark client of that version.

The client (`sglang.benchmark.serving`) imports transformers at module level, which the CPU contract venv
does not carry, so its option strings are read with ast from the installed source: every flag the lock
passes must be one `cli_main()` defines, spelled in full.
"""

from __future__ import annotations

import pytest
from sglang_helpers import pinned_sglang_lock, run_json_in_venv

pytestmark = pytest.mark.contract

OPTIONS_CODE = r"""
import ast, importlib.util, json, pathlib
package = pathlib.Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
module = str(package / "benchmark" / "serving.py")  # find_spec of a submodule would import sglang
options, strings = set(), set()
for node in ast.walk(ast.parse(pathlib.Path(module).read_text())):
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
        options |= {a.value for a in node.args
                    if isinstance(a, ast.Constant) and str(a.value).startswith("-")}
for path in (package / "benchmark").rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.add(node.value)
print(json.dumps({"options": sorted(options), "strings": sorted(strings), "module": module}))
"""


@pytest.fixture(scope="module")
def client() -> dict[str, list[str]]:
    return run_json_in_venv(OPTIONS_CODE)


def test_client_module_is_the_locked_one(client: dict[str, list[str]]) -> None:
    assert client["module"].endswith(pinned_sglang_lock()["bench"]["module"].replace(".", "/") + ".py")
    assert len(client["options"]) > 40  # the reader really found the client's parser


def test_every_bench_flag_exists(client: dict[str, list[str]]) -> None:
    bench = pinned_sglang_lock()["bench"]
    flags = [token for token in bench["argv"] if token.startswith("--")]
    flags += [token for words in bench["workloads"].values() for token in words if token.startswith("--")]
    flags += [flag for names in bench["options"].values() for flag in names]
    flags += [flag for names in (bench["switches"] or {}).values() for flag in names]
    unknown = [flag for flag in flags if flag not in client["options"]]
    assert unknown == [], f"flags the locked client does not define: {unknown}"


def test_bench_values_are_known_to_the_client(client: dict[str, list[str]]) -> None:
    bench = pinned_sglang_lock()["bench"]
    for argv in [bench["argv"], *bench["workloads"].values()]:
        for flag in ("--backend", "--dataset-name"):
            if flag in argv:
                value = argv[argv.index(flag) + 1]
                assert value in client["strings"], f"{flag} {value}: not a name the client knows"


def test_reader_would_notice_a_wrong_flag(client: dict[str, list[str]]) -> None:
    assert "--random-input" not in client["options"]  # prefixes are not options
    assert "--served-model-name" in client["options"]
