# Engine patch sets: selection by engine version, exact application into an installed site-packages tree,
# atomic replacement with backups, compile + import verification in the engine's own interpreter, rollback.
# Standard library only (version ranges use `packaging` where the interpreter has it): this runs on the target
# host inside an Ansible module.
"""Apply, detect and revert patch sets against an installed Python engine."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from ansible_collections.blackwell.serving.plugins.module_utils.patch import runner as bws_patch_runner
from ansible_collections.blackwell.serving.plugins.module_utils.patch.unidiff import (
    FilePatch,
    HunkMismatchError,
    PatchFormatError,
    apply,
    parse,
    render,
)

APPLIED = "applied"
ALREADY_APPLIED = "already-applied"
NOT_NEEDED = "not-needed"
REFUSED = "refused"
REVERTED = "reverted"
NOT_APPLIED = "not-applied"


class PatchSetError(Exception):
    """A refusal or failure that leaves the tree as it was; `details` goes into the module result."""

    def __init__(self, msg: str, **details):
        super().__init__(msg)
        self.msg = msg
        self.details = details


# ---------------------------------------------------------------------------------------------------------
# Versions. PEP 440 through `packaging` (the maintained implementation) wherever the interpreter has it: the
# controller, and every engine venv (pip, torch and the engines depend on it). A bare system Python on the
# target may lack it: there the subset below, which agrees with `packaging` on every form engine releases use
# (N.N.N, aN/bN/rcN, .postN, .devN, +local; tests/unit/test_python_patch.py compares the two).
# Pre-releases and dev builds count as inside a range (an engine built from a dev tag is still that engine).

try:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover - depends on the interpreter
    SpecifierSet = None

_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|rc)(\d+))?(?:[-_.]?post(\d+))?(?:[-_.]?dev(\d+))?"
                      r"(?:\+[A-Za-z0-9.]+)?$")
_PRE_ORDER = {"a": 0, "b": 1, "rc": 2}


def parse_version(text: str) -> tuple:
    match = _VERSION.match(text.strip())
    if not match:
        raise PatchSetError(f"cannot parse version '{text}'")
    release = tuple(int(part) for part in match.group(1).split("."))
    release += (0,) * (4 - len(release))
    pre, post, dev = match.group(2), match.group(4), match.group(5)
    # dev releases sort before pre-releases, which sort before the release, which sorts before posts.
    if pre is not None:
        pre_key = (_PRE_ORDER[pre], int(match.group(3)))
    elif dev is not None and post is None:
        pre_key = (-1, 0)
    else:
        pre_key = (3, 0)
    post_key = int(post) if post is not None else -1
    dev_key = int(dev) if dev is not None else float("inf")
    return (release, pre_key, post_key, dev_key)


def _is_final(key: tuple) -> bool:
    return key[1] == (3, 0) and key[2] == -1 and key[3] == float("inf")


def _clause_holds(key: tuple, op: str, bound: tuple) -> bool:
    # PEP 440's exclusive comparisons: `<V` admits no pre-release of V, `>V` no post-release of V (unless V is one).
    same_release = key[0] == bound[0]
    if op == "<" and same_release and _is_final(bound):
        return False
    if op == ">" and same_release and _is_final(bound) and key > bound:
        return False
    return {">=": key >= bound, "<=": key <= bound, ">": key > bound, "<": key < bound,
            "==": key == bound, "!=": key != bound}[op]


def _clauses(specifier: str) -> list[tuple[str, str]]:
    # Manifests keep to these six operators, so that a target without `packaging` reads every manifest the same.
    clauses = []
    for clause in (c.strip() for c in specifier.split(",") if c.strip()):
        match = re.match(r"^(>=|<=|==|!=|>|<)\s*(\S+)$", clause)
        if not match:
            raise PatchSetError(f"unsupported version clause '{clause}' in '{specifier}'")
        clauses.append((match.group(1), match.group(2)))
    return clauses


def _subset_holds(version: str, clauses: list[tuple[str, str]]) -> bool:
    key = parse_version(version)
    return all(_clause_holds(key, op, parse_version(bound)) for op, bound in clauses)


def version_in_subset(version: str, specifier: str) -> bool:
    """The standard-library fallback of `version_in`."""
    return _subset_holds(version, _clauses(specifier))


def version_in(version: str, specifier: str) -> bool:
    """True when `version` satisfies every clause of a specifier such as '>=0.17.0,<0.18'."""
    clauses = _clauses(specifier)
    if SpecifierSet is None:
        return _subset_holds(version, clauses)
    try:
        return SpecifierSet(",".join(op + bound for op, bound in clauses)).contains(Version(version),
                                                                                    prereleases=True)
    except InvalidSpecifier as error:
        raise PatchSetError(f"unsupported version clause in '{specifier}': {error}") from None
    except InvalidVersion:
        raise PatchSetError(f"cannot parse version '{version}'") from None


# ---------------------------------------------------------------------------------------------------------
# The manifest (patchset.yml, already loaded into a dict).

@dataclass
class Condition:
    path: str
    contains: str | None = None
    lacks: str | None = None

    def holds(self, text: str | None) -> bool:
        if text is None:
            return False
        if self.contains is not None and self.contains not in text:
            return False
        return not (self.lacks is not None and self.lacks in text)

    def describe(self) -> str:
        what = f"contains {self.contains!r}" if self.contains is not None else f"lacks {self.lacks!r}"
        return f"{self.path} {what}"


@dataclass
class PatchEntry:
    file: str
    description: str
    touches: list[str]
    upstream_fixed_if: list[Condition]
    parsed: list[FilePatch] = field(default_factory=list)


@dataclass
class Verification:
    preamble: str = ""
    imports: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    assertions: list[dict] = field(default_factory=list)


@dataclass
class PatchSet:
    name: str
    engine: str
    distribution: str
    applies_to: str
    not_needed_from: str | None
    patches: list[PatchEntry]
    verify: Verification
    directory: str

    @property
    def touched(self) -> list[str]:
        paths: list[str] = []
        for entry in self.patches:
            for file_patch in entry.parsed:
                if file_patch.path not in paths:
                    paths.append(file_patch.path)
        return paths

    def file_patches(self) -> list[FilePatch]:
        return [fp for entry in self.patches for fp in entry.parsed]


def _require(mapping: dict, key: str, kind: type, where: str):
    if key not in mapping:
        raise PatchSetError(f"{where}: missing required key '{key}'")
    value = mapping[key]
    if not isinstance(value, kind):
        raise PatchSetError(f"{where}: '{key}' must be a {kind.__name__}, got {type(value).__name__}")
    return value


_MANIFEST_KEYS = {"name", "description", "engine", "distribution", "applies_to", "not_needed_from", "strip",
                  "patches", "verify"}
_PATCH_KEYS = {"file", "description", "touches", "upstream_fixed_if"}
_VERIFY_KEYS = {"preamble", "imports", "names", "assertions"}


def _check_keys(mapping: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise PatchSetError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def load_patchset(directory: str, manifest: dict) -> PatchSet:
    """Validate a manifest and parse its patch files (which live in `directory`)."""
    if not isinstance(manifest, dict):
        raise PatchSetError("the patch set manifest must be a mapping")
    _check_keys(manifest, _MANIFEST_KEYS, "patchset.yml")
    name = _require(manifest, "name", str, "patchset.yml")
    strip = manifest.get("strip", 1)
    entries = []
    for index, raw in enumerate(_require(manifest, "patches", list, "patchset.yml"), start=1):
        where = f"patchset.yml patches[{index}]"
        if not isinstance(raw, dict):
            raise PatchSetError(f"{where}: must be a mapping")
        _check_keys(raw, _PATCH_KEYS, where)
        conditions = []
        for cond in raw.get("upstream_fixed_if", []):
            _check_keys(cond, {"path", "contains", "lacks"}, f"{where} upstream_fixed_if")
            if ("contains" in cond) == ("lacks" in cond):
                raise PatchSetError(f"{where} upstream_fixed_if: give exactly one of 'contains' or 'lacks'")
            conditions.append(Condition(_require(cond, "path", str, where), cond.get("contains"),
                                        cond.get("lacks")))
        entry = PatchEntry(_require(raw, "file", str, where), raw.get("description", ""),
                           list(_require(raw, "touches", list, where)), conditions)
        patch_path = os.path.join(directory, entry.file)
        try:
            with open(patch_path, encoding="utf-8") as handle:
                entry.parsed = parse(handle.read(), strip=strip)
        except OSError as exc:
            raise PatchSetError(f"{where}: cannot read {patch_path}: {exc.strerror}") from exc
        except PatchFormatError as exc:
            raise PatchSetError(f"{entry.file}: {exc}") from exc
        declared, actual = sorted(entry.touches), sorted({fp.path for fp in entry.parsed})
        if declared != actual:
            raise PatchSetError(f"{entry.file}: 'touches' says {declared} but the patch touches {actual}")
        entries.append(entry)
    if not entries:
        raise PatchSetError("patchset.yml: 'patches' is empty")
    raw_verify = manifest.get("verify", {})
    _check_keys(raw_verify, _VERIFY_KEYS, "patchset.yml verify")
    verify = Verification(raw_verify.get("preamble", ""), list(raw_verify.get("imports", [])),
                          dict(raw_verify.get("names", {})), [])
    for assertion in raw_verify.get("assertions", []):
        item = {"that": assertion} if isinstance(assertion, str) else dict(assertion)
        _check_keys(item, {"that", "msg"}, "patchset.yml verify.assertions")
        _require(item, "that", str, "patchset.yml verify.assertions")
        verify.assertions.append(item)
    not_needed_from = manifest.get("not_needed_from")
    patchset = PatchSet(name, _require(manifest, "engine", str, "patchset.yml"),
                        manifest.get("distribution", manifest["engine"]),
                        _require(manifest, "applies_to", str, "patchset.yml"),
                        str(not_needed_from) if not_needed_from is not None else None, entries, verify,
                        directory)
    version_in("0.0.0", patchset.applies_to)  # fails early on a malformed specifier
    return patchset


# ---------------------------------------------------------------------------------------------------------
# Running the engine's interpreter.

def runner_source() -> str:
    """plugins/module_utils/patch/runner.py's source, as the engine's interpreter runs it (``python -c``): it is
    packed
    with this module (AnsiballZ) and read back from there."""
    return inspect.getsource(bws_patch_runner)


def run_in_engine(python: str, spec: dict, env: dict | None = None, timeout: float = 600) -> dict:
    """Run the compile/import/assert runner in the engine's interpreter; returns its JSON report."""
    with tempfile.TemporaryDirectory(prefix="bws-patch-") as work:
        spec_path, out_path = os.path.join(work, "spec.json"), os.path.join(work, "out.json")
        with open(spec_path, "w", encoding="utf-8") as handle:
            json.dump(spec, handle)
        full_env = dict(os.environ)
        full_env.pop("PYTHONPATH", None)
        full_env.update(env or {})
        try:
            proc = subprocess.run([python, "-c", runner_source(), spec_path, out_path], capture_output=True,
                                  text=True, env=full_env, timeout=timeout, check=False, cwd=work)
        except FileNotFoundError as exc:
            raise PatchSetError(f"engine interpreter not found: {python}") from exc
        except subprocess.TimeoutExpired as exc:
            raise PatchSetError(f"verification in {python} did not finish within {timeout:.0f} s") from exc
        if proc.returncode != 0 or not os.path.exists(out_path):
            raise PatchSetError(f"verification runner failed in {python} (rc {proc.returncode})",
                                stderr=proc.stderr[-4000:])
        with open(out_path, encoding="utf-8") as handle:
            report = json.load(handle)
        report["stderr_tail"] = proc.stderr[-2000:]
        return report


def discover(python: str, distribution: str) -> tuple[str, str]:
    """(installed version, site directory) of `distribution` as the engine's interpreter sees it."""
    code = ("import importlib.metadata as m, json, sys; d = m.distribution(sys.argv[1]); "
            "print(json.dumps([d.version, str(d.locate_file(''))]))")
    try:
        proc = subprocess.run([python, "-c", code, distribution], capture_output=True, text=True, check=False,
                              timeout=120)
    except FileNotFoundError as exc:
        raise PatchSetError(f"engine interpreter not found: {python}") from exc
    if proc.returncode != 0:
        raise PatchSetError(f"{distribution} is not installed for {python}",
                            stderr=proc.stderr.strip().splitlines()[-1:])
    version, site = json.loads(proc.stdout.strip().splitlines()[-1])
    return version, site


# ---------------------------------------------------------------------------------------------------------
# Files on disk.

def sha256(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_tree(site: str, paths: list[str]) -> dict[str, str | None]:
    files: dict[str, str | None] = {}
    for rel in paths:
        full = os.path.join(site, rel)
        try:
            with open(full, encoding="utf-8", newline="") as handle:
                files[rel] = handle.read()
        except FileNotFoundError:
            files[rel] = None
        except (OSError, UnicodeDecodeError) as exc:
            raise PatchSetError(f"cannot read {full}: {exc}") from exc
    return files


def _write_temp_beside(target: str, text: str, like: str | None) -> str:
    directory = os.path.dirname(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".bws-tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if like is not None:
            shutil.copymode(like, tmp)
            stat = os.stat(like)
            if hasattr(os, "chown") and os.geteuid() == 0:
                os.chown(tmp, stat.st_uid, stat.st_gid)
        else:
            os.chmod(tmp, 0o644)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def replace_files(site: str, new_files: dict[str, str | None], old_files: dict[str, str | None]) -> None:
    """Write every file to a temp file first, then rename them all; undo the renames if one fails."""
    temps: dict[str, str] = {}
    try:
        for rel, text in new_files.items():
            if text is not None:
                full = os.path.join(site, rel)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                temps[rel] = _write_temp_beside(full, text, full if old_files.get(rel) is not None else None)
        done: list[str] = []
        try:
            for rel, text in new_files.items():
                full = os.path.join(site, rel)
                if text is None:
                    os.unlink(full)
                else:
                    os.replace(temps[rel], full)
                    del temps[rel]
                done.append(rel)
        except OSError:
            restore_files(site, {rel: old_files[rel] for rel in done})
            raise
    finally:
        for tmp in temps.values():
            if os.path.exists(tmp):
                os.unlink(tmp)


def restore_files(site: str, originals: dict[str, str | None]) -> None:
    for rel, text in originals.items():
        full = os.path.join(site, rel)
        if text is None:
            if os.path.exists(full):
                os.unlink(full)
            continue
        tmp = _write_temp_beside(full, text, full if os.path.exists(full) else None)
        os.replace(tmp, full)


def clear_pycache(site: str, paths: list[str]) -> list[str]:
    """Remove the __pycache__ directory of every package a touched file lives in."""
    cleared = []
    for directory in sorted({os.path.dirname(os.path.join(site, rel)) for rel in paths}):
        cache = os.path.join(directory, "__pycache__")
        if os.path.isdir(cache):
            shutil.rmtree(cache)
            cleared.append(cache)
    return cleared


def write_backup(state_dir: str, patchset: PatchSet, originals: dict[str, str | None]) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    backup_dir = os.path.join(state_dir, patchset.name, "backups", f"{stamp}-{os.getpid()}")
    for rel, text in originals.items():
        if text is None:
            continue
        full = os.path.join(backup_dir, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
    return backup_dir


def state_file(state_dir: str, patchset: PatchSet) -> str:
    return os.path.join(state_dir, f"{patchset.name}.json")


def read_state(state_dir: str, patchset: PatchSet) -> dict:
    try:
        with open(state_file(state_dir, patchset), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def write_state(state_dir: str, patchset: PatchSet, record: dict) -> None:
    os.makedirs(state_dir, exist_ok=True)
    path = state_file(state_dir, patchset)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------------
# Decisions.

@dataclass
class Plan:
    state: str
    msg: str
    version: str
    before: dict[str, str | None] = field(default_factory=dict)
    after: dict[str, str | None] = field(default_factory=dict)
    mismatch: HunkMismatchError | None = None
    upstream: list[dict] = field(default_factory=list)


def upstream_evidence(patchset: PatchSet, site: str) -> tuple[bool, list[dict]]:
    """Whether every patch's 'upstream already has this' condition holds in the installed files."""
    paths = sorted({c.path for e in patchset.patches for c in e.upstream_fixed_if})
    files = read_tree(site, paths)
    evidence, all_fixed = [], True
    for entry in patchset.patches:
        held = [c.describe() for c in entry.upstream_fixed_if if c.holds(files.get(c.path))]
        fixed = bool(held)
        all_fixed &= fixed
        evidence.append({"patch": entry.file, "upstream_has_fix": fixed, "because": held})
    return all_fixed, evidence


def plan(patchset: PatchSet, site: str, version: str, revert: bool = False) -> Plan:
    """Decide what to do with `patchset` for the engine installed in `site`; nothing is written."""
    in_range = version_in(version, patchset.applies_to)
    past_fix = (patchset.not_needed_from is not None
                and version_in(version, f">={patchset.not_needed_from}"))
    if not in_range and not past_fix:
        newer = f", or to >= {patchset.not_needed_from}, which has the fix upstream" \
            if patchset.not_needed_from else ""
        return Plan(REFUSED, f"{patchset.distribution} {version} is outside the range of patch set "
                             f"'{patchset.name}' ({patchset.applies_to}); its patches were made against "
                             f"those versions' files and are not applied to others. Move to a version in "
                             f"{patchset.applies_to}{newer}.", version)
    if past_fix and not in_range:
        fixed, evidence = upstream_evidence(patchset, site)
        if fixed or revert:
            return Plan(NOT_NEEDED, f"{patchset.distribution} {version} >= {patchset.not_needed_from} has "
                                    f"the fix upstream (confirmed in the installed files)", version,
                        upstream=evidence)
        missing = [e["patch"] for e in evidence if not e["upstream_has_fix"]]
        return Plan(REFUSED, f"{patchset.distribution} {version} should have the fix upstream (>= "
                             f"{patchset.not_needed_from}) but the installed files do not show it for "
                             f"{missing}; check the installation or the set's upstream_fixed_if markers",
                    version, upstream=evidence)
    before = read_tree(site, patchset.touched)
    series = patchset.file_patches()
    try:
        after = apply(before, series, reverse=revert)
    except HunkMismatchError as forward_error:
        try:
            apply(before, series, reverse=not revert)
        except HunkMismatchError:
            pass
        else:
            if revert:
                return Plan(NOT_APPLIED, f"patch set '{patchset.name}' is not applied", version,
                            before=before)
            return Plan(ALREADY_APPLIED, f"patch set '{patchset.name}' is already applied", version,
                        before=before)
        fixed, evidence = upstream_evidence(patchset, site)
        if fixed:
            return Plan(NOT_NEEDED, f"{patchset.distribution} {version} already contains the fix (upstream "
                                    f"or vendor backport); nothing to patch", version, upstream=evidence)
        return Plan(REFUSED, f"patch set '{patchset.name}' does not match {patchset.distribution} {version} "
                             f"exactly and is refused (no fuzz, no offsets):\n{forward_error.describe()}",
                    version, before=before, mismatch=forward_error, upstream=evidence)
    return Plan(REVERTED if revert else APPLIED,
                f"patch set '{patchset.name}' {'reverted' if revert else 'applied'}", version,
                before=before, after=after)


def diff_of(plan_: Plan) -> list[dict]:
    """Ansible's diff structure (what --diff shows), one entry per file."""
    return [{"before_header": rel, "after_header": rel,
             "before": plan_.before.get(rel) or "", "after": text or ""}
            for rel, text in plan_.after.items()]


def unified_diff(plan_: Plan) -> str:
    return "".join(render(rel, plan_.before.get(rel), text) for rel, text in plan_.after.items())


def expected_module_files(patchset: PatchSet, site: str) -> dict[str, str]:
    """Map the imports that correspond to touched files to the file they must be loaded from."""
    expected = {}
    for rel in patchset.touched:
        if rel.endswith(".py"):
            module = rel[:-3].replace("/", ".")
            if module.endswith(".__init__"):
                module = module[: -len(".__init__")]
            if module in patchset.verify.imports:
                expected[module] = os.path.join(site, rel)
    return expected


# ---------------------------------------------------------------------------------------------------------
# Doing it.

def verification_spec(patchset: PatchSet, site: str, with_assertions: bool) -> dict:
    return {"preamble": patchset.verify.preamble, "imports": patchset.verify.imports,
            "names": patchset.verify.names if with_assertions else {},
            "assertions": patchset.verify.assertions if with_assertions else [],
            "expected_files": expected_module_files(patchset, site)}


def _first_failure(report: dict) -> str:
    for section in ("compiled", "imports", "assertions"):
        for entry in report.get(section, []):
            if not entry.get("ok", True):
                label = entry.get("path") or entry.get("module") or entry.get("that")
                return f"{section[:-1] if section != 'compiled' else 'compile'} {label}: {entry.get('error')}"
    return "unknown failure"


def compile_check(python: str, after: dict[str, str | None], site: str, env: dict | None,
                  timeout: float) -> dict:
    sources = {os.path.join(site, rel): text for rel, text in after.items()
               if text is not None and rel.endswith(".py")}
    report = run_in_engine(python, {"compile": sources}, env, timeout)
    if not report["ok"]:
        raise PatchSetError(f"the patched files do not compile with {python}: {_first_failure(report)}; "
                            f"nothing was written", compile=report["compiled"])
    return report


def _confirm_applied(patchset: PatchSet, p: Plan, site: str, python: str, *, version: str, state_dir: str,
                     verify_env: dict | None, timeout: float) -> dict:
    """An applied set is verified again unless the record shows these exact files verified before."""
    recorded = read_state(state_dir, patchset)
    hashes = {rel: sha256(text) for rel, text in p.before.items()}
    if recorded.get("verified") and recorded.get("after_sha256") == hashes:
        return {"verified": True}
    report = run_in_engine(python, verification_spec(patchset, site, True), verify_env, timeout)
    if not report["ok"]:
        raise PatchSetError(f"patch set '{patchset.name}' is applied but its verification fails: "
                            f"{_first_failure(report)}", state=ALREADY_APPLIED, verification=report)
    write_state(state_dir, patchset, {**recorded, "patchset": patchset.name, "engine": patchset.engine,
                                      "engine_version": version, "after_sha256": hashes, "verified": True,
                                      "state": APPLIED})
    return {"verified": True, "verification": report}


def execute(patchset: PatchSet, site: str, python: str, version: str, state_dir: str, *,
            check_mode: bool = False, revert: bool = False, verify_env: dict | None = None,
            timeout: float = 600) -> dict:
    """Plan, then (outside check mode) write, verify in the engine's interpreter, and roll back on failure.

    Returns the module result; raises PatchSetError for refusals and failures, with the tree unchanged.
    """
    p = plan(patchset, site, version, revert=revert)
    result = {"changed": False, "state": p.state, "msg": p.msg, "engine": patchset.engine,
              "engine_version": version, "patchset": patchset.name, "site_packages": site,
              "files": [], "upstream": p.upstream, "verified": False, "pycache_cleared": [],
              "backup_dir": None, "diff": [], "unified_diff": ""}
    if p.state == REFUSED:
        details = {"state": REFUSED, "engine_version": version, "upstream": p.upstream}
        if p.mismatch is not None:
            details["failed_hunk"] = {"path": p.mismatch.path, "hunk": p.mismatch.hunk_number,
                                      "line": p.mismatch.line, "reason": p.mismatch.reason,
                                      "expected": p.mismatch.expected, "found": p.mismatch.found}
        raise PatchSetError(p.msg, **details)
    if p.state == ALREADY_APPLIED and not check_mode:
        result.update(_confirm_applied(patchset, p, site, python, version=version, state_dir=state_dir,
                                       verify_env=verify_env, timeout=timeout))
        return result
    if p.state not in (APPLIED, REVERTED):
        return result
    result["changed"] = True
    result["files"] = [{"path": rel, "before_sha256": sha256(p.before.get(rel)), "after_sha256": sha256(text)}
                       for rel, text in p.after.items()]
    result["diff"] = diff_of(p)
    result["unified_diff"] = unified_diff(p)
    result["compile"] = compile_check(python, p.after, site, verify_env, timeout)["compiled"]
    if check_mode:
        result["msg"] = f"would be {p.state}: " + p.msg
        return result
    originals = {rel: p.before.get(rel) for rel in p.after}
    try:
        backup_dir = write_backup(state_dir, patchset, originals)
    except OSError as exc:
        raise PatchSetError(f"cannot back up the files to {state_dir}: {exc}; nothing was written") from exc
    result["backup_dir"] = backup_dir
    try:
        replace_files(site, p.after, originals)
    except OSError as exc:
        raise PatchSetError(f"cannot write the patched files into {site}: {exc}; the originals are in place "
                            f"(backup in {backup_dir})", backup_dir=backup_dir) from exc
    try:
        result["pycache_cleared"] = clear_pycache(site, list(p.after))
        report = run_in_engine(python, verification_spec(patchset, site, not revert), verify_env, timeout)
        if not report["ok"]:
            raise PatchSetError(f"verification in the engine's interpreter failed after "
                                f"{'reverting' if revert else 'patching'}: {_first_failure(report)}",
                                verification=report)
    except BaseException as exc:
        _roll_back(site, originals, backup_dir)
        if isinstance(exc, PatchSetError):
            exc.msg += f"; rolled back, the files are byte-identical to before (backup kept in {backup_dir})"
            exc.details.update(state=REFUSED, rolled_back=True, backup_dir=backup_dir)
        raise
    result["verified"] = True
    result["verification"] = report
    write_state(state_dir, patchset, {
        "patchset": patchset.name, "engine": patchset.engine, "engine_version": version,
        "state": p.state, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "backup_dir": backup_dir,
        "before_sha256": {rel: sha256(t) for rel, t in originals.items()},
        "after_sha256": {rel: sha256(t) for rel, t in p.after.items()}, "verified": not revert})
    return result


def _roll_back(site: str, originals: dict[str, str | None], backup_dir: str) -> None:
    restore_files(site, originals)
    clear_pycache(site, list(originals))
    now = read_tree(site, list(originals))
    broken = [rel for rel in originals if sha256(now[rel]) != sha256(originals[rel])]
    if broken:
        raise PatchSetError(f"ROLLBACK INCOMPLETE for {broken}: restore them from {backup_dir}",
                            rolled_back=False, backup_dir=backup_dir)
