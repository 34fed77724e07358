"""Read the engine lock files: roles/<engine>/locks/<engine>-<version>.yml.

One file per engine version holds everything that depends on that version: the Python range, the CUDA
torch pin, the full pinned requirement set of the GPU host venv, how to run that version's benchmark
client, and the recipe of the CPU-only venv in which the contract tests import the engine's real code.

The *pinned* version of an engine is the one whose lock file says `pinned: true`; exactly one lock per
engine may say so (tests/unit/test_engine_locks.py enforces it). Bumping an engine = adding its lock file
and moving `pinned: true` to it (roles/sglang/locks/README.md).

Library use (tests, scripts):
    from engine_locks import load_lock, pinned_version
    lock = load_lock("sglang")            # the pinned lock
    lock = load_lock("vllm", "0.17.1")    # a given version

Command line (used by scripts/contract-venv-*.sh; needs PyYAML, which the controller venv has):
    python3 tests/engine_locks.py pinned ENGINE               print the pinned version
    python3 tests/engine_locks.py get ENGINE VERSION KEY      print a value (dotted KEY; a list: one a line)
    python3 tests/engine_locks.py path ENGINE VERSION         print the lock file's path
    python3 tests/engine_locks.py from-pip-report REPORT.json print `requirements:` YAML from `pip --report`
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
ROLES_DIR = REPO_ROOT / "roles"
ENGINES = ("sglang", "vllm")
REQUIRED_KEYS = ("engine", "version", "pinned", "python", "torch", "requirements", "hashes", "bench", "contract")
CONTRACT_KEYS = ("python", "torch", "packages", "engine", "engine_install")
EXACT_VERSION = re.compile(r"^\d+(\.\d+)+(\.post\d+)?$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
EXACT_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,.-]+\])?==[A-Za-z0-9.+!_-]+$")


class LockError(Exception):
    """A lock file is missing, unreadable or inconsistent."""


def lock_dir(engine: str) -> Path:
    if engine not in ENGINES:
        raise LockError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    return ROLES_DIR / engine / "locks"


def lock_path(engine: str, version: str) -> Path:
    return lock_dir(engine) / f"{engine}-{version}.yml"


def lock_paths(engine: str) -> list[Path]:
    return sorted(lock_dir(engine).glob(f"{engine}-*.yml"))


def read_lock_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise LockError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise LockError(f"{path}: a lock file must be a mapping")
    return data


def pinned_version(engine: str) -> str:
    pinned = [read_lock_file(p) for p in lock_paths(engine)]
    versions = [str(lock["version"]) for lock in pinned if lock.get("pinned") is True]
    if len(versions) != 1:
        raise LockError(f"{engine}: expected exactly one lock with 'pinned: true' in {lock_dir(engine)}, "
                        f"found {len(versions)}: {versions}")
    return versions[0]


def load_lock(engine: str, version: str | None = None) -> dict[str, Any]:
    """The lock of `engine` at `version` (default: the pinned one), checked."""
    version = version or pinned_version(engine)
    path = lock_path(engine, version)
    if not path.is_file():
        known = [p.stem.removeprefix(f"{engine}-") for p in lock_paths(engine)]
        raise LockError(f"no lock file for {engine} {version} ({path}); locked versions: {known}")
    lock = read_lock_file(path)
    problems = lock_problems(lock, path)
    if problems:
        raise LockError("; ".join(problems))
    return lock


def lock_problems(lock: dict[str, Any], path: Path) -> list[str]:
    """Everything wrong with one lock file (empty when it is fine)."""
    problems = [f"{path.name}: missing key {key!r}" for key in REQUIRED_KEYS if key not in lock]
    if problems:
        return problems
    engine, version = lock["engine"], str(lock["version"])
    if path.name != f"{engine}-{version}.yml":
        problems.append(f"{path.name}: file name does not match engine {engine!r} version {version!r}")
    if not isinstance(lock["version"], str) or not EXACT_VERSION.match(version):
        problems.append(f"{path.name}: version must be an exact release as a string, got {lock['version']!r}")
    if not isinstance(lock["pinned"], bool):
        problems.append(f"{path.name}: pinned must be true or false")
    if not EXACT_VERSION.match(str(lock["torch"])):
        problems.append(f"{path.name}: torch must be an exact version, got {lock['torch']!r}")
    requirements = lock["requirements"]
    if not isinstance(requirements, list) or not requirements:
        problems.append(f"{path.name}: requirements must be a non-empty list")
    else:
        problems += [f"{path.name}: requirement {req!r} is not an exact pin (name==version)"
                     for req in requirements if not EXACT_REQUIREMENT.match(str(req))]
        pins = requirement_pins(requirements)
        if pins.get(normalize_name(engine)) != version:
            problems.append(f"{path.name}: requirements must pin {engine}=={version}")
        if pins.get("torch") != str(lock["torch"]):
            problems.append(f"{path.name}: requirements pin torch=={pins.get('torch')}, "
                            f"lock says {lock['torch']}")
        problems += hash_problems(lock, requirements, path)
    contract = lock["contract"]
    if not isinstance(contract, dict):
        problems.append(f"{path.name}: contract must be a mapping")
    else:
        problems += [f"{path.name}: contract lacks {key!r}" for key in CONTRACT_KEYS if key not in contract]
        if contract.get("engine") != f"{engine}=={version}":
            problems.append(f"{path.name}: contract.engine must be '{engine}=={version}'")
        if "+cpu" not in str(contract.get("torch", "")):
            problems.append(f"{path.name}: contract.torch must name a CPU build (a '+cpu' local version)")
    bench = lock["bench"]
    if not isinstance(bench, dict) or not {"module", "argv"} <= set(bench):
        problems.append(f"{path.name}: bench must be a mapping with 'module' and 'argv'")
    elif not {"workloads", "options", "switches"} <= set(bench) or \
            not {"sharegpt", "random"} <= set(bench["workloads"] or {}):
        problems.append(f"{path.name}: bench needs 'workloads' (sharegpt and random), 'options' and 'switches' "
                        "(plugins/filter/bench_argv.py builds the client's flags from them)")
    elif set(bench.get("endpoints") or {}) != set(bench["workloads"]):
        problems.append(f"{path.name}: bench needs 'endpoints', the route each workload's requests go to "
                        "(part of verify's baseline key)")
    elif "request_body" not in (bench["options"] or {}):
        unsent = [key for key in bench_sampling_keys() if key not in (bench["options"] or {})]
        if unsent:
            problems.append(f"{path.name}: bench needs a flag for each sampling parameter verify's sampled level may "
                            f"send, or a 'request_body' option to send them in; none for: {', '.join(unsent)}")
    return problems


def bench_sampling_keys() -> list[str]:
    """The sampling parameters verify's sampled benchmark level may send (`__verify_bench_sampling_keys`)."""
    variables = yaml.safe_load((REPO_ROOT / "roles" / "verify" / "vars" / "main.yml").read_text(encoding="utf-8"))
    return [str(key) for key in variables["__verify_bench_sampling_keys"]]


def hash_problems(lock: dict[str, Any], requirements: list[str], path: Path) -> list[str]:
    """The engine roles install `requirements` with `uv pip sync --require-hashes`, each line carrying the
    sha256 digests `hashes` lists under its name (scripts/lock-engine-hashes.py writes them)."""
    hashes = lock["hashes"]
    if not isinstance(hashes, dict):
        return [f"{path.name}: hashes must be a mapping of requirement name to sha256 digests"]
    names = [str(req).partition("==")[0].split("[", 1)[0] for req in requirements]
    problems = [f"{path.name}: requirement {name} has no sha256 in hashes (python3 scripts/lock-engine-hashes.py)"
                for name in names if not hashes.get(name)]
    problems += [f"{path.name}: hashes of {name} hold {digest!r}, not a sha256 hex digest"
                 for name, digests in hashes.items() for digest in (digests or []) if not SHA256.match(str(digest))]
    problems += [f"{path.name}: hashes name {name}, which requirements do not pin"
                 for name in hashes if name not in names]
    return problems


def normalize_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_pins(requirements: list[str]) -> dict[str, str]:
    """{normalized name: version} of `name[extras]==version` lines."""
    pins = {}
    for req in requirements:
        name, _, version = str(req).partition("==")
        pins[normalize_name(name.split("[", 1)[0])] = version
    return pins


def get_value(lock: dict[str, Any], dotted_key: str) -> Any:
    value: Any = lock
    for part in dotted_key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise LockError(f"{lock.get('engine')} {lock.get('version')}: no key {dotted_key!r}")
        value = value[part]
    return value


def requirements_from_pip_report(report: dict[str, Any]) -> list[str]:
    """`name==version` for every distribution a `pip install --dry-run --report` would install."""
    items = [(item["metadata"]["name"], item["metadata"]["version"]) for item in report["install"]]
    return [f"{name}=={version}" for name, version in sorted(items, key=lambda nv: normalize_name(nv[0]))]


def _print_value(value: Any) -> None:
    if isinstance(value, list):
        for item in value:
            print(item)
    elif isinstance(value, dict):
        print(json.dumps(value))
    elif isinstance(value, bool):
        print("true" if value else "false")
    else:
        print(value)


def main(argv: list[str]) -> int:
    try:
        match argv:
            case ["pinned", engine]:
                print(pinned_version(engine))
            case ["get", engine, version, key]:
                _print_value(get_value(load_lock(engine, version or None), key))
            case ["path", engine, version]:
                load_lock(engine, version)
                print(lock_path(engine, version))
            case ["from-pip-report", report_path]:
                report = json.loads(Path(report_path).read_text(encoding="utf-8"))
                print("requirements:")
                for line in requirements_from_pip_report(report):
                    print(f"  - {line}")
            case _:
                print(__doc__, file=sys.stderr)
                return 2
    except LockError as exc:
        print(f"engine_locks: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
