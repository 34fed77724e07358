"""The unit's ExecStart= must give the engine exactly the argv the role computed."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "systemd_quote", REPO / "roles/engine_service/filter_plugins/systemd_quote.py")
systemd_quote = importlib.util.module_from_spec(spec)
spec.loader.exec_module(systemd_quote)


def systemd_split(line: str) -> list[str]:
    """Undo systemd's ExecStart= escaping for the constructs the filter produces."""
    words = shlex.split(line, posix=True)
    return [w.replace("%%", "%").replace("$$", "$") for w in words]


@pytest.mark.parametrize("argv", [
    ["/opt/vllm/venv/bin/vllm", "serve", "/models/kimi", "--tensor-parallel-size", "8"],
    ["/opt/vllm/venv/bin/vllm", "--speculative-config",
     '{"method": "eagle3", "model": "/models/d", "num_speculative_tokens": 3}'],
    ["/bin/x", "100%", "$HOME", "${HOME}", "a b", "it's", 'say "hi"', "back\\slash", ""],
    ["/opt/sglang/venv/bin/sglang", "serve", "--config", "{release_dir}/config.yaml"],
])
def test_round_trip(argv):
    assert systemd_split(systemd_quote.systemd_exec_args(argv)) == argv


def test_specifiers_and_variables_are_escaped():
    line = systemd_quote.systemd_exec_args(["/bin/x", "%h", "$USER"])
    assert line == "/bin/x %%h $$USER"


def test_an_empty_argv_is_refused():
    with pytest.raises(ValueError):
        systemd_quote.systemd_exec_args([])


def test_environment_values_keep_quotes_and_percent():
    assert systemd_quote.systemd_env_value('a"b%c\\d') == 'a\\"b%%c\\\\d'
