#!/usr/bin/env python3
"""Run one of this repository's playbooks through ansible-runner, the way CI should.

    python scripts/ci_playbook.py deploy_sglang.yml -i inventory/production \
        --artifacts out/ --extra-vars-file secrets.yml --redact-env SGLANG_API_KEY

- A throw-away private data dir; project_dir is this repository; artifacts are kept under --artifacts.
- Progress streams to stdout (one line per task result), the playbook's own output goes to the artifacts.
- Verify reports go under <artifacts>/<ident>/reports (-e verify_report_dir=DIR, inline or in a vars file,
  chooses another place; an inventory's verify_report_dir does not), and so does status.yml's fleet status,
  <artifacts>/<ident>/reports/status.json (-e engine_service_status_report_path=FILE).
- Each run keeps its artifacts in <artifacts>/<ident>/ (--ident, by default the start time, YYYYmmddTHHMMSS):
  it writes <artifacts>/<ident>/summary.json (per host: ok/changed/failed/rescued/skipped/unreachable, elapsed,
  verify report path) and <artifacts>/<ident>/junit.xml (one test case per host), and prints both paths.
- Secrets stay out of the artifacts: pass them in a vars file (-e @file, never copied), plain or
  vault-encrypted (--vault-password-file / --vault-id, passed on to ansible-playbook), or in the inventory's
  vault. ansible-runner records the environment it runs the playbook with (<artifacts>/<ident>/command), so it
  gets a minimal one: what Ansible, SSH and podman need (PATH, HOME, locale, TMPDIR, SSH_AUTH_SOCK, XDG_*,
  ANSIBLE_*, CONTAINERS_*, BWS_*, proxies), the environment variables the roles' secret options default to
  (HF_TOKEN), and the variables named with --pass-env or --redact-env; nothing else (CI tokens stay out).
- As a second line of defence these are scrubbed from every artifact file (verbatim, JSON- and repr-escaped and
  base64-encoded): the values of --redact-env variables, HF_TOKEN, proxy URLs with a password, the vault
  passwords, and, from the vars files, the inventory's variables and -e, every vault-encrypted value and the
  values of the secret variables - every role option marked no_log in roles/*/meta/argument_specs.yml, those
  named with --secret-var, and the variables their templates name ({{ vault_sglang_api_key }}). Ansible reads
  the files, decrypting with the run's vault secrets; a file or value it cannot read or decrypt refuses the run
  (exit 2) naming it, so a secret is never left unscrubbed because it was encrypted.
- Exit status: 0 when every host succeeded, 1 otherwise, 2 for usage errors and refused runs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[1]
# collections/ holds this checkout as the collection blackwell.serving: its Python imports as
# ansible_collections.blackwell.serving (the secret redaction below is the roles' own, from its module_utils).
if str(REPO / "collections") not in sys.path:
    sys.path.insert(0, str(REPO / "collections"))
STAT_KEYS = ("ok", "changed", "failures", "rescued", "skipped", "dark", "ignored")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("playbook", help="playbook path relative to the repository, e.g. verify.yml")
    parser.add_argument("-i", "--inventory", default="inventory/production", help="inventory path")
    parser.add_argument("--artifacts", default="artifacts/ci", help="directory that keeps the run's artifacts")
    parser.add_argument("--limit", help="host pattern, as ansible-playbook --limit")
    parser.add_argument("--check", action="store_true", help="run in check mode with --diff")
    parser.add_argument("--skip-tags", help="tags to skip, as ansible-playbook --skip-tags")
    parser.add_argument("-e", "--extra-var", action="append", default=[], metavar="KEY=JSON",
                        help="extra variable (value parsed as JSON when it parses); not for secrets")
    parser.add_argument("--extra-vars-file", action="append", default=[], help="vars file passed as -e @file")
    parser.add_argument("--redact-env", action="append", default=[], metavar="NAME",
                        help="environment variable passed to the playbook whose value is scrubbed from the artifacts")
    parser.add_argument("--pass-env", action="append", default=[], metavar="NAME",
                        help="environment variable passed to the playbook (not a secret: it is kept in the artifacts)")
    parser.add_argument("--secret-var", action="append", default=[], metavar="NAME",
                        help="variable whose value is scrubbed from the artifacts, besides the roles' no_log options")
    parser.add_argument("--vault-password-file", action="append", default=[], metavar="FILE",
                        help="vault password file, passed to ansible-playbook and used to read the vaulted secrets")
    parser.add_argument("--vault-id", action="append", default=[], metavar="ID",
                        help="vault identity (label@file), passed to ansible-playbook and used like the above")
    parser.add_argument("--ident", default=None, help="artifact sub-directory name (default: timestamp)")
    return parser.parse_args(argv)


def extravars_from(pairs: list[str]) -> dict:
    extravars = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--extra-var needs KEY=VALUE, got {pair!r}")
        try:
            extravars[key] = json.loads(raw)
        except json.JSONDecodeError:
            extravars[key] = raw
    return extravars


def print_progress(event: dict) -> bool:
    data = event.get("event_data", {})
    kind = event.get("event", "")
    if kind.startswith("runner_on_") and kind not in ("runner_on_start",):
        status = kind.removeprefix("runner_on_").upper()
        changed = " (changed)" if data.get("res", {}).get("changed") else ""
        print(f"[{status:>11}] {data.get('host', '?')}: {data.get('task', '')}{changed}", flush=True)
    elif kind == "playbook_on_play_start":
        print(f"=== play: {data.get('play', '')}", flush=True)
    return True


def verify_report_dir(result: object) -> str | None:
    """The report directory the verify role publishes as the fact verify_result.report_dir."""
    facts = result.get("ansible_facts") if isinstance(result, dict) else None
    published = (facts or {}).get("verify_result") if isinstance(facts, dict) else None
    return (published.get("report_dir") or None) if isinstance(published, dict) else None


def host_summaries(runner) -> dict[str, dict]:
    stats = runner.stats or {}
    hosts = sorted({host for key in STAT_KEYS for host in (stats.get(key) or {})})
    summary = {}
    for host in hosts:
        counts = {key: int((stats.get(key) or {}).get(host, 0)) for key in STAT_KEYS}
        counts["failed"] = counts.pop("failures")
        counts["unreachable"] = counts.pop("dark")
        summary[host] = {**counts, "status": "failed" if counts["failed"] or counts["unreachable"] else "ok",
                         "elapsed_s": None, "verify_report": None, "failed_tasks": []}
    first_last: dict[str, list[float]] = {}
    for event in runner.events:
        data = event.get("event_data", {})
        host = data.get("host")
        if host not in summary:
            continue
        for stamp in (data.get("start"), data.get("end")):
            if stamp:
                moment = datetime.fromisoformat(stamp).timestamp()
                span = first_last.setdefault(host, [moment, moment])
                span[0], span[1] = min(span[0], moment), max(span[1], moment)
        result = data.get("res") or {}
        report_dir = verify_report_dir(result)
        if report_dir:
            summary[host]["verify_report"] = report_dir
        if event.get("event") == "runner_on_failed" and not data.get("ignore_errors"):
            summary[host]["failed_tasks"].append({"task": data.get("task"), "msg": str(result.get("msg", ""))[:2000]})
    for host, (first, last) in first_last.items():
        summary[host]["elapsed_s"] = round(last - first, 1)
    return summary


def inventory_hosts(inventory: Path, limit: str | None) -> list[str]:
    """Every host the run could have reached, so hosts a stopped rollout never touched are reported too."""
    command = ["ansible-inventory", "-i", str(inventory), "--list"] + (["--limit", limit] if limit else [])
    listed = subprocess.run(command, capture_output=True, text=True, check=False,
                            env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")})
    if listed.returncode != 0:
        return []
    return sorted(json.loads(listed.stdout).get("_meta", {}).get("hostvars", {}))


def add_unreached(summary: dict[str, dict], hosts: list[str]) -> None:
    for host in hosts:
        summary.setdefault(host, {"status": "not reached", "elapsed_s": None, "verify_report": None,
                                  "failed_tasks": [], "note": "the run stopped before this host was touched"})


def write_junit(path: Path, playbook: str, summary: dict[str, dict]) -> None:
    failures = sum(1 for s in summary.values() if s["status"] == "failed")
    skipped = sum(1 for s in summary.values() if s["status"] == "not reached")
    suite = ET.Element("testsuite", name=playbook, tests=str(len(summary)), failures=str(failures),
                       skipped=str(skipped))
    for host, result in summary.items():
        case = ET.SubElement(suite, "testcase", classname=playbook, name=host,
                             time=str(result.get("elapsed_s") or 0))
        if result["status"] == "not reached":
            ET.SubElement(case, "skipped", message=result.get("note", "not reached"))
        elif result["status"] != "ok":
            tasks = result.get("failed_tasks") or [{"task": "unreachable or failed", "msg": ""}]
            failure = ET.SubElement(case, "failure", message=str(tasks[-1]["task"]))
            failure.text = "\n\n".join(f"{t['task']}: {t['msg']}" for t in tasks)
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)


# What the playbook may see of the controller's environment (names, or prefixes ending in "_"); the rest stays out of
# ansible-runner's record of it.
PASSED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_", "TZ", "TMPDIR", "TERM",
              "SSH_AUTH_SOCK", "KRB5CCNAME", "VIRTUAL_ENV", "XDG_", "ANSIBLE_", "CONTAINERS_", "BWS_")
PROXY_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


def runner_environment(environ: dict[str, str], pass_env: list[str], redact_env: list[str],
                       secret_env: tuple[str, ...] | None = None) -> dict[str, str]:
    """The controller's environment cut to what the playbook needs (see PASSED_ENV), the environment variables the
    roles' secret options default to (``secret_env``, by default from role_secrets()) and what was named."""
    secret_env = role_secrets().env if secret_env is None else secret_env
    named = set(pass_env) | set(redact_env) | set(secret_env) | set(PROXY_ENV)
    return {name: value for name, value in environ.items()
            if name in named or any(name == kept or (kept.endswith("_") and name.startswith(kept))
                                    for kept in PASSED_ENV)}


# --- what the artifacts must not hold --------------------------------------------------------------------------------

# lookup('ansible.builtin.env', 'HF_TOKEN') in an option's default: the environment variable it reads.
ENV_LOOKUP = re.compile(r"""lookup\(\s*['"](?:ansible\.builtin\.)?env['"]\s*,\s*['"]([A-Za-z_]\w*)['"]""")
TEMPLATE = re.compile(r"{{(.*?)}}|{%(.*?)%}", re.S)
# A name in a template expression: not an attribute (.x) and not the start of a quoted string.
TEMPLATE_NAME = re.compile(r"""(?<![\w.'"])[A-Za-z_]\w*""")


class RefusedError(Exception):
    """Something that may hold a secret cannot be read: the run is refused rather than left unscrubbed."""


class RoleSecrets(NamedTuple):
    """The roles' secret options (no_log in their argument specs) and the environment variables they default to."""

    names: frozenset[str]
    env: tuple[str, ...]


def holds_secret(option: object) -> bool:
    """An argument-spec option marked no_log, itself or in one of its suboptions."""
    if not isinstance(option, dict):
        return False
    return bool(option.get("no_log")) or any(holds_secret(sub) for sub in (option.get("options") or {}).values())


@functools.cache
def role_secrets(roles: Path = REPO / "roles") -> RoleSecrets:
    """Every role variable marked no_log in roles/*/meta/argument_specs.yml, and the environment variables their
    defaults read (model_store_hf_token: HF_TOKEN). There is no list of them here to fall behind the roles."""
    import yaml

    names: set[str] = set()
    env: set[str] = set()
    for path in sorted(roles.glob("*/meta/argument_specs.yml")):
        specs = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("argument_specs") or {}
        for entry in specs.values():
            for name, option in ((entry or {}).get("options") or {}).items():
                if holds_secret(option):
                    names.add(name)
                    env.update(ENV_LOOKUP.findall(str(option.get("default", ""))))
    return RoleSecrets(frozenset(names), tuple(sorted(env)))


class Vault(NamedTuple):
    """Ansible's loader and vault with the run's vault secrets: what ansible-playbook will read, read the same way."""

    loader: Any
    lib: Any
    passwords: list[str]


def _naming_loader() -> Any:
    from ansible.parsing.dataloader import DataLoader

    class NamingLoader(DataLoader):
        """Remembers the file it could not read: Ansible's vault errors do not name it."""

        unreadable: str | None = None

        def load_from_file(self, file_name: str, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().load_from_file(file_name, *args, **kwargs)
            except Exception:
                self.unreadable = str(file_name)
                raise

    return NamingLoader()


def open_vault(vault_ids: list[str], password_files: list[str]) -> Vault:
    """The vault secrets as ansible-playbook sets them up: the configured identities, then --vault-id and
    --vault-password-file (and ANSIBLE_VAULT_PASSWORD_FILE); never a prompt."""
    from ansible import constants
    from ansible.cli import CLI
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultLib, VaultSecretsContext

    loader = _naming_loader()
    try:
        secrets = CLI.setup_vault_secrets(loader, [*constants.DEFAULT_VAULT_IDENTITY_LIST, *vault_ids],
                                          list(password_files), ask_vault_pass=False, auto_prompt=False,
                                          initialize_context=False)
    except AnsibleError as exc:
        raise RefusedError(f"cannot read the vault password: {exc}") from exc
    loader.set_vault_secrets(secrets)
    if VaultSecretsContext.current(optional=True) is None:
        VaultSecretsContext.initialize(VaultSecretsContext(secrets))
    return Vault(loader, VaultLib(secrets), [secret.bytes.decode(errors="replace") for _, secret in secrets])


def cannot_read(path: object, exc: Exception, vault: Vault) -> RefusedError:
    """Refuse the run naming what could not be read, and why."""
    from ansible.parsing.vault import AnsibleVaultError

    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, AnsibleVaultError):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        why = f"cannot be read ({exc})"
    elif vault.passwords:
        why = f"is vault-encrypted and none of the vault passwords given decrypts it ({exc})"
    else:
        why = "is vault-encrypted and no vault password was given (--vault-password-file, --vault-id)"
    return RefusedError(f"{path} {why}: the secrets in it could not be scrubbed from the artifacts")


def read_vars_file(path: str, vault: Vault) -> dict[str, Any]:
    """A vars file as ansible-playbook reads ``-e @file``: YAML or JSON, whole-file or inline vault decrypted."""
    from ansible.errors import AnsibleError

    try:
        data = vault.loader.load_from_file(str(Path(path).resolve()))
    except AnsibleError as exc:
        raise cannot_read(path, exc, vault) from exc
    return dict(data) if isinstance(data, Mapping) else {}


class Inventory(NamedTuple):
    hosts: dict[str, dict[str, Any]]  # host -> its inventory variables (group_vars, host_vars), not templated
    ansible_names: frozenset[str]  # Ansible's own variables: reserved and magic names


def inventory_variables(inventory: Path, limit: str | None, vault: Vault) -> Inventory:
    """The variables of the run's hosts, as ansible-playbook reads them."""
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.vars.manager import VariableManager
    from ansible.vars.reserved import get_reserved_names

    try:
        inventory_manager = InventoryManager(loader=vault.loader, sources=[str(inventory)])
        if limit:
            inventory_manager.subset(limit)
        manager = VariableManager(loader=vault.loader, inventory=inventory_manager)
        hosts = inventory_manager.get_hosts()
        variables = {host.name: dict(manager.get_vars(host=host, include_hostvars=False)) for host in hosts}
    except AnsibleError as exc:
        raise cannot_read(vault.loader.unreadable or inventory, exc, vault) from exc
    magic = set(manager.get_vars(include_hostvars=False)).union(*(host.get_magic_vars() for host in hosts))
    return Inventory(variables, frozenset(magic | set(get_reserved_names())))


def users_variable(name: str, ansible_names: frozenset[str]) -> bool:
    """Not one of Ansible's own variables (inventory_hostname, groups, ansible_host ...): a template that uses one
    of those names no secret of the user's."""
    return name not in ansible_names and not name.startswith(("ansible_", "inventory_"))


def leaves(value: object) -> Iterator[object]:
    """The scalars of a value, through dicts and lists."""
    if isinstance(value, Mapping):
        for item in value.values():
            yield from leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from leaves(item)
    else:
        yield value


def plaintext(value: object, vault: Vault, source: str) -> str | None:
    """A scalar as text (an inline-vaulted one decrypted); None for what holds no secret text."""
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import EncryptedString, Origin, VaultHelper

    if isinstance(value, EncryptedString):
        try:
            return vault.lib.decrypt(VaultHelper.get_ciphertext(value, with_tags=False)).decode()
        except AnsibleError as exc:
            origin = Origin.get_tag(value)
            raise cannot_read(origin.path if origin and origin.path else source, exc, vault) from exc
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    return str(value) or None


def vaulted_values(variables: Mapping[str, Any], vault: Vault, source: str) -> list[str]:
    """Every inline-vaulted value (``!vault``): the user marked it secret, whatever its name."""
    from ansible.parsing.vault import EncryptedString

    return [text for leaf in leaves(variables) if isinstance(leaf, EncryptedString)
            and (text := plaintext(leaf, vault, source))]


def secret_values(variables: Mapping[str, Any], names: frozenset[str], vault: Vault, source: str,
                  ansible_names: frozenset[str]) -> list[str]:
    """The values of the secret-named variables, and of the variables their templates name, transitively: a key kept
    as ``sglang_api_key: "{{ vault_sglang_api_key }}"`` beside a vaulted ``vault_sglang_api_key``."""
    found: list[str] = []
    pending, seen = sorted(names & set(variables)), set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for leaf in leaves(variables[name]):
            text = plaintext(leaf, vault, source)
            if text:
                found.append(text)
                pending += [ref for ref in template_names(text)
                            if ref in variables and users_variable(ref, ansible_names)]
    return found


def template_names(text: str) -> set[str]:
    """The names a template in ``text`` uses ({{ vault_key }}, {{ a | default(b) }}: a, default, b)."""
    return {name for match in TEMPLATE.finditer(text) for name in TEMPLATE_NAME.findall("".join(match.groups("")))}


def variable_secrets(extra: list[tuple[str, Mapping[str, Any]]], inventory: Inventory, names: frozenset[str],
                     vault: Vault) -> list[str]:
    """Secrets of each vars file and -e on its own, and of each host's inventory variables with the extra vars over
    them (a template in one may name a variable of the other)."""
    found: list[str] = []
    for source, variables in extra:
        found += vaulted_values(variables, vault, source)
        found += secret_values(variables, names, vault, source, inventory.ansible_names)
    over = {name: value for _, variables in extra for name, value in variables.items()}
    for host, variables in inventory.hosts.items():
        source = f"the inventory's variables of {host}"
        found += vaulted_values(variables, vault, source)
        found += secret_values({**variables, **over}, names, vault, source, inventory.ansible_names)
    return found


def run_secrets(args: argparse.Namespace, environment: dict[str, str]) -> list[str]:
    """Every value this run's artifacts must not hold (see the docstring); RefusedError when one cannot be read."""
    roles = role_secrets()
    secrets = [environment[name] for name in (*args.redact_env, *roles.env) if environment.get(name)]
    secrets += [environment[name] for name in PROXY_ENV if "@" in environment.get(name, "")]  # user:password@
    vault = open_vault(args.vault_id, args.vault_password_file)
    extra = [(path, read_vars_file(path, vault)) for path in args.extra_vars_file]
    extra.append(("-e", extravars_from(args.extra_var)))
    inventory = inventory_variables((REPO / args.inventory).resolve(), args.limit, vault)
    names = roles.names | frozenset(args.secret_var)
    return secrets + vault.passwords + variable_secrets(extra, inventory, names, vault)


@contextlib.contextmanager
def environment_of(environment: dict[str, str]) -> Iterator[None]:
    """os.environ replaced by ``environment`` while in the block."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environment)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def playbook_options(args: argparse.Namespace, reports: Path) -> list[str]:
    """ansible-playbook's options besides inventory, limit and inline extra vars."""
    # The verify reports and status.yml's fleet status go with the run's artifacts. Extra variables (they outrank the
    # inventory's) given first, so that a vars file or an inline -e, both read after them, choose another place.
    options = ["-e " + shlex.quote(json.dumps({"verify_report_dir": str(reports),
                                               "engine_service_status_report_path": str(reports / "status.json")})),
               *(f"-e @{Path(f).resolve()}" for f in args.extra_vars_file)]
    if args.check:
        options.append("--check --diff")
    if args.skip_tags:
        options.append(f"--skip-tags {args.skip_tags}")
    return options + vault_options(args)


def vault_options(args: argparse.Namespace) -> list[str]:
    """--vault-id and --vault-password-file for ansible-playbook, their files as absolute paths."""
    ids = []
    for vault_id in args.vault_id:
        label, sep, source = vault_id.rpartition("@")
        if source not in ("prompt", "prompt_ask_vault_pass"):
            source = str(Path(source).resolve())
        ids.append(f"--vault-id {shlex.quote(label + sep + source)}")
    return ids + [f"--vault-password-file {shlex.quote(str(Path(f).resolve()))}" for f in args.vault_password_file]


def redact(directory: Path, secrets: list[str]) -> int:
    # The forms a secret takes in logs and payloads: the roles' own redaction (plugins/module_utils/secrets/redact.py).
    from ansible_collections.blackwell.serving.plugins.module_utils.secrets.redact import secret_forms

    forms = sorted({form for secret in secrets if secret for form in secret_forms(secret)}, key=len, reverse=True)
    scrubbed = 0
    for path in directory.rglob("*"):
        if not path.is_file():
            continue
        text = path.read_text(errors="surrogateescape")
        clean = text
        for form in forms:
            clean = clean.replace(form, "********")
        if clean != text:
            path.write_text(clean, errors="surrogateescape")
            scrubbed += 1
    return scrubbed


def main(argv: list[str]) -> int:
    args = parse_args(argv)  # before importing ansible-runner: --help and usage errors work with any python3
    try:
        import ansible_runner
    except ImportError:
        print(f"ansible-runner is not installed for {sys.executable}: run `bash scripts/bootstrap.sh` once, then "
              "`source scripts/env.sh` (it puts the project's venv first on PATH), then `python "
              "scripts/ci_playbook.py ...`", file=sys.stderr)
        return 2
    if not (REPO / args.playbook).is_file():
        print(f"no such playbook: {args.playbook}", file=sys.stderr)
        return 2
    artifacts = Path(args.artifacts).resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    ident = args.ident or datetime.now().strftime("%Y%m%dT%H%M%S")
    cmdline = playbook_options(args, artifacts / ident / "reports")
    environment = runner_environment(dict(os.environ), args.pass_env, args.redact_env)
    try:  # read as ansible-playbook will read them: its environment and this repository's ansible.cfg
        with environment_of({**environment, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}):
            secrets = run_secrets(args, environment)
    except RefusedError as exc:
        print(f"refused, nothing was run: {exc}", file=sys.stderr)
        return 2
    private = Path(tempfile.mkdtemp(prefix="ci-playbook-"))
    started = time.time()
    # ansible-runner starts from os.environ and writes what it passes into the artifacts: give it only that.
    try:
        with environment_of(environment):
            runner = ansible_runner.run(
                private_data_dir=str(private), project_dir=str(REPO), playbook=args.playbook,
                inventory=str((REPO / args.inventory).resolve()), limit=args.limit,
                extravars=extravars_from(args.extra_var), cmdline=" ".join(cmdline) or None,
                artifact_dir=str(artifacts), ident=ident, suppress_env_files=True, quiet=True,
                # ansible-playbook must be on PATH: take the one beside this interpreter first.
                envvars={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                         "PATH": os.pathsep.join([str(Path(sys.executable).parent), environment.get("PATH", "")])},
                event_handler=print_progress,
            )
    finally:
        shutil.rmtree(private, ignore_errors=True)
    run_dir = artifacts / ident
    hosts = host_summaries(runner)
    add_unreached(hosts, inventory_hosts((REPO / args.inventory).resolve(), args.limit))
    summary = {"playbook": args.playbook, "status": runner.status, "rc": runner.rc,
               "elapsed_s": round(time.time() - started, 1), "artifacts": str(run_dir), "hosts": hosts}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_junit(run_dir / "junit.xml", args.playbook, summary["hosts"])
    if secrets:
        print(f"redacted secrets in {redact(run_dir, secrets)} artifact file(s)")
    for host, result in summary["hosts"].items():
        print(f"{host}: {result['status']} " + " ".join(f"{k}={result.get(k)}" for k in
              ("ok", "changed", "failed", "rescued", "unreachable", "elapsed_s", "verify_report")))
    print(f"summary: {run_dir / 'summary.json'}  junit: {run_dir / 'junit.xml'}")
    return 0 if runner.status == "successful" and runner.rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
