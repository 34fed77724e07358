"""scripts/ci_playbook.py's summary.json takes the verify report directory from the fact the verify role
publishes (verify_result.report_dir, roles/verify/tasks/report.yml). The whole path, through ansible-runner
and a real verify run, is tested in tests/integration/test_engine_lifecycle.py (site.yml)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "ci_playbook.py"
spec = importlib.util.spec_from_file_location("ci_playbook", SCRIPT)
ci_playbook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ci_playbook)


def event(kind: str, task: str, res: dict) -> dict:
    return {"event": kind, "event_data": {"host": "gpu1", "task": task, "res": res,
                                          "start": "2026-01-01T00:00:00.000000", "end": "2026-01-01T00:00:01.500000"}}


def test_the_report_dir_comes_from_the_published_verify_result():
    runner = SimpleNamespace(
        stats={"ok": {"gpu1": 3}, "changed": {}, "failures": {}, "dark": {}},
        events=[
            event("runner_on_ok", "Name this run's report directory",
                  {"ansible_facts": {"__verify_report_path": "/tmp/not-published"}}),
            event("runner_on_ok", "Publish the verify result",
                  {"ansible_facts": {"verify_result": {"report_dir": "/art/gpu1/20260101T000000Z", "passed": True}}}),
            event("runner_on_ok", "Summary", {"msg": ["report: /art/gpu1/20260101T000000Z/report.md"]}),
        ],
    )
    summary = ci_playbook.host_summaries(runner)["gpu1"]
    assert summary["verify_report"] == "/art/gpu1/20260101T000000Z"
    assert summary["status"] == "ok" and summary["elapsed_s"] == 1.5


def test_no_verify_run_leaves_the_report_empty():
    runner = SimpleNamespace(stats={"ok": {"gpu1": 1}}, events=[event("runner_on_ok", "x", {"changed": False})])
    assert ci_playbook.host_summaries(runner)["gpu1"]["verify_report"] is None
    assert ci_playbook.verify_report_dir({"ansible_facts": {"verify_result": "not a dict"}}) is None


def run_outside_the_venv(*args: str) -> subprocess.CompletedProcess[str]:
    """The script under a Python that has no site-packages at all (-I -S), as `python3` on a fresh machine."""
    return subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, check=False, cwd="/")


def test_help_works_with_any_python3():
    shown = run_outside_the_venv("--help")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: ci_playbook.py") and "--redact-env NAME" in shown.stdout
    assert "--secret-var NAME" in shown.stdout and "--vault-password-file FILE" in shown.stdout


def test_a_run_without_ansible_runner_says_how_to_get_it_not_a_traceback():
    refused = run_outside_the_venv("verify.yml")
    assert refused.returncode == 2
    assert "Traceback" not in refused.stderr
    assert "ansible-runner is not installed for" in refused.stderr and "source scripts/env.sh" in refused.stderr


# --- what ansible-runner gets and keeps of the controller's environment ---------------------------------------------

CONTROLLER_ENV = {
    "PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "SSH_AUTH_SOCK": "/tmp/agent",
    "ANSIBLE_CONFIG": "/repo/ansible.cfg", "CONTAINERS_CONF": "/c.conf", "XDG_RUNTIME_DIR": "/run/user/0",
    "BWS_CACHE_DIR": "/cache", "HF_TOKEN": "hf_secret_token_value", "https_proxy": "http://u:pw@proxy:3128",
    "GITHUB_TOKEN": "ghp_ci_token_value", "CI_JOB_TOKEN": "glcbt-job", "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "MY_KEY": "my-key-value", "SITE": "eu-1", "LC": "not-a-locale-prefix-match", "PATHX": "no",
}


def test_the_runner_gets_only_what_the_playbook_needs_and_what_was_named():
    environment = ci_playbook.runner_environment(CONTROLLER_ENV, pass_env=["SITE"], redact_env=["MY_KEY"])
    assert environment == {name: CONTROLLER_ENV[name] for name in (
        "PATH", "HOME", "LANG", "LC_ALL", "SSH_AUTH_SOCK", "ANSIBLE_CONFIG", "CONTAINERS_CONF", "XDG_RUNTIME_DIR",
        "BWS_CACHE_DIR", "HF_TOKEN", "https_proxy", "MY_KEY", "SITE")}


# --- which values are secrets (whole runs, with vault-encrypted files: tests/integration/test_ci_playbook_secrets.py)


def test_the_secret_variables_are_the_roles_no_log_options_not_a_list_of_its_own():
    secrets = ci_playbook.role_secrets()
    assert {"sglang_api_key", "sglang_admin_api_key", "vllm_api_key", "model_store_hf_token"} <= secrets.names
    assert secrets.env == ("HF_TOKEN",), "model_store_hf_token's default reads HF_TOKEN"
    assert not [name for name in vars(ci_playbook) if name.startswith("SECRET_")]


def test_a_no_log_option_its_suboptions_and_the_environment_its_default_reads(tmp_path):
    (tmp_path / "a" / "meta").mkdir(parents=True)
    (tmp_path / "a" / "meta" / "argument_specs.yml").write_text(yaml.safe_dump({"argument_specs": {
        "main": {"options": {
            "a_token": {"type": "str", "no_log": True, "default": "{{ lookup('ansible.builtin.env', 'A_TOKEN') }}"},
            "a_plain": {"type": "str", "default": "{{ lookup('env', 'NOT_SECRET') }}"},
            "a_remote": {"type": "dict", "options": {"url": {"type": "str"}, "password": {"no_log": True}}},
        }},
        "other": {"options": {"a_other_key": {"type": "str", "no_log": True}}},
    }}))
    assert ci_playbook.role_secrets(tmp_path) == ci_playbook.RoleSecrets(
        frozenset({"a_token", "a_remote", "a_other_key"}), ("A_TOKEN",))


def plain_vault():
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import VaultLib

    return ci_playbook.Vault(DataLoader(), VaultLib([]), [])


def test_a_secret_kept_in_another_variable_is_found_through_the_template_that_names_it():
    variables = {"sglang_api_key": "{{ vault_key | default(fallback) }}", "vault_key": "sk-vaulted",
                 "fallback": "{{ deeper }}", "deeper": "sk-deeper", "unrelated": "x",
                 "verify_api_key": "{{ lookup('file', '/keys/' ~ inventory_hostname) }}", "inventory_hostname": "gpu1",
                 "nested": {"list": ["sk-in-a-list", 7, True]}, "empty": ""}
    names = frozenset({"sglang_api_key", "verify_api_key", "nested", "empty", "absent"})
    found = ci_playbook.secret_values(variables, names, plain_vault(), "test", frozenset({"lookup", "default"}))
    assert sorted(found) == sorted(["{{ vault_key | default(fallback) }}", "sk-vaulted", "{{ deeper }}", "sk-deeper",
                                    "{{ lookup('file', '/keys/' ~ inventory_hostname) }}", "sk-in-a-list", "7"])
    # more names than variables (a keyword, a quoted word) do no harm: only names of variables are followed
    assert ci_playbook.template_names("a {{ x.y | f(z, 'q w') }} {% if k %}") == {"x", "f", "z", "w", "if", "k"}


def test_a_vars_file_is_read_as_ansible_reads_it_and_one_that_cannot_be_read_refuses_the_run(tmp_path):
    plain = tmp_path / "secrets.yml"
    plain.write_text("sglang_api_key: sk-one\nvllm_api_key: ''\nmodel_store_hf_token: hf_two\nother: x\n")
    vault = plain_vault()
    variables = ci_playbook.read_vars_file(str(plain), vault)
    assert ci_playbook.variable_secrets([(str(plain), variables)], ci_playbook.Inventory({}, frozenset()),
                                        ci_playbook.role_secrets().names, vault) == ["sk-one", "hf_two"]
    missing = tmp_path / "missing.yml"
    with pytest.raises(ci_playbook.RefusedError, match=f"^{missing} cannot be read"):
        ci_playbook.read_vars_file(str(missing), vault)


def test_vault_files_are_passed_on_as_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ci_playbook.parse_args(["verify.yml", "--vault-id", "prod@pw.txt", "--vault-id", "dev@prompt",
                                   "--vault-password-file", "other.txt"])
    assert ci_playbook.vault_options(args) == [f"--vault-id prod@{tmp_path}/pw.txt", "--vault-id dev@prompt",
                                               f"--vault-password-file {tmp_path}/other.txt"]


def test_redaction_covers_every_form_a_secret_takes(tmp_path):
    import base64
    import json
    secret = 'tok"en/with\\odd+chars-0123456789'
    files = {
        "stdout": f"token={secret}\n",
        "command": json.dumps({"env": {"HF_TOKEN": secret}}),
        "slurp.json": json.dumps({"content": base64.b64encode(f"prefix {secret} suffix".encode()).decode()}),
        "repr.txt": repr({"api_key": secret}),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert ci_playbook.redact(tmp_path, [secret]) == 4
    core = base64.b64encode(secret.encode()).decode()[:-4]
    for path in tmp_path.iterdir():
        text = path.read_text()
        assert secret not in text and json.dumps(secret)[1:-1] not in text and repr(secret)[1:-1] not in text, path
        assert "********" in text, path
    assert core not in "".join(p.read_text() for p in tmp_path.iterdir())
