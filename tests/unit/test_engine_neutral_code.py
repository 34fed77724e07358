"""No engine's name in engine-neutral code: an engine's behaviour lives in its roster entry, its role, its entry point.

Engine-neutral code is every plugin of the collection (modules, module_utils, filters, action, lookup and plugin_utils
code), the scripts, and the engine_service and verify roles (tasks, defaults, vars, argument specs, templates, files).
The engine names are the roster's own (meta/engines.yml: each engine and its role), matched case-insensitively
anywhere in an identifier or a string. Exempt, because they document rather than run: comments, docstrings, the
modules' DOCUMENTATION / EXAMPLES / RETURN, the argument specs' descriptions and the templates' comment lines.
Nothing is exempt by file name: the roster reader is scanned like the rest.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
NEUTRAL_TREES = ["plugins", "scripts", "roles/engine_service", "roles/verify", "roles/gpu_release", "roles/input_check",
                 "roles/host_preflight", "roles/python_env", "roles/model_store", "roles/nvidia_driver",
                 "roles/cuda_toolkit"]
DOC_ASSIGNMENTS = {"DOCUMENTATION", "EXAMPLES", "RETURN"}
DOC_KEYS = {"description", "short_description", "author", "notes"}


def engine_names() -> list[str]:
    roster = yaml.safe_load((REPO / "meta" / "engines.yml").read_text())["engines"]
    return sorted({name for name in roster} | {entry["role"] for entry in roster.values()})


def engine_pattern(names: list[str]) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(name) for name in names), re.IGNORECASE)


def documentation_strings(tree: ast.AST) -> set[tuple[int, int]]:
    """Start positions of docstrings and of the module documentation's string constants."""
    spots: set[tuple[int, int]] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                spots.add((first.value.lineno, first.value.col_offset))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in DOC_ASSIGNMENTS
                                                for t in node.targets):
            spots.update((c.lineno, c.col_offset) for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    return spots


def python_hits(path: Path, pattern: re.Pattern[str]) -> list[str]:
    source = path.read_text()
    exempt = documentation_strings(ast.parse(source))
    hits = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT or (token.type == tokenize.STRING and token.start in exempt):
            continue
        if token.type in (tokenize.NAME, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)) \
                and pattern.search(token.string):
            hits.append(f"{path.relative_to(REPO)}:{token.start[0]}: {token.string[:80]!r}")
    return hits


def _yaml_strings(node, path: str):
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{path}.{key}", str(key)
            if key not in DOC_KEYS:
                yield from _yaml_strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _yaml_strings(item, f"{path}[{index}]")
    elif isinstance(node, str):
        yield path, node


def yaml_hits(path: Path, pattern: re.Pattern[str]) -> list[str]:
    data = yaml.safe_load(path.read_text())
    return [f"{path.relative_to(REPO)}:{where}: {text[:80]!r}" for where, text in _yaml_strings(data, "")
            if pattern.search(text)]


def template_hits(path: Path, pattern: re.Pattern[str]) -> list[str]:
    text = re.sub(r"\{#.*?#\}", "", path.read_text(), flags=re.DOTALL)
    return [f"{path.relative_to(REPO)}:{number}: {line.strip()[:80]!r}"
            for number, line in enumerate(text.splitlines(), 1)
            if not line.lstrip().startswith("#") and pattern.search(line)]


def neutral_files() -> list[Path]:
    files = []
    for tree in NEUTRAL_TREES:
        files += [p for p in (REPO / tree).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix in (".py", ".yml", ".yaml", ".j2")]
    return sorted(files)


def hits_in(path: Path, pattern: re.Pattern[str]) -> list[str]:
    if path.suffix == ".py":
        return python_hits(path, pattern)
    if path.suffix == ".j2":
        return template_hits(path, pattern)
    return yaml_hits(path, pattern)


def test_the_scan_sees_the_engine_neutral_code() -> None:
    files = neutral_files()
    assert len(files) > 60
    assert {"plugins/modules/gpu_release.py", "roles/verify/tasks/readiness.yml",
            "roles/engine_service/templates/engine.service.j2"} <= {str(p.relative_to(REPO)) for p in files}
    assert engine_names() == ["sglang", "vllm"]


def test_the_scan_finds_a_name_in_code_and_strings_but_not_in_documentation(tmp_path) -> None:
    pattern = engine_pattern(engine_names())
    probe = REPO / "plugins" / "module_utils" / "_probe_neutral.py"
    probe.write_text('"""A docstring naming sglang."""\nDOCUMENTATION = "vllm"\n# vllm in a comment\n'
                     'def f():\n    """vllm"""\n    return sglang_flags("x", f"--{vLLM}")\n')
    try:
        hits = python_hits(probe, pattern)
    finally:
        probe.unlink()
    assert [hit.split(": ", 1)[1] for hit in hits] == ["'sglang_flags'", "'vLLM'"], hits


def test_no_engine_name_in_engine_neutral_code() -> None:
    pattern = engine_pattern(engine_names())
    hits = [hit for path in neutral_files() for hit in hits_in(path, pattern)]
    assert hits == [], f"{len(hits)} engine name(s) in engine-neutral code:\n" + "\n".join(hits)
