"""The steps of the real-front-end host scenario, shared by test_real_sglang_host.py and test_real_vllm_host.py
(one file per engine, so that xdist runs the two hosts side by side). Each step states the host it leaves."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.integration.engine_host import REPO, EngineHost
from tests.integration.lifecycle_helpers import API_KEY, deploy, main_pid

# Lines only the engines' own start-up writes (the light double writes none of them): SGLang 0.5.23
# srt/entrypoints/http_server.py after its warm-up; vLLM 0.33.0 entrypoints/launchers/api_server/entry.py.
OWN_START_LINES = {"sglang": "The server is fired up and ready to roll!",
                   "vllm": "Starting vLLM server on"}


def unit(engine: str) -> str:
    return f"{engine}.service"


def deploy_serves_from_the_real_front_end(host: EngineHost, runs: list, engine: str) -> None:
    """Leaves: the engine's real front end serving release 1 under its unit."""
    run = deploy(host, runs, f"deploy_{engine}.yml")
    assert run.status == "successful", run.stdout[-4000:]
    assert host.unit(unit(engine))["ActiveState"] == "active"
    assert host.health() == 200
    journal = host.sh(f"journalctl -u {unit(engine)} --no-pager -o cat")
    assert OWN_START_LINES[engine] in journal, journal[-3000:]
    assert "ENGINE TEST DOUBLE" not in run.stdout


# The controller's secrets while CI runs verify: a Hub token (passed to the play), a variable named with --redact-env
# (passed), a CI token (not named: never passed), and a vars file's model-store token; the engine's API key is the
# inventory's. None of them may be anywhere the controller keeps, nor in the engine's journal.
CI_ENVIRONMENT = {"HF_TOKEN": "hf_RealHostFakeHubToken0001", "DEPLOY_SECRET": "deploy-secret-RealHost-0002",
                  "GITHUB_TOKEN": "ghp_RealHostFakeCiToken0003"}
VARS_FILE = {"model_store_hf_token": "hf_RealHostVarsFileToken0004"}
SECRETS = {"API key": API_KEY, **CI_ENVIRONMENT, **VARS_FILE}


def verify_passes_with_the_real_parsers(host: EngineHost, runs: list, engine: str) -> None:
    """verify.yml on what serves, as CI runs it (scripts/ci_playbook.py, ansible-runner) with every secret set:
    the smoke's answer comes through the engine's real kimi_k2 reasoning parser. Leaves: the host as it was."""
    secrets_file = host.workdir / "secrets.yml"
    secrets_file.write_text(yaml.safe_dump(VARS_FILE))
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "ci_playbook.py"), "playbooks/verify.yml", "-i", str(host.inventory),
         "--artifacts", str(host.workdir / "ci"), "--ident", "verify", "--redact-env", "DEPLOY_SECRET",
         "--extra-vars-file", str(secrets_file)],
        capture_output=True, text=True, check=False, cwd=REPO, env={**os.environ, **CI_ENVIRONMENT}, timeout=900,
    )
    secrets_file.unlink()
    assert result.returncode == 0, result.stdout[-4000:]
    recorded_env = json.loads((host.workdir / "ci" / "verify" / "command").read_text())["env"]
    assert "GITHUB_TOKEN" not in recorded_env and recorded_env["HF_TOKEN"] == "********", recorded_env.keys()
    reports = sorted((host.workdir / "ci" / "verify" / "reports" / host.name).glob("*/report.json"))
    report = json.loads(reports[-1].read_text())
    assert report["engine_is_test_double"] is False, report["test_double"]
    smoke = report["smoke"]
    assert smoke["answer_field"] == "content" and str(smoke["expected"]) in smoke["preview"], smoke
    assert smoke["unauthenticated"] == "refused with HTTP 401", smoke
    # Every POST route of the real app's /openapi.json was asked without the key and refused (vLLM: through the
    # role's middleware; its own check leaves /invocations open).
    routes, _, source = smoke["unauthenticated_routes"].partition(" POST routes refused without the key: ")
    assert int(routes) >= 10 and source.startswith("the route table (/openapi.json)"), smoke
    assert report["gate"]["passed"] is True, report["gate"]
    # Acceptance from the engine's own /metrics counters over the benchmark window (module_utils/bws_metrics.py).
    acceptance = report["levels"][0]["acceptance"]
    assert acceptance["problem"] is None and 0 < acceptance["rate"] < 1, acceptance


def failed_gate_rolls_back(host: EngineHost, runs: list, engine: str) -> None:
    """A release whose model answers garbage fails its gate, the reply named; the release before it serves again,
    restarted. (The light double's lifecycle tests leave this case to these hosts.)
    Leaves: release 1 serving (a new process)."""
    before, pid = host.state()["current"], main_pid(host, unit(engine))
    run = deploy(host, runs, f"deploy_{engine}.yml",
                 **{f"{engine}_extra_environment": {"SCRIPTED_ENGINE_FAULT": "garbage-output"}})
    assert run.status == "failed", run.stdout[-4000:]
    flat = " ".join(run.stdout.split())
    # (quotes come doubled where the message is quoted again in the rollback's; the engines' detokenizers put a space
    # before the first word)
    assert re.search(r"the smoke answer is wrong: asked '+What is \d{3} \+ \d{3}\? Reply with the number only\.'+, "
                     r"expected \d+; got HTTP 200 .* content '+ ?foss foss foss", flat), flat[-3000:]
    assert f"Rolled back: {before} is serving again" in flat, flat[-3000:]
    assert host.state()["current"] == before and host.state()["status"] == "serving"
    assert host.health() == 200
    assert main_pid(host, unit(engine)) not in (pid, "0")


def teardown_stops_the_engine(host: EngineHost, runs: list, engine: str) -> None:
    """Leaves: nothing serving, no process of the front end left."""
    run = host.run_playbook("playbooks/teardown.yml")
    runs.append(run)
    assert run.status == "successful", run.stdout[-4000:]
    assert host.unit(unit(engine))["ActiveState"] in ("inactive", "failed")
    # (the bracket keeps pgrep from matching the shell that runs it)
    assert host.sh(f"pgrep -f '[{engine[0]}]{engine[1:]}_serve.py' || true") == ""
    assert host.health() is None


def secret_forms(secret: str) -> dict[str, str]:
    """The ways a secret shows up in text: as it is, JSON-escaped, Python-repr-escaped (SGLang logs its
    server_args with repr) and base64 (ansible's slurp of a file that holds it) at each of the three byte
    alignments the secret can have inside the encoded file: the characters that encode only its own bytes."""
    forms = {"verbatim": secret, "json": json.dumps(secret)[1:-1], "repr": repr(secret)[1:-1]}
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + secret.encode()).decode()
        forms[f"base64+{shift}"] = encoded[4 if shift else 0:-4]
    return forms


def host_made_secrets(host: EngineHost, engine: str) -> dict[str, str]:
    """The secrets the host made itself: SGLang's admin key (library/host_secret.py: 32 bytes kept root 0600, used as
    their URL-safe base64 without padding)."""
    if engine != "sglang":
        return {}
    raw = base64.b64decode(host.sh("base64 -w0 /var/lib/llm-serving/sglang-admin-api-key").strip())
    assert len(raw) == 32, "the host made no admin key"
    return {"SGLang admin key": base64.urlsafe_b64encode(raw).decode().rstrip("=")}


def secret_forms_the_controller_keeps(host: EngineHost, runs: list, engine: str) -> list[str]:
    """Where the controller keeps a secret after the scenario's runs: verify's report folders (report, inputs,
    bench results), the CI run's artifacts and ansible-runner's (play output, events, environment), in any form."""
    kept = [path for folder in ("reports", "ci") for path in (host.workdir / folder).rglob("*") if path.is_file()]
    kept += [path for run in runs for path in Path(run.artifact_dir).rglob("*") if path.is_file()]
    assert len(kept) > 20, kept
    secrets = {**SECRETS, **host_made_secrets(host, engine)}
    hits = []
    for path in kept:
        text = path.read_text(errors="replace")
        hits += [f"{path.relative_to(host.workdir)}: {name} ({form})" for name, value in secrets.items()
                 for form, secret in secret_forms(value).items() if secret in text]
    return hits


def secret_forms_in_journal(host: EngineHost, engine: str) -> list[str]:
    journal = host.sh(f"journalctl -u {unit(engine)} --no-pager -o cat")
    return [f"{name} ({form})" for name, value in {**SECRETS, **host_made_secrets(host, engine)}.items()
            for form, text in secret_forms(value).items() if text in journal]
