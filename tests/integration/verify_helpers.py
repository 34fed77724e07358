"""Helpers for the verify integration tests: engine test doubles on free ports, the bench client
double, and ansible-playbook runs against localhost.

Each double runs inside its own PID namespace (`unshare --pid --fork --mount-proc --kill-child`), and
stopping it signals only that wrapper, our own child, so a test can never reach a foreign process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import closing
from pathlib import Path

import yaml

from tests.playbook_run import PlaybookRun, run_playbook

REPO = Path(__file__).resolve().parents[2]
ENGINE_DOUBLE = REPO / "tests" / "doubles" / "engine_double.py"
BENCH_DOUBLE = REPO / "tests" / "doubles" / "bench_client_double.py"
from tests.module_utils_loader import load_module_util  # noqa: E402

bws_metrics = load_module_util("engine.metrics")

sys.path.insert(0, str(REPO / "tests"))
from engine_locks import load_lock, pinned_version  # noqa: E402

SHAREGPT_FIXTURE = REPO / "tests" / "fixtures" / "sharegpt" / "sharegpt-v3-8.json"


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EngineDouble:
    """One engine test double process: SGLang flavour with a YAML config, or vLLM flavour with argv."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        flavour: str = "sglang",
        *,
        speculative: bool = False,
        api_key: str | None = None,
        env: dict[str, str] | None = None,
        num_steps: int = 3,
        options: dict[str, str] | None = None,
    ) -> None:
        self.name, self.flavour, self.port = name, flavour, free_port()
        self.speculative, self.num_steps = speculative, num_steps
        self.served_name = f"{name}-model"
        self.log = workdir / f"{name}.log"
        if flavour == "sglang":
            config = {
                "port": self.port,
                "host": "127.0.0.1",
                "model-path": f"/models/{name}",
                "served-model-name": self.served_name,
                "enable-metrics": True,
            }
            if speculative:
                config.update(
                    {
                        "speculative-algorithm": "EAGLE3",
                        "speculative-num-steps": num_steps,
                        "speculative-eagle-topk": 1,
                        "speculative-num-draft-tokens": num_steps + 1,
                    }
                )
            if api_key:
                config["api-key"] = api_key
            config.update(options or {})
            config_path = workdir / f"{name}.yaml"
            config_path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()), encoding="utf-8")
            args = ["serve", "--config", str(config_path)]
        else:
            args = [
                "serve",
                f"/models/{name}",
                "--port",
                str(self.port),
                "--host",
                "127.0.0.1",
                "--served-model-name",
                self.served_name,
            ]
            if speculative:
                args += [
                    "--speculative-config",
                    json.dumps({"method": "eagle3", "model": "/models/draft", "num_speculative_tokens": num_steps}),
                ]
            if api_key:
                args += ["--api-key", api_key]
            for flag, value in (options or {}).items():
                args += [f"--{flag}", value]
        full_env = {
            **os.environ,
            "ENGINE_DOUBLE_FLAVOUR": flavour,
            "ENGINE_DOUBLE_START_S": "0.2",
            **(env or {}),
        }
        self.base_url = f"http://127.0.0.1:{self.port}"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [
                    "unshare",
                    "--pid",
                    "--fork",
                    "--mount-proc",
                    "--kill-child",
                    "--",
                    sys.executable,
                    str(ENGINE_DOUBLE),
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
            )

    def wait_listening(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text(errors='replace')}")
            with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} did not listen on {self.port}")

    def stop(self) -> None:
        # unshare ignores SIGTERM while it waits for its child; SIGKILL ends it, and --kill-child
        # then SIGKILLs the double. The double holds no state worth a graceful stop.
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)

    def counters(self) -> dict[str, float]:
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=10) as response:
            return bws_metrics.parse_prometheus_text(response.read().decode())

    def get_json(self, path: str, api_key: str | None = None) -> dict:
        request = urllib.request.Request(f"{self.base_url}{path}")
        if api_key:
            request.add_header("Authorization", f"Bearer {api_key}")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def complete(self, max_tokens: int, api_key: str | None = None) -> dict:
        body = json.dumps({"model": self.served_name, "prompt": "warm up", "max_tokens": max_tokens}).encode()
        request = urllib.request.Request(
            f"{self.base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        if api_key:
            request.add_header("Authorization", f"Bearer {api_key}")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())


def run_bench_double(
    double: EngineDouble,
    workdir: Path,
    concurrency: int,
    *,
    num_prompts: int,
    input_len: int,
    output_len: int,
    tokenizer: Path,
) -> dict:
    """Run the SGLang-flavoured bench client double once and return its JSON line."""
    out = workdir / f"bench-{double.name}-c{concurrency}.jsonl"
    subprocess.run(
        [
            sys.executable,
            str(BENCH_DOUBLE),
            "--backend",
            "sglang-oai",
            "--base-url",
            double.base_url,
            "--model",
            double.served_name,
            "--tokenizer",
            str(tokenizer),
            "--dataset-name",
            "random-ids",
            "--random-input-len",
            str(input_len),
            "--random-output-len",
            str(output_len),
            "--random-range-ratio",
            "1.0",
            "--num-prompts",
            str(num_prompts),
            "--max-concurrency",
            str(concurrency),
            "--warmup-requests",
            "0",
            "--output-file",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return json.loads(out.read_text().splitlines()[-1])


def write_serving_state(state_dir: Path, double: EngineDouble, tokenizer: Path, profile: str, *,
                        trust_remote_code: bool = False, model_paths: list[str] | None = None,
                        max_running_requests: int | None = None, venv: str | None = None) -> None:
    """state.json and release.json as a deploy of `double` leaves them (roles/engine_service): verify.yml
    reads what serves from the host. The engine version is the pinned one: verify runs the client of its lock."""
    release_id = f"{double.flavour}-{double.name}"
    release = {
        "schema": 1, "id": release_id, "engine": double.flavour, "engine_version": pinned_version(double.flavour),
        "profile": profile,
        "unit": f"{double.flavour}.service", "port": double.port, "listen_address": "127.0.0.1",
        "base_url": double.base_url, "health_url": f"{double.base_url}/health", "ready_timeout_s": 60,
        "stall_timeout_s": 0, "gate": "smoke", "exec_start": [sys.executable, str(ENGINE_DOUBLE)],
        "interconnect_proof": {}, "executable": sys.executable,
        "served_model_name": double.served_name, "tokenizer": str(tokenizer),
        "trust_remote_code": trust_remote_code, "speculative": double.speculative,
        "speculative_num_steps": double.num_steps if double.speculative else 0, "speculative_settings": {},
        "venv": venv or f"/opt/{double.flavour}/venv", "model_paths": model_paths or [], "tensor_parallel_size": 1,
        "max_running_requests": max_running_requests, "bench": load_lock(double.flavour)["bench"],
    }
    (state_dir / "releases" / release_id).mkdir(parents=True, exist_ok=True)
    (state_dir / "releases" / release_id / "release.json").write_text(json.dumps(release, indent=2))
    (state_dir / "state.json").write_text(json.dumps({"current": release_id, "previous": None, "status": "serving"}))


def write_inventory(path: Path, hosts: dict[str, dict]) -> None:
    """Inventory of local-connection hosts in group gpu_servers (each host a scenario)."""
    # The controller has no engine units (verify reads User= from systemd) and runs the test clients from paths
    # only root can read: the client runs as root here, on purpose. The systemd test hosts run it as the engine's user.
    common = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "verify_bench_user": "root"}
    inventory = {
        "all": {
            "children": {"gpu_servers": {"hosts": {name: {**common, **variables} for name, variables in hosts.items()}}}
        }
    }
    path.write_text(yaml.safe_dump(inventory, sort_keys=False), encoding="utf-8")


def run_verify(
    inventory: Path, playbook: str = "playbooks/verify.yml", *extra: str, timeout_s: int = 480,
    env: dict[str, str] | None = None, verbosity: str = "-vvv", workdir: Path | None = None,
) -> PlaybookRun:
    """Run a playbook (verify.yml) against the doubles' inventory through tests/playbook_run.py."""
    # timeout_s catches a hung play, not a slow machine: the 13-host verify play takes about 120 s on 2 quiet
    # cores and went past 150 s on a cold run, beside the contract venvs and the image building in the background.
    envvars = {**(env or {}), "ANSIBLE_RETRY_FILES_ENABLED": "0", "ANSIBLE_PIPELINING": "1"}
    return run_playbook(playbook, inventory, extra_args=[verbosity, *extra], envvars=envvars, workdir=workdir,
                        timeout=timeout_s)


def host_report_dir(report_root: Path, host: str) -> Path:
    runs = sorted((report_root / host).iterdir())
    assert runs, f"no report written for {host}"
    return runs[-1]
