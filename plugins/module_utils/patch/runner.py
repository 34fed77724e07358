"""The verification runner of a patch set, run by the engine's own interpreter (``python -c <this file's source>
spec.json out.json``): compile the patched files, import the modules they belong to, check the names and
assertions of the set's ``verify:`` section, and write a JSON report. Standard library only, and no import from
the rest of the project: it runs in the engine's venv, not in Ansible's module process
(plugins/module_utils/patch/patchset.py
passes it this file's source). Exit status 0 with ``"ok": false`` in the report for a failed check.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from typing import Any


class FinishedError(Exception):
    """The report is complete (a check failed where going on makes no sense)."""


def failed(report: dict[str, Any], entry: dict[str, Any], exc: BaseException) -> None:
    entry["ok"] = False
    entry["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    report["ok"] = False


def compile_files(spec: dict[str, Any], report: dict[str, Any]) -> None:
    for path, source in spec.get("compile", {}).items():
        entry = {"path": path, "ok": True}
        report["compiled"].append(entry)
        try:
            compile(source, path, "exec", dont_inherit=True)
        except BaseException as exc:  # a SyntaxError, or anything compile raises, is the report
            failed(report, entry, exc)


def import_modules(spec: dict[str, Any], report: dict[str, Any], namespace: dict[str, Any]) -> None:
    try:
        exec(compile(spec.get("preamble", ""), "<patchset preamble>", "exec"), namespace)
    except BaseException as exc:
        failed(report, {}, exc)
        report["imports"].append({"module": "<preamble>", "ok": False, "error": str(exc)})
        raise FinishedError from exc
    expected = spec.get("expected_files", {})
    for name in spec["imports"]:
        entry: dict[str, Any] = {"module": name, "ok": True}
        report["imports"].append(entry)
        try:
            module = importlib.import_module(name)
        except BaseException as exc:
            failed(report, entry, exc)
            raise FinishedError from exc
        entry["file"] = getattr(module, "__file__", None)
        want = expected.get(name)
        if want and os.path.realpath(entry["file"] or "") != os.path.realpath(want):
            entry["ok"] = report["ok"] = False
            entry["error"] = f"imported from {entry['file']}, not from the patched {want}"
            raise FinishedError


def resolve_names(spec: dict[str, Any], report: dict[str, Any], namespace: dict[str, Any]) -> None:
    for alias, target in spec.get("names", {}).items():
        module_name, _, attribute = target.partition(":")
        try:
            value: Any = importlib.import_module(module_name)
            for part in filter(None, attribute.split(".")):
                value = getattr(value, part)
            namespace[alias] = value
        except BaseException as exc:
            entry = {"that": f"{alias} = {target}", "ok": True}
            report["assertions"].append(entry)
            failed(report, entry, exc)
            raise FinishedError from exc


def check_assertions(spec: dict[str, Any], report: dict[str, Any], namespace: dict[str, Any]) -> None:
    for item in spec.get("assertions", []):
        entry = {"that": item["that"], "ok": True}
        report["assertions"].append(entry)
        try:
            if not eval(item["that"], namespace):  # the patch set's own assertions
                entry["ok"] = report["ok"] = False
                entry["error"] = item.get("msg") or "assertion is false"
        except BaseException as exc:
            failed(report, entry, exc)


def verify(spec: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = {"ok": True, "compiled": [], "imports": [], "assertions": []}
    compile_files(spec, report)
    if not report["ok"] or not spec.get("imports"):
        return report
    sys.dont_write_bytecode = True  # a patched tree must not gain .pyc files from its own check
    namespace: dict[str, Any] = {}
    try:
        import_modules(spec, report, namespace)
        resolve_names(spec, report, namespace)
    except FinishedError:
        return report
    check_assertions(spec, report, namespace)
    return report


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    report = verify(spec)
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(report, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
