"""scripts/ci_playbook.py keeps the run's secrets out of its artifacts, on localhost (local connection).

A tiny playbook prints every secret it is given; it runs through ci_playbook.py as CI runs it, and every artifact file
is then read: the secrets are known from the roles' no_log options, --secret-var, vault-encrypted vars files and the
inventory's vault (decrypted with the run's vault password), and scrubbed. A vault-encrypted file the run cannot
decrypt refuses the run, naming the file, before anything runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.playbook_run import local_inventory

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "ci_playbook.py"
VAULT = Path(sys.executable).parent / "ansible-vault"
PASSWORD = "vault-pw-7f3a9c1e"
# The play prints each variable it may be given, so each secret reaches the play's output unless scrubbed.
PRINTED = ("sglang_api_key", "vllm_api_key", "sglang_admin_api_key", "model_store_hf_token",
           "model_store_http_token", "site_db_password", "vault_admin_key")


def playbook(tmp: Path) -> Path:
    shown = " ".join(f"{name}=[{{{{ {name} | default('') }}}}]" for name in PRINTED)
    shown += " env=[{{ lookup('env', 'HF_TOKEN') }}]"
    path = tmp / "print-secrets.yml"
    path.write_text(json.dumps([{
        "name": "Print what the run was given", "hosts": "gpu_servers", "gather_facts": False,
        "tasks": [{"name": "Print", "ansible.builtin.debug": {"msg": shown}}],
    }]))  # fmt: skip
    return path


def encrypt(path: Path, password_file: Path) -> None:
    subprocess.run([str(VAULT), "encrypt", "--vault-password-file", str(password_file), str(path)], check=True,
                   capture_output=True)


def encrypt_string(name: str, value: str, password_file: Path) -> str:
    return subprocess.run([str(VAULT), "encrypt_string", "--vault-password-file", str(password_file), "--name", name,
                           value], check=True, capture_output=True, text=True).stdout


def ci_playbook(tmp: Path, inventory: Path, *args: str, env: dict[str, str] | None = None):
    return subprocess.run([sys.executable, str(SCRIPT), str(playbook(tmp)), "-i", str(inventory), "--artifacts",
                           str(tmp / "artifacts"), "--ident", "run", *args], capture_output=True, text=True,
                          check=False, cwd=tmp, env={**os.environ, **(env or {})}, timeout=300)


def holding(directory: Path, words: list[str]) -> dict[str, list[str]]:
    found = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            text = path.read_text(errors="replace")
            if hits := [word for word in words if word in text]:
                found[str(path.relative_to(directory))] = hits
    return found


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    password_file = tmp_path / "vault-password"
    password_file.write_text(PASSWORD + "\n")
    return password_file


def test_keys_in_vault_encrypted_files_and_the_inventorys_vault_never_reach_the_artifacts(tmp_path, vault):
    secrets = {"sglang_api_key": "sk-whole-file-4c2e81", "vllm_api_key": "sk-inline-vault-9d17a3",
               "vault_admin_key": "sk-inventory-vault-52b0f6"}
    whole = tmp_path / "secrets.yml"  # a whole vault-encrypted vars file
    whole.write_text(f"sglang_api_key: {secrets['sglang_api_key']}\n")
    encrypt(whole, vault)
    inline = tmp_path / "inline.yml"  # a plain vars file with one !vault value
    inline.write_text(encrypt_string("vllm_api_key", secrets["vllm_api_key"], vault))
    # The inventory's vault: group_vars/all/vault.yml encrypted, the role's variable naming the vaulted one.
    inventory = local_inventory(tmp_path / "inventory" / "hosts.json")
    group_vars = tmp_path / "inventory" / "group_vars" / "all"
    group_vars.mkdir(parents=True)
    (group_vars / "main.yml").write_text('sglang_admin_api_key: "{{ vault_admin_key }}"\n')
    (group_vars / "vault.yml").write_text(f"vault_admin_key: {secrets['vault_admin_key']}\n")
    encrypt(group_vars / "vault.yml", vault)

    run = ci_playbook(tmp_path, inventory, "--extra-vars-file", str(whole), "--extra-vars-file", str(inline),
                      "--vault-id", f"ci@{vault}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    artifacts = tmp_path / "artifacts" / "run"
    shown = (artifacts / "stdout").read_text()
    for name in ("sglang_api_key", "vllm_api_key", "sglang_admin_api_key"):
        assert f"{name}=[********]" in shown, shown  # the play printed it: only the scrub kept it out
    assert holding(artifacts, [*secrets.values(), PASSWORD]) == {}
    assert not any(word in run.stdout + run.stderr for word in [*secrets.values(), PASSWORD])
    recorded = json.loads((artifacts / "command").read_text())["command"]
    assert f"ci@{vault}" in recorded, "the vault identity is passed on to ansible-playbook"


def test_the_roles_secret_options_and_named_variables_given_plainly_or_with_e_are_scrubbed(tmp_path):
    secrets = {"model_store_hf_token": "hf_vars-file-token-31c9", "model_store_http_token": "http-token-e-88a1",
               "site_db_password": "db-pw-secret-var-0e4d", "HF_TOKEN": "hf_environment-token-6b2f"}
    plain = tmp_path / "secrets.yml"
    plain.write_text(f"model_store_hf_token: {secrets['model_store_hf_token']}\n"
                     f"site_db_password: {secrets['site_db_password']}\n")
    inventory = local_inventory(tmp_path / "hosts.json")
    run = ci_playbook(tmp_path, inventory, "--extra-vars-file", str(plain), "--secret-var", "site_db_password",
                      "-e", f"model_store_http_token={secrets['model_store_http_token']}",
                      env={"HF_TOKEN": secrets["HF_TOKEN"]})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    artifacts = tmp_path / "artifacts" / "run"
    shown = (artifacts / "stdout").read_text()
    for name in ("model_store_hf_token", "model_store_http_token", "site_db_password"):
        assert f"{name}=[********]" in shown, shown
    assert "env=[********]" in shown, shown
    assert holding(artifacts, list(secrets.values())) == {}


@pytest.mark.parametrize("where", ["vars file", "inline value", "inventory"])
def test_an_encrypted_file_the_run_cannot_decrypt_refuses_the_run_naming_it(tmp_path, vault, where):
    inventory = local_inventory(tmp_path / "inventory" / "hosts.json")
    if where == "vars file":
        encrypted = tmp_path / "secrets.yml"
        encrypted.write_text("vllm_api_key: sk-never-read-1a2b\n")
        encrypt(encrypted, vault)
    elif where == "inline value":
        encrypted = tmp_path / "inline.yml"
        encrypted.write_text("other: plain\n" + encrypt_string("any_name", "sk-never-read-1a2b", vault))
    else:
        encrypted = tmp_path / "inventory" / "group_vars" / "all.yml"
        encrypted.parent.mkdir()
        encrypted.write_text("vault_admin_key: sk-never-read-1a2b\n")
        encrypt(encrypted, vault)
    given = [] if where == "inventory" else ["--extra-vars-file", str(encrypted)]

    refused = ci_playbook(tmp_path, inventory, *given)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"refused, nothing was run: {encrypted} is vault-encrypted and no vault password was given" in \
        refused.stderr, refused.stderr
    assert not (tmp_path / "artifacts" / "run").exists(), "nothing ran"

    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password\n")
    refused = ci_playbook(tmp_path, inventory, *given, "--vault-password-file", str(wrong))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"{encrypted} is vault-encrypted and none of the vault passwords given decrypts it" in refused.stderr
