"""Rules the repository keeps: test doubles stay in tests/, no machine-specific paths, FQCN modules."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SHIPPED_YAML = [
    *REPO.glob("roles/*/defaults/*.yml"),
    *REPO.glob("roles/*/vars/*.yml"),
    *REPO.glob("roles/*/tasks/*.yml"),
    *REPO.glob("roles/*/templates/*"),
    *REPO.glob("playbooks/*.yml"),
    *REPO.glob("inventory/production/**/*.yml"),
]


def test_there_is_something_to_check():
    assert len(SHIPPED_YAML) > 20
    assert (REPO / "inventory/sandbox").is_dir()


def test_only_the_sandbox_inventory_refers_to_tests():
    offenders = [str(p.relative_to(REPO)) for p in SHIPPED_YAML
                 if re.search(r"(^|[/'\"\s])tests/|\.\./tests|doubles/", p.read_text())]
    assert offenders == [], f"shipped files must not refer to tests/: {offenders}"


def test_the_sandbox_inventory_does_refer_to_the_double():
    text = "".join(p.read_text() for p in (REPO / "inventory/sandbox").rglob("*.yml"))
    assert "tests/doubles/engine_double.py" in text


def test_no_machine_specific_paths_anywhere():
    pattern = re.compile(r"/work/|/root/\.|/home/\w+/|/tmp/pytest-of")
    offenders = []
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    for path in (REPO / name for name in listed):
        if path.is_file() and path.suffix not in (".png", ".gpg", ".whl") and path != Path(__file__):
            text = path.read_text(errors="replace")
            if pattern.search(text):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


def _tasks(node):
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        if "name" in node and any(k for k in node if "." in k):
            yield node
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            if key in node:
                yield from _tasks(node[key])


def test_every_task_uses_a_fully_qualified_module_name():
    bad = []
    for path in [p for p in SHIPPED_YAML if "/tasks/" in str(p) or "/playbooks/" in str(p)]:
        for task in _tasks(yaml.safe_load(path.read_text())):
            actions = [k for k in task if ("." in k and k.split(".")[0] in ("ansible", "containers", "community"))
                       or k.startswith("blackwell.serving.")]
            if not actions:
                bad.append(f"{path.relative_to(REPO)}: {task.get('name')}")
    assert bad == []


# ---------------------------------------------------------------- one place for each concern

ALL_YAML = [p for pattern in ("roles/**/*.yml", "playbooks/*.yml", "*.yml", "inventory/**/*.yml", "molecule/**/*.yml")
            for p in REPO.glob(pattern) if ".git" not in p.parts]
SHIPPED_PYTHON = [*REPO.glob("plugins/*/*.py"), *REPO.glob("roles/*/files/*.py")]
NVIDIA_SMI_SITE = REPO / "plugins" / "module_utils" / "nvidia" / "smi.py"
# Runs on the host as the engine unit's user under systemd-run, outside Ansible, with only pcie.py beside it: its
# own MIG and P2P-topology reads are diagnostics of that run (every deploy and provision read goes through
# plugins/module_utils/nvidia/smi.py).
NVIDIA_SMI_EXEMPT = {REPO / "roles" / "engine_service" / "files" / "interconnect_proof.py"}


def code_lines(path: Path) -> list[str]:
    """The lines of a file without comments and without Python docstrings/DOCUMENTATION blocks."""
    text = path.read_text()
    if path.suffix == ".py":
        text = re.sub(r'r?"""(.|\n)*?"""', "", text)
    return [line for line in text.splitlines() if not line.lstrip().startswith("#")]


def test_no_parsing_loops_in_jinja():
    pattern = re.compile(r"namespace\(|\{%-?\s*set\s+_\s*=")
    offenders = [str(p.relative_to(REPO)) for p in ALL_YAML if pattern.search(p.read_text())]
    assert offenders == [], f"parse in a filter plugin or module_utils, not in Jinja: {offenders}"


def test_one_site_queries_nvidia_smi():
    query = re.compile(r"--query-(gpu|compute-apps)|[\"']topo[\"']\s*,")
    offenders = [str(p.relative_to(REPO)) for p in [*ALL_YAML, *SHIPPED_PYTHON]
                 if p != NVIDIA_SMI_SITE and p not in NVIDIA_SMI_EXEMPT
                 and any(query.search(line) for line in code_lines(p))]
    assert any(query.search(line) for line in code_lines(NVIDIA_SMI_SITE)), "the pattern must find the one site"
    assert offenders == [], f"nvidia-smi is queried by plugins/module_utils/nvidia/smi.py only (gpu_facts): {offenders}"
    commands = [str(p.relative_to(REPO)) for p in ALL_YAML
                if re.search(r"(argv|cmd|command|shell):.*\bnvidia-smi\b", p.read_text())]
    assert commands == [], f"no task runs nvidia-smi itself: {commands}"


def test_health_is_polled_only_by_engine_wait():
    tasks_with_health = []
    waits = [p for p in ALL_YAML if re.search(r"(?m)^\s*blackwell\.serving\.engine_wait:\s*$", p.read_text())]
    for path in ALL_YAML:
        for task in _tasks(yaml.safe_load(path.read_text()) or []):
            action = {k: v for k, v in task.items() if k in ("ansible.builtin.uri", "ansible.builtin.command",
                                                                "ansible.builtin.shell", "ansible.builtin.get_url")}
            if "/health" in str(action):
                tasks_with_health.append(f"{path.relative_to(REPO)}: {task.get('name')}")
    assert waits, "engine_wait tasks must be found (the rule would be empty otherwise)"
    assert tasks_with_health == [], tasks_with_health
    # Code that runs inside the engine's own process (vLLM's auth middleware, which leaves /health open; SGLang's
    # guard, which bounds the paths under it) serves the route; it does not poll it.
    in_engine = {REPO / "roles" / "vllm" / "files" / "bws_vllm_auth.py",
                 REPO / "roles" / "sglang" / "files" / "bws_sglang_guard.py"}
    polling = [str(p.relative_to(REPO)) for p in SHIPPED_PYTHON if p.name != "engine_wait.py" and p not in in_engine
               and any("/health" in line for line in code_lines(p))]
    assert polling == [], f"/health is polled by plugins/modules/engine_wait.py only: {polling}"


def test_one_unknown_variable_mechanism():
    mechanism = {REPO / "plugins" / "action" / "input_check.py"}
    pattern = re.compile(r"varnames|unknown variable")
    offenders = [str(p.relative_to(REPO)) for p in [*ALL_YAML, *SHIPPED_PYTHON]
                 if p not in mechanism and any(pattern.search(line) for line in code_lines(p))]
    assert offenders == [], f"unknown variables are refused by plugins/action/input_check.py only: {offenders}"


def test_no_module_over_450_lines():
    long = {p.name: n for p in (REPO / "plugins" / "modules").glob("*.py")
            if (n := len(p.read_text().splitlines())) > 450}
    assert long == {}, f"move the logic to module_utils: {long}"


# Keys Ansible reads in a module's result as its own verdict: a truthy `failed` fails the task, `skipped` and
# `unreachable` relabel it. A module's data under one of these names is misread (engine_status once returned the
# failed release as `failed`).
ANSIBLE_VERDICT_KEYS = {"failed", "skipped", "unreachable"}


def returned_keys(module: Path) -> set[str]:
    """The top-level keys a module's RETURN documents."""
    tree = ast.parse(module.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "RETURN" for t in node.targets):
            return set(yaml.safe_load(node.value.value) or {})
    return set()


def test_no_module_returns_its_data_under_ansibles_verdict_keys():
    modules = sorted((REPO / "plugins" / "modules").glob("*.py"))
    assert sum(bool(returned_keys(module)) for module in modules) > 10, "RETURN blocks must be found"
    misread = {module.name: sorted(keys) for module in modules
               if (keys := returned_keys(module) & ANSIBLE_VERDICT_KEYS)}
    assert misread == {}, f"Ansible reads these keys as the task's own verdict: {misread}"


def test_the_verdict_key_rule_sees_a_documented_failed_key(tmp_path: Path):
    module = tmp_path / "m.py"
    module.write_text('RETURN = r"""\nfailed_release:\n  type: str\nfailed:\n  type: str\n"""\n')
    assert returned_keys(module) & ANSIBLE_VERDICT_KEYS == {"failed"}


def test_gpu_release_logic_is_split_by_concern_and_does_not_write_the_release_state():
    files = sorted((REPO / "plugins" / "module_utils" / "gpu_release").glob("*.py"))
    concerns = {p.stem for p in files} - {"__init__"}
    assert concerns == {"release", "scope", "units", "signals", "shm", "gpus", "report"}, concerns
    long = {p.name: n for p in files if (n := len(p.read_text().splitlines())) > 350}
    assert long == {}, f"split by concern, at most 350 lines a file: {long}"
    writers = [p.name for p in files if any(w in line for line in code_lines(p)
                                            for w in ("write_text_atomically", "os.replace", "record_stopped("))]
    assert writers == [], f"state.json is written by plugins/module_utils/release/state.py only: {writers}"


def test_one_systemd_unit_reader():
    """Unit state is read by plugins/module_utils/host/systemd.py only (show_units, and unit_properties over it)."""
    reader = REPO / "plugins" / "module_utils" / "host" / "systemd.py"
    pattern = re.compile(r"""["']show["']|systemctl show|is-active""")
    offenders = [str(p.relative_to(REPO)) for p in SHIPPED_PYTHON
                 if p != reader and any(pattern.search(line) for line in code_lines(p))]
    assert offenders == [], f"read units with host/systemd.py show_units: {offenders}"


def test_module_utils_are_packages_by_concern():
    """plugins/module_utils holds packages (one per concern), each with an empty __init__.py, and no loose file."""
    root = REPO / "plugins" / "module_utils"
    loose = sorted(p.name for p in root.glob("*.py"))
    assert loose == [], f"put shared code in a package of its concern: {loose}"
    packages = sorted(p for p in root.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert len(packages) >= 5, packages
    assert all((p / "__init__.py").is_file() and (p / "__init__.py").read_text() == "" for p in packages), packages


# Engine names in engine-neutral code: tests/unit/test_engine_neutral_code.py.


# One way for tests to run a playbook and read its result: tests/playbook_run.py (ansible-runner and its events).
PLAYBOOK_RUNNER = "tests/playbook_run.py"
RULE_FILE = "tests/unit/test_repository_rules.py"  # this file: it spells out what the rule looks for
# Test code that starts ansible another way, each for a reason the runner cannot serve.
OTHER_PLAYBOOK_STARTS = {
    # a power cut: the controller is frozen and killed mid-run in a session of its own (SIGSTOP, SIGKILL)
    "tests/integration/lifecycle_helpers.py",
    # a full disk: ansible-playbook runs under unshare with a 64 KiB tmpfs mounted in a private mount namespace
    "tests/integration/model_helpers.py",
    # the README's own commands, run verbatim as a newcomer types them
    "tests/integration/test_readme_first_hour.py",
    # the runner's own test: its events against the recap ansible-playbook printed
    "tests/unit/test_playbook_run.py",
}
# Starting ansible (ansible-playbook named in code, ansible in a command line), or reading its printed output
# instead of the runner's events.
PLAYBOOK_PROGRAM = re.compile(r"(^|/)ansible-playbook$")
ANSIBLE_PROGRAMS = re.compile(r"(^|/)(ansible-playbook|ansible)$")
OUTPUT_SCRAPING = re.compile(r"PLAY RECAP|TASK \[|ANSIBLE_STDOUT_CALLBACK|ANSIBLE_CALLBACK|ok=\\d|changed=\(")
COMMAND_CALLS = {"run", "Popen", "check_call", "check_output", "call", "execvp", "execv"}


def _docstring_ids(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _command_constants(tree: ast.AST) -> set[int]:
    """Strings inside a list or tuple literal (an argv) or inside the arguments of a process-starting call."""
    roots = [node for node in ast.walk(tree) if isinstance(node, ast.List | ast.Tuple)]
    roots += [arg for node in ast.walk(tree) if isinstance(node, ast.Call)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in COMMAND_CALLS for arg in node.args]
    return {id(leaf) for root in roots for leaf in ast.walk(root) if isinstance(leaf, ast.Constant)}


def _looked_up_or_compared(tree: ast.AST) -> set[int]:
    """Strings that only find a program (shutil.which) or compare a word with its name: no start."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) or (isinstance(node, ast.Call)
                                             and getattr(node.func, "attr", None) == "which"):
            found |= {id(leaf) for leaf in ast.walk(node) if isinstance(leaf, ast.Constant)}
    return found


def playbook_starts(path: Path) -> list[str]:
    """Where a Python file starts ansible (`import ansible_runner`, its program in a command) or scrapes its
    printed output (recap lines, task banners, another stdout callback)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings, commands, harmless = _docstring_ids(tree), _command_constants(tree), _looked_up_or_compared(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {alias.name}") for alias in node.names if alias.name == "ansible_runner"]
        elif isinstance(node, ast.ImportFrom) and node.module == "ansible_runner":
            found.append((node.lineno, "from ansible_runner import"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings and (
                (id(node) in commands and ANSIBLE_PROGRAMS.search(node.value))
                or (id(node) not in harmless and PLAYBOOK_PROGRAM.search(node.value))
                or OUTPUT_SCRAPING.search(node.value)):
            found.append((node.lineno, repr(node.value[:60])))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_tests_start_playbooks_only_through_the_one_runner():
    """Host scenarios, Molecule verifiers, contract and GPU tests run playbooks with tests/playbook_run.py and read
    recaps and task results from its events; scripts/ci_playbook.py, a program of its own, is run as users run it."""
    test_code = [path for folder in ("tests", "molecule") for path in (REPO / folder).rglob("*.py")
                 if "__pycache__" not in path.parts]
    offenders = {relative: found for path in test_code
                 if (relative := str(path.relative_to(REPO))) not in {PLAYBOOK_RUNNER, RULE_FILE,
                                                                       *OTHER_PLAYBOOK_STARTS}
                 and (found := playbook_starts(path))}
    assert offenders == {}, f"run playbooks with {PLAYBOOK_RUNNER} (run_playbook, run_module): {offenders}"


def test_the_runner_rule_sees_a_start_and_a_scrape_and_not_prose(tmp_path: Path):
    code = tmp_path / "x.py"
    code.write_text('"""Runs ansible-playbook."""\nimport ansible_runner\n'
                    'subprocess.run(["ansible-playbook", "site.yml"])\nrecap = out.split("PLAY RECAP")\n'
                    '# ansible-playbook\nprint("ansible-playbook ran")\nshutil.which("ansible-playbook")\n'
                    'work = tmp / "ansible"\nos.execv(venv / "bin/ansible", args)\n'
                    'program = str(venv / "ansible-playbook")\n')
    assert playbook_starts(code) == ["2: import ansible_runner", "3: 'ansible-playbook'", "4: 'PLAY RECAP'",
                                     "9: 'bin/ansible'", "10: 'ansible-playbook'"]
