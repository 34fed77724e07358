"""A real engine front end (SGLang 0.5.23's or vLLM 0.33.0's own server) over the scripted backend, as a process.

The interface is the light double's (tests/integration/verify_helpers.py EngineDouble: name, flavour, port,
base_url, served_name, speculative, num_steps, log, stop), so the verify tests run against either. The process
runs from the engine's test-engine venv (engine_venv.py) inside its own PID namespace (`unshare --pid --fork
--mount-proc --kill-child`): stopping it can reach only what it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import closing
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
ENTRY = {"sglang": HERE / "sglang_serve.py", "vllm": HERE / "vllm_serve.py"}
MAKE_MODEL = REPO_ROOT / "tests" / "sandbox" / "make_tiny_model.py"
ROLES = REPO_ROOT / "roles"
# SGLang's start (scheduler + detokenizer processes, warm-up) took about 21 s on 2 quiet cores, vLLM's about 10 s.
START_TIMEOUT_S = 240.0


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_models(root: Path) -> tuple[Path, Path]:
    """The tiny model and drafter directories (2-layer llama configs, Kimi-style tokenizer), once per root."""
    model, drafter = root / "tiny-model", root / "tiny-drafter"
    if not (drafter / "tokenizer.json").is_file():
        subprocess.run([sys.executable, str(MAKE_MODEL), str(model), "--drafter", str(drafter)], check=True)
    return model, drafter


def signal_main_process(process: subprocess.Popen, signum: int) -> None:
    """Signal the engine's main process, the only child of `unshare --fork` (PID 1 of its namespace), as systemd's
    KillMode=mixed signals a unit's main process: never anything outside the namespace the test started."""
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    for pid in children.read_text().split() if children.exists() else []:
        os.kill(int(pid), signum)


class RealFrontEnd:
    """One engine process: SGLang with a YAML config (`serve --config`), vLLM with `serve MODEL` argv."""

    def __init__(self, python: Path, workdir: Path, name: str, flavour: str, *, speculative: bool = False,
                 api_key: str | None = None, admin_api_key: str | None = None, env: dict[str, str] | None = None,
                 num_steps: int = 3, options: dict[str, object] | None = None, deploy_guards: bool = True) -> None:
        self.name, self.flavour, self.port = name, flavour, free_port()
        self.speculative, self.num_steps = speculative, num_steps
        self.served_name = f"{name}-model"
        self.api_key, self.admin_api_key = api_key, admin_api_key
        self.log = workdir / f"{name}.log"
        self.base_url = f"http://127.0.0.1:{self.port}"
        model, drafter = make_models(workdir / "models")
        self.model_path = model
        args = (self._sglang_args(workdir, model, drafter, options) if flavour == "sglang"
                else self._vllm_args(model, drafter, options))
        self.routes_file = workdir / f"{name}.routes.json"
        # The entry point writes the real app's route table there once the app is built (path, methods).
        full_env = {**os.environ, "SCRIPTED_ENGINE_ROUTES_FILE": str(self.routes_file), **(env or {})}
        full_env.pop("PYTHONPATH", None)
        if deploy_guards:
            full_env.update(self._deploy_guards(workdir / f"{name}.release", args))
        elif flavour == "vllm" and api_key:
            full_env["VLLM_API_KEY"] = api_key  # vLLM alone: its own key check, as upstream documents it
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--",
                 str(python), str(ENTRY[flavour]), *args],
                stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)

    def _deploy_guards(self, release_dir: Path, args: list[str]) -> dict[str, str]:
        """What the engine roles add around the engine, from their own files, into a stand-in release directory
        (on PYTHONPATH as in the unit): SGLang's logging configuration with the filter that redacts the keys and its
        plugin that blanks them in /server_info (found through its dist-info's entry point); vLLM's middleware that
        guards every route with a key, and refuses a foreign Host or Origin without one. Returns the environment;
        extends `args` in place."""
        release_dir.mkdir(parents=True, exist_ok=True)
        guards: dict[str, str] = {"PYTHONPATH": str(release_dir)}
        for shared in ("bws_access_log.py", "bws_same_origin.py"):  # both roles ship them
            shutil.copy(ROLES / "engine_service" / "files" / shared, release_dir)
        if self.flavour == "sglang":
            import jinja2  # the test runner's (Ansible's) Jinja: the role renders the same template

            template = (ROLES / "sglang" / "templates" / "sglang-logging.json.j2").read_text(encoding="utf-8")
            (release_dir / "logging.json").write_text(jinja2.Template(template).render(sglang_logging_level="info"))
            shutil.copy(ROLES / "sglang" / "files" / "bws_sglang_logging.py", release_dir)
            shutil.copy(ROLES / "sglang" / "files" / "bws_sglang_guard.py", release_dir)
            shutil.copytree(ROLES / "sglang" / "files" / "bws_sglang_guard-1.dist-info",
                            release_dir / "bws_sglang_guard-1.dist-info", dirs_exist_ok=True)
            guards["SGLANG_LOGGING_CONFIG_PATH"] = str(release_dir / "logging.json")
        else:
            shutil.copy(ROLES / "vllm" / "files" / "bws_vllm_auth.py", release_dir)
            args += ["--middleware", "bws_vllm_auth.RequireApiKey" if self.api_key else "bws_vllm_auth.SameOriginOnly"]
            if self.api_key:  # as the unit's LoadCredential=api-key gives it: a file of its own, not the environment
                credentials = release_dir.parent / f"{release_dir.name}.credentials"
                credentials.mkdir(mode=0o700, exist_ok=True)
                (credentials / "api-key").write_text(self.api_key, encoding="utf-8")
                (credentials / "api-key").chmod(0o400)
                guards["CREDENTIALS_DIRECTORY"] = str(credentials)
        return guards

    def _sglang_args(self, workdir: Path, model: Path, drafter: Path, options: dict | None) -> list[str]:
        config: dict[str, object] = {
            "model-path": str(model), "served-model-name": self.served_name, "host": "127.0.0.1",
            "port": self.port, "tp-size": 1, "context-length": 8192, "attention-backend": "triton",
            "disable-custom-all-reduce": True, "enable-metrics": True, "reasoning-parser": "kimi_k2",
            "tool-call-parser": "kimi_k2"}
        if self.speculative:
            config.update({"speculative-algorithm": "EAGLE3", "speculative-draft-model-path": str(drafter),
                           "speculative-num-steps": self.num_steps, "speculative-eagle-topk": 1,
                           "speculative-num-draft-tokens": self.num_steps + 1})
        if self.api_key:
            config["api-key"] = self.api_key
        if self.admin_api_key:
            config["admin-api-key"] = self.admin_api_key
        config.update(options or {})
        path = workdir / f"{self.name}.yaml"
        path.write_text("".join(f"{key}: {json.dumps(value)}\n" for key, value in config.items()), encoding="utf-8")
        return ["serve", "--config", str(path)]

    def _vllm_args(self, model: Path, drafter: Path, options: dict | None) -> list[str]:
        args = ["serve", str(model), "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name",
                self.served_name, "--max-model-len", "8192", "--tool-call-parser", "kimi_k2",
                "--enable-auto-tool-choice", "--reasoning-parser", "kimi_k2"]
        if self.speculative:
            args += ["--speculative-config", json.dumps(
                {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": self.num_steps})]
        for flag, value in (options or {}).items():
            args += [f"--{flag}"] + ([] if value is True else [str(value)])
        return args

    # --- life cycle ---------------------------------------------------------------------------------------------
    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Seconds until /health answered 200; raises with the log's tail when it did not within the bound."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.flavour} front end exited {self.process.returncode} before ready:\n"
                                   f"{self.log_tail()}")
            try:
                if self.request("/health", timeout=5, key=None)[0] == 200:
                    return time.monotonic() - start
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.flavour} front end not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # unshare --kill-child takes the namespace with it
        self.process.wait(timeout=30)

    # --- requests -----------------------------------------------------------------------------------------------
    def request(self, path: str, body: dict | None = None, *, key: str | None = "default", timeout: float = 60,
                method: str | None = None) -> tuple[int, bytes]:
        key = self.api_key if key == "default" else key
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def chat(self, question: str, *, thinking: bool, max_tokens: int = 128, key: str | None = "default",
             temperature: float = 0.0) -> tuple[int, dict]:
        status, body = self.request("/v1/chat/completions", {
            "model": self.served_name, "messages": [{"role": "user", "content": question}],
            "temperature": temperature, "max_tokens": max_tokens,
            "chat_template_kwargs": {"thinking": thinking}}, key=key)
        try:
            return status, json.loads(body)
        except ValueError:
            return status, {"raw": body.decode(errors="replace")}
