"""Refuse unknown and mistyped inputs and invalid model profiles before any task changes anything.

One mechanism for every role and playbook. The source of truth is the roles' meta/argument_specs.yml:

- Every variable of the host (inventory, -e, facts) whose name starts with a role prefix (an engine role's,
  ``verify_``, ...) or a reserved playbook prefix (``engine_``, ``deploy_``, ``teardown_``), or is exactly ``engine``
  or ``release``, must be an option of some role's argument spec (the union over roles and entry points), or a fact a
  role itself sets (``set_fact``/``register`` in its tasks). The playbook-level inputs without a role
  prefix (``engine``, ``engine_profile``, ``engine_profiles``, ``engine_units``, ``deploy_batch_size``,
  ``model_store_hosts``, ...) are the options of ``roles/input_check``'s ``main`` entry point.
- The value of each option the user set is checked against that option's type and choices.
- Each model profile is checked against one nested schema, the ``profile`` entry point of
  ``roles/input_check/meta/argument_specs.yml`` together with the ``profile`` entry point of each engine role (its
  own keys): required keys, types, choices, unknown keys refused.
- What is engine-specific (the flags that carry keys, the flags reserved to variables, the variables that must
  differ) comes from the engine roster, ``meta/engines.yml``; argument-spec choices written as a roster query are
  resolved against it.
- What the engine finally runs with is looked at too (plugins/plugin_utils/engine_inputs.py): every key of the
  option mappings (a profile's ``<engine>_options``, ``<engine>_extra_options``, ``<engine>_default_options``) is a
  flag of the engine's pinned parser (the role's ``files/flags-<version>.txt``), none is a flag the role sets from a
  variable (``host``, ``port``) or one that takes a guard away, and no variable of ``<engine>_environment`` or
  ``<engine>_extra_environment`` takes one away (the role's ``files/guarded_inputs.yml``).

Play variables and role defaults are ours, not the user's: only the host's variables are read
(``hostvars``: inventory, extra vars, facts), so a play's ``vars:`` never trips the check.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import posixpath
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

try:  # the plugin runs inside Ansible; the pure functions below are tested without it
    from ansible.errors import AnsibleError
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
    from ansible.module_utils.errors import UnsupportedError
    from ansible.plugins.action import ActionBase
except ImportError:  # pragma: no cover
    ActionBase = object  # type: ignore[assignment,misc]

from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_inputs import (
    EngineInputs,
    GuardFileError,
    environment_problems,
    flag_key,
    load_engine_inputs,
    option_problems,
)
from ansible_collections.blackwell.serving.plugins.plugin_utils.engine_roster import RosterError, load_roster
from ansible_collections.blackwell.serving.plugins.plugin_utils.parallel_layout import engine_problems, general_problems

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"
CHECK_ROLE = "input_check"
PROFILE_ENTRY_POINT = "profile"
# Names of playbook inputs have these prefixes or this exact name; a typo of one of them is caught too.
RESERVED_PREFIXES = ("engine_", "deploy_", "teardown_")
RESERVED_NAMES = ("engine", "release")
MAGIC_PREFIXES = ("ansible_", "__")
# The example inventory's hosts (inventory/production/hosts.yml, the default of ansible.cfg): placeholders that
# resolve nowhere. A play against them would end in "Could not resolve hostname" at its first task on the host.
PLACEHOLDER_HOST = re.compile(r"^gpu\d+\.example\.internal$")


@dataclass
class Catalog:
    """What the roles accept (options with their spec), what they set themselves, and the prefixes."""

    options: dict[str, tuple[str, dict]] = field(default_factory=dict)  # name -> (role, option spec)
    outputs: dict[str, str] = field(default_factory=dict)  # name -> role that sets it
    prefixes: dict[str, str] = field(default_factory=dict)  # prefix -> role (or "playbook")
    profile_schema: dict = field(default_factory=dict)


# libyaml's loader where PyYAML has it: the catalog reads every role's tasks on each playbook start (0.3 s
# with the pure-Python loader, 0.05 s with libyaml).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _yaml(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=_LOADER) if path.is_file() else None


def _task_outputs(node: Any) -> set[str]:
    """Names a task list sets for later tasks: set_fact keys and register names."""
    found: set[str] = set()
    if isinstance(node, list):
        for item in node:
            found |= _task_outputs(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "register" and isinstance(value, str):
                found.add(value)
            elif key in ("set_fact", "ansible.builtin.set_fact") and isinstance(value, dict):
                found |= {k for k in value if k != "cacheable"}
            elif key in ("block", "rescue", "always"):
                found |= _task_outputs(value)
    return found


def load_catalog(roles_dir: Path = ROLES_DIR) -> Catalog:
    catalog = Catalog()
    for role_dir in sorted(p for p in roles_dir.iterdir() if p.is_dir()):
        role = role_dir.name
        specs = (_yaml(role_dir / "meta" / "argument_specs.yml") or {}).get("argument_specs", {})
        catalog.prefixes[f"{role}_"] = role
        # The profile schema: input_check's `profile` entry point and each engine role's (its own keys).
        catalog.profile_schema.update(specs.get(PROFILE_ENTRY_POINT, {}).get("options") or {})
        specs = {k: v for k, v in specs.items() if k != PROFILE_ENTRY_POINT}
        for entry_point in specs.values():
            for name, spec in (entry_point.get("options") or {}).items():
                catalog.options.setdefault(name, (role, spec))
        for tasks_file in sorted((role_dir / "tasks").glob("*.yml")) + sorted((role_dir / "handlers").glob("*.yml")):
            for name in _task_outputs(_yaml(tasks_file)):
                catalog.outputs.setdefault(name, role)
    for prefix in RESERVED_PREFIXES:
        catalog.prefixes.setdefault(prefix, "playbook")
    return catalog


@lru_cache(maxsize=4)
def cached_catalog(roles_dir: str) -> Catalog:
    return load_catalog(Path(roles_dir))


def owner_of(name: str, catalog: Catalog) -> str | None:
    """The role (or "playbook") whose namespace a variable name is in; None when it is not ours."""
    if name in RESERVED_NAMES:
        return "playbook"
    matches = [p for p in catalog.prefixes if name.startswith(p)]
    return catalog.prefixes[max(matches, key=len)] if matches else None


def closest(name: str, candidates: list[str]) -> str | None:
    found = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
    return found[0] if found else None


def unknown_variables(names: list[str], catalog: Catalog) -> list[str]:
    """One message per variable in one of our namespaces that no role accepts or sets."""
    known = set(catalog.options) | set(catalog.outputs)
    messages = []
    for name in sorted(names):
        if name.startswith(MAGIC_PREFIXES) or name in known:
            continue
        owner = owner_of(name, catalog)
        if owner is None:
            continue
        where = "a playbook input" if owner == "playbook" else f"an option of role {owner}"
        hint = closest(name, sorted(catalog.options))
        messages.append(f"unknown variable {name}: not {where}" + (f" (did you mean {hint}?)" if hint else ""))
    return messages


# The one templated value argument specs hold: the engine roster's names as the choices of an engine option.
ROSTER_NAMES = "{{ query('blackwell.serving.engine_roster', 'name') }}"


def resolve_choices(spec: dict, roster: dict[str, dict]) -> dict:
    """The spec with roster-query choices replaced by the roster's names; any other templated choices fail."""
    choices = spec.get("choices")
    if not isinstance(choices, str):
        return spec
    if choices.strip() != ROSTER_NAMES:
        raise ValueError(f"choices {choices!r}: the only templated choices an argument spec may hold are "
                         f"{ROSTER_NAMES}")
    return {**spec, "choices": list(roster)}


def _strip_for_type_check(spec: dict, roster: dict[str, dict]) -> dict:
    """An option spec that checks type and choices of a given value only (defaults and requirements
    belong to the role entry)."""
    spec = resolve_choices(copy.deepcopy(spec), roster)
    for key in ("required", "default", "description", "version_added"):
        spec.pop(key, None)
    for sub in (spec.get("options") or {}).values():
        for key in ("description", "version_added"):
            sub.pop(key, None)
    return spec


def mistyped_variables(values: dict[str, Any], catalog: Catalog, roster: dict[str, dict]) -> list[str]:
    """One message per given option whose value does not fit its spec (type, choices, suboptions)."""
    messages = []
    for name in sorted(values):
        if name not in catalog.options:
            continue
        role, spec = catalog.options[name]
        result = ArgumentSpecValidator({name: _strip_for_type_check(spec, roster)}).validate({name: values[name]})
        secret = values[name] if spec.get("no_log") and isinstance(values[name], str) and values[name] else None
        for error in result.error_messages:
            messages.append(f"variable {name} (role {role}): {error.replace(secret, '********') if secret else error}")
    return messages


def _unknown_keys(value: Any, schema: dict, path: str) -> list[str]:
    """Keys of a (nested) profile that the schema does not name, with the closest known key."""
    if not isinstance(value, dict):
        return []
    messages = []
    for key in value:
        if key not in schema:
            hint = closest(str(key), sorted(schema))
            messages.append(f"unknown key {path}{key}" + (f" (did you mean {path}{hint}?)" if hint else ""))
        elif schema[key].get("options") and isinstance(value[key], dict):
            messages += _unknown_keys(value[key], schema[key]["options"], f"{path}{key}.")
    return messages


def _profile_rules(profile: dict, roster: dict[str, dict], inputs: EngineInputs) -> list[str]:
    """What types cannot say: ranges, absolute paths, speculation needs a drafter, the engines' option keys."""
    messages = general_problems(profile)
    if not 1 <= profile["port"] <= 65535:
        messages.append("port must be between 1 and 65535")
    for kind in ("model", "drafter"):
        if profile.get(kind):
            messages += _model_path_problems(kind, str(profile[kind]["path"]), roster)
    if profile.get("speculative") and not profile.get("drafter"):
        messages.append("speculative is set but drafter is null: speculation needs a drafter")
    if profile.get("trust_remote_code"):
        messages += _unpinned_remote_code(profile)
    options = {f"{engine}_options": profile.get(f"{engine}_options") for engine in roster}
    messages += keys_in_options(options, "the profile", roster)
    messages += option_problems(options, roster, inputs)
    return messages


# The model store chowns and chmods a model directory recursively as root: never one of these, nor a tree the host's
# software, devices or this collection's releases (their key files) live in.
SYSTEM_DIRECTORIES = frozenset(("/", "/var", "/var/lib", "/var/cache", "/home", "/root", "/opt", "/srv", "/tmp",
                                "/mnt", "/media"))
SYSTEM_TREES = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/dev", "/proc",
                "/sys", "/run", "/var/lib/llm-serving", "/var/log")


def _model_path_problems(kind: str, path: str, roster: dict[str, dict]) -> list[str]:
    if not path.startswith("/"):
        return [f"{kind}.path must be absolute, got {path}"]
    normal = posixpath.normpath(path)
    if normal != (path.rstrip("/") or "/") or path.startswith("//"):
        return [f"{kind}.path {path} is not a plain path (`.`, `..` or `//` in it): write it as {normal}"]
    # and each engine's service user's home (its JIT caches): /var/lib/<service_user>
    trees = (*SYSTEM_TREES, *(f"/var/lib/{entry['service_user']}" for entry in roster.values()))
    tree = next((t for t in trees if normal == t or normal.startswith(t + "/")), None)
    if normal in SYSTEM_DIRECTORIES or tree:
        where = f"under {tree}" if tree else "a system directory"
        return [f"{kind}.path {path} is {where}: the model store makes a model directory root-owned and readable "
                "by the engines, recursively, so it must be a directory of its own (for instance /srv/models/<name>)"]
    return []


def keys_in_options(options: dict[str, Any], where: str, roster: dict[str, dict]) -> list[str]:
    """A key among an engine's flags (the roster's secret_flags, in a profile's <engine>_options, the
    <engine>_extra_options variable, ...: the mapping's name starts with the engine's) would be kept in `where`,
    release.json and every report; keys are given by the engine's own no_log variables (root-only files).
    Option keys are compared as the engines' parsers may read them: `api_key` is `api-key`."""
    return [f"{name}.{key} is a secret: set {engine}_{flag.replace('-', '_')} (from a vault) instead; options are "
            f"kept in {where}, the release metadata and the reports"
            for name, value in options.items() if isinstance(value, dict)
            for engine in roster if name.startswith(f"{engine}_")
            for key in value
            for flag in roster[engine]["secret_flags"] if flag_key(key) == flag_key(flag)]


def same_secrets(given: dict[str, Any], roster: dict[str, dict]) -> list[str]:
    """Variables an engine's roster entry says must differ (SGLang's admin key is not its API key: every API
    client would be an admin again)."""
    messages = []
    for entry in roster.values():
        names = entry["distinct_secrets"]
        for index, first in enumerate(names):
            messages += [f"{first} equals {second}: {entry['name']} needs them to differ (one unlocks more than the "
                         "other); leave the second empty where the host makes one, or give it a value of its own"
                         for second in names[index + 1:] if given.get(first) and given.get(first) == given.get(second)]
    return messages


COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _unpinned_remote_code(profile: dict) -> list[str]:
    """trust_remote_code runs Python files of the checkpoint (the engine as its service user, the benchmark
    client too): from the Hub only at a commit, never at a branch or tag that can move under the same name."""
    messages = []
    for kind in ("model", "drafter"):
        source = (profile.get(kind) or {}).get("source") or {}
        if source.get("type") == "hf" and not COMMIT.match(str(source.get("revision") or "")):
            revision = f"'{source['revision']}'" if source.get("revision") else "not set (main)"
            messages.append(
                f"trust_remote_code is true, so the Python files of {source.get('repo')} run on the host, but "
                f"{kind}.source.revision is {revision}, not a commit id (a branch or tag can move under the same "
                "name): set it to the 40-character commit id whose code you reviewed (the Hub's 'Files and "
                "versions' history)")
    return messages


def check_profile(name: str, profile: Any, schema: dict, roster: dict[str, dict],
                  inputs: EngineInputs | None = None) -> tuple[dict | None, list[str]]:
    """Validate one profile; return it with the defaults of optional keys filled in, and the errors. `inputs`: the
    engines' flag lists and guarded inputs (default: those of the engine roles' default versions)."""
    if not isinstance(profile, dict):
        return None, [f"profile {name}: must be a mapping, got {type(profile).__name__}"]
    messages = _unknown_keys(profile, schema, "")
    result = ArgumentSpecValidator(copy.deepcopy(schema)).validate(copy.deepcopy(profile))
    messages += [e.args[0] if e.args else str(e) for e in result.errors if not isinstance(e, UnsupportedError)]
    if not messages:
        normalized = result.validated_parameters
        messages += _profile_rules(normalized, roster, inputs or default_engine_inputs(roster))
        if normalized.get("tokenizer") is None:
            normalized["tokenizer"] = normalized["model"]["path"]
        for kind in ("model", "drafter"):  # a source keeps only the keys it was given (model_fetch's own defaults)
            if normalized.get(kind) and normalized[kind].get("source"):
                normalized[kind]["source"] = {k: v for k, v in normalized[kind]["source"].items() if v is not None}
        if not messages:
            return normalized, []
    return None, [f"profile {name}: {m}" for m in messages]


# A profile's name reaches the unit file (its header and Description=), release metadata and report paths.
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


# Line and paragraph separators: YAML (SGLang's config file) and Python's splitlines() break lines at them, as at
# U+0085 (NEL, among the C1 controls).
LINE_SEPARATORS = ("\u2028", "\u2029")


def control_characters(value: Any, path: str) -> list[str]:
    """Where a string of a (nested) value holds a control character: in a unit or config file a newline starts a
    new line that systemd or the engine reads as its own (an ExecStartPre=, or a key of SGLang's config, say)."""
    if isinstance(value, str):
        found = sorted({f"U+{ord(c):04X}" for c in value
                        if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in LINE_SEPARATORS})
        return [f"{path or 'value'} holds control characters ({', '.join(found)})"] if found else []
    if isinstance(value, dict):
        return [m for key, item in value.items() for m in control_characters(str(key), f"{path} key") +
                control_characters(item, f"{path}.{key}" if path else str(key))]
    if isinstance(value, list):
        return [m for index, item in enumerate(value) for m in control_characters(item, f"{path}[{index}]")]
    return []


def bad_profile_name(name: str) -> list[str]:
    if PROFILE_NAME.fullmatch(name):
        return []
    return [f"profile name {name!r} is not a plain name: letters, digits, '.', '_' and '-', at most 64, starting "
            "with a letter or digit (it names the unit's description, the release and the report folders)"]


def check_profiles(profiles: Any, schema: dict, roster: dict[str, dict],
                   inputs: EngineInputs | None = None) -> tuple[dict, list[str]]:
    if not isinstance(profiles, dict):
        return {}, [f"engine_profiles must be a mapping of profile name to profile, got {type(profiles).__name__}"]
    inputs = inputs or default_engine_inputs(roster)
    normalized, messages = {}, []
    for name, profile in profiles.items():
        refused = bad_profile_name(str(name)) or [f"profile {name}: {m}" for m in control_characters(profile, "")]
        if refused:
            messages += refused
            continue
        checked, errors = check_profile(str(name), profile, schema, roster, inputs)
        messages += errors
        if checked is not None:
            normalized[name] = checked
    return normalized, messages


def role_default(role: str, name: str, roles_dir: Path = ROLES_DIR) -> Any:
    """A variable's value in a role's defaults/main.yml (None without one)."""
    return (_yaml(roles_dir / role / "defaults" / "main.yml") or {}).get(name)


def default_engine_inputs(roster: dict[str, dict]) -> EngineInputs:
    """The engines' flag lists and guarded inputs at the versions their roles default to (`<engine>_version`)."""
    versions = {engine: role_default(entry["role"], f"{engine}_version") for engine, entry in roster.items()}
    return load_engine_inputs(roster, {engine: str(v) for engine, v in versions.items() if v is not None})


def roster_secret_problems(roster: dict[str, dict], catalog: Catalog) -> list[str]:
    """The variables the roster says hold an engine's keys (api_key_variable, distinct_secrets) must be options of
    the engine's role marked no_log: what is kept out of logs, reports and CI artifacts is found that way."""
    problems = []
    for engine, entry in roster.items():
        for key, name in [("api_key_variable", entry["api_key_variable"])] + [
                ("distinct_secrets", name) for name in entry["distinct_secrets"]]:
            role, spec = catalog.options.get(name, (None, {}))
            if role != entry["role"] or not spec.get("no_log"):
                problems.append(f"engine roster: {engine}.{key} names {name}, which is not an option of role "
                                f"{entry['role']} marked no_log (roles/{entry['role']}/meta/argument_specs.yml): a key "
                                "must be one of its role's no_log options")
    return problems


def placeholder_host(host: str, inventory_file: str | None) -> list[str]:
    """The host is the example inventory's placeholder: say which inventory that is and how to name one's own."""
    if not PLACEHOLDER_HOST.match(host):
        return []
    source = inventory_file or "the example inventory"
    return [f"{host} is a placeholder of the example inventory ({source}, the default of ansible.cfg): run with "
            "-i <your inventory> (-i inventory/sandbox for the local sandbox), or name your GPU servers in it"]


def missing_profile(name: str, profiles: dict, variable: str) -> list[str]:
    if name in profiles:
        return []
    hint = closest(name, sorted(profiles))
    return [f"{variable} {name} is not a profile of engine_profiles (known: {', '.join(sorted(profiles)) or 'none'})"
            + (f"; did you mean {hint}?" if hint else "")]


def engine_profile_problems(name: str, profile: dict, engine: str, roster: dict[str, dict]) -> list[str]:
    """What the engine that is to serve the profile refuses of it: its parallel layout, by the roster's rules."""
    if engine not in roster:
        return [f"engine {engine} is not in the engine roster (known: {', '.join(roster)})"]
    return [f"profile {name} on {engine}: {m}" for m in engine_problems(profile, roster[engine])]


class ActionModule(ActionBase):
    """See the module docstring; options: variables (bool), profiles (dict), profile (str), engine (str: the
    engine that serves `profile`, whose own rules then apply to it too)."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("variables", "profiles", "profile", "engine"))

    def _host_variables(self, task_vars: dict) -> tuple[dict, dict]:
        """The host's own variables: names → raw values, and a reader that templates one on demand."""
        host = task_vars["inventory_hostname"]
        return task_vars["hostvars"].raw_get(host), task_vars["hostvars"][host]

    def _given_values(self, names: list[str], catalog: Catalog, templated: Any) -> dict[str, Any]:
        values = {}
        for name in names:
            if name not in catalog.options:
                continue
            try:
                values[name] = templated[name]
            except AnsibleError:
                continue  # refers to a role default: the role's own argument check sees it at entry
        return values

    def _engine_versions(self, roster: dict[str, dict], task_vars: dict) -> dict[str, str]:
        """Each engine's version (`<engine>_version`): the host's or play's value, else its role's default."""
        versions = {}
        for engine, entry in roster.items():
            name = f"{engine}_version"
            value = role_default(entry["role"], name)
            if name in task_vars:
                with contextlib.suppress(AnsibleError):  # the role's own argument check names it
                    value = self._templar.template(task_vars[name])
            if value is not None:
                versions[engine] = str(value)
        return versions

    def _profile_errors(self, args: dict, task_vars: dict, catalog: Catalog, roster: dict[str, dict],
                        inputs: EngineInputs) -> tuple[dict, list[str]]:
        """The profiles as checked (optional keys filled in) and what is wrong with them, with the requested profile
        (`profile`) checked by the rules of the engine that serves it (`engine`)."""
        profiles = args.get("profiles", task_vars.get("engine_profiles"))
        if profiles is None:
            return {}, ([f"profile {args['profile']} requested but engine_profiles is not defined"]
                        if args.get("profile") is not None else [])
        profiles = self._templar.template(profiles)
        normalized, errors = check_profiles(profiles, catalog.profile_schema, roster, inputs)
        if args.get("variables", True) and isinstance(profiles, dict) and "engine_profile" in task_vars:
            errors += missing_profile(str(self._templar.template(task_vars["engine_profile"])), profiles,
                                      "engine_profile")
        if args.get("profile") is not None and not errors:
            errors += missing_profile(str(args["profile"]), profiles, "profile")
            if not errors and args.get("engine") is not None:
                errors += engine_profile_problems(str(args["profile"]), normalized[args["profile"]],
                                                  str(args["engine"]), roster)
        return normalized, errors

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = self._task.args
        catalog = cached_catalog(str(ROLES_DIR))
        try:
            roster = load_roster()
        except RosterError as exc:
            result.update(failed=True, msg=f"1 input error(s), nothing was changed:\n{exc}")
            return result
        errors = roster_secret_problems(roster, catalog)
        if errors:
            result.update(failed=True, msg=f"{len(errors)} input error(s), nothing was changed:\n" + "\n".join(errors))
            return result
        errors = placeholder_host(str(task_vars.get("inventory_hostname", "")), task_vars.get("inventory_file"))
        if errors:
            # The one point: an inventory of one's own. What else the example's settings lack (the profiles'
            # revisions, say) is found when the play runs against it.
            result.update(failed=True, msg=f"1 input error, nothing was changed:\n{errors[0]}")
            return result

        try:
            inputs = load_engine_inputs(roster, self._engine_versions(roster, task_vars))
        except GuardFileError as exc:
            result.update(failed=True, msg=f"1 input error(s), nothing was changed:\n{exc}")
            return result

        if args.get("variables", True):
            raw, templated = self._host_variables(task_vars)
            names = [n for n in raw if owner_of(n, catalog) or n in RESERVED_NAMES]
            errors += unknown_variables(names, catalog)
            given = self._given_values(names, catalog, templated)
            errors += mistyped_variables(given, catalog, roster)
            # Strings reach unit files, config files and command lines: a control character is never meant.
            errors += [m for name, value in sorted(given.items()) for m in control_characters(value, name)]
            errors += same_secrets(given, roster)
            options = {n: v for n, v in given.items() if n.endswith("_options")}
            errors += keys_in_options(options, "the inventory", roster)
            errors += option_problems(options, roster, inputs)
            errors += environment_problems(given, roster, inputs)
            if "engine_profile" in raw:
                errors += bad_profile_name(str(self._templar.template(raw["engine_profile"])))

        normalized, profile_errors = self._profile_errors(args, task_vars, catalog, roster, inputs)
        errors += profile_errors
        if errors:
            result.update(failed=True,
                          msg=f"{len(errors)} input error(s), nothing was changed:\n" + "\n".join(errors))
            return result
        result.update(changed=False, profiles=normalized, msg="inputs ok")
        if args.get("profile") is not None:
            result["profile"] = normalized[args["profile"]]
        return result
