#!/usr/bin/env python3
"""Run one of this repository's playbooks through ansible-runner, the way CI should.

    python scripts/ci_playbook.py deploy_sglang.yml -i inventory/production \
        --artifacts out/ --extra-vars-file secrets.yml --redact-env SGLANG_API_KEY

- A throw-away private data dir; project_dir is this repository; artifacts are kept under --artifacts.
- Progress streams to stdout (one line per task result), the playbook's own output goes to the artifacts.
- Verify reports go under <artifacts>/<ident>/reports (-e verify_report_dir=DIR, inline or in a vars file,
  chooses another place; an inventory's verify_report_dir does not).
- Each run keeps its artifacts in <artifacts>/<ident>/ (--ident, by default the start time, YYYYmmddTHHMMSS):
  it writes <artifacts>/<ident>/summary.json (per host: ok/changed/failed/rescued/skipped/unreachable, elapsed,
  verify report path) and <artifacts>/<ident>/junit.xml (one test case per host), and prints both paths.
- Secrets stay out of the artifacts: pass them in a vars file (-e @file, never copied). ansible-runner records
  the environment it runs the playbook with (<artifacts>/<ident>/command), so it gets a minimal one: what
  Ansible, SSH and podman need (PATH, HOME, locale, TMPDIR, SSH_AUTH_SOCK, XDG_*, ANSIBLE_*, CONTAINERS_*,
  BWS_*, proxies), HF_TOKEN (the model store's default token), and the variables named with --pass-env or
  --redact-env; nothing else (CI tokens stay out). As a second line of defence the values of --redact-env
  variables, HF_TOKEN, proxy URLs and, from the vars files, sglang_api_key, sglang_admin_api_key, vllm_api_key
  and model_store_hf_token are scrubbed from every artifact file: verbatim, JSON- and repr-escaped and
  base64-encoded. Extra vars given inline are recorded by ansible-runner.
- Exit status: 0 when every host succeeded, 1 otherwise, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
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
SECRET_ENV = ("HF_TOKEN",)  # model_store_hf_token's default (roles/model_store)
SECRET_VARS = ("sglang_api_key", "sglang_admin_api_key", "vllm_api_key", "model_store_hf_token")


def runner_environment(environ: dict[str, str], pass_env: list[str], redact_env: list[str]) -> dict[str, str]:
    """The controller's environment cut to what the playbook needs (see PASSED_ENV) and what was named."""
    named = set(pass_env) | set(redact_env) | set(SECRET_ENV) | set(PROXY_ENV)
    return {name: value for name, value in environ.items()
            if name in named or any(name == kept or (kept.endswith("_") and name.startswith(kept))
                                    for kept in PASSED_ENV)}


def secrets_in_vars_files(paths: list[str]) -> list[str]:
    """The values of SECRET_VARS in plain YAML vars files (an encrypted or unreadable file gives none)."""
    try:
        import yaml
    except ImportError:
        return []
    found = []
    for path in paths:
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(data, dict):
            found += [str(data[name]) for name in SECRET_VARS if isinstance(data.get(name), str | int) and data[name]]
    return found


def _secret_forms():
    """plugins/module_utils/secrets/redact.py: the forms a secret takes in logs and payloads (the roles' own
    redaction)."""
    redact = REPO / "plugins" / "module_utils" / "secrets" / "redact.py"
    spec = importlib.util.spec_from_file_location("bws_redact", redact)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.secret_forms


def redact(directory: Path, secrets: list[str]) -> int:
    secret_forms = _secret_forms()
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
    # The verify reports go with the run's artifacts. An extra variable (it outranks the inventory's) given first, so
    # that a vars file or an inline -e verify_report_dir, both read after it, choose another place.
    reports = {"verify_report_dir": str(artifacts / ident / "reports")}
    cmdline = ["-e " + shlex.quote(json.dumps(reports)), *(f"-e @{Path(f).resolve()}" for f in args.extra_vars_file)]
    if args.check:
        cmdline.append("--check --diff")
    if args.skip_tags:
        cmdline.append(f"--skip-tags {args.skip_tags}")
    environment = runner_environment(dict(os.environ), args.pass_env, args.redact_env)
    secrets = [environment[name] for name in (*args.redact_env, *SECRET_ENV) if environment.get(name)]
    secrets += [environment[name] for name in PROXY_ENV if "@" in environment.get(name, "")]  # user:password@
    secrets += secrets_in_vars_files(args.extra_vars_file)
    private = Path(tempfile.mkdtemp(prefix="ci-playbook-"))
    started = time.time()
    # ansible-runner starts from os.environ and writes what it passes into the artifacts: give it only that.
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environment)
    try:
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
        os.environ.clear()
        os.environ.update(saved)
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
