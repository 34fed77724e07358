"""The unit's ExecStart= must give the engine exactly the argv the role computed."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
spec = importlib.util.spec_from_file_location(
    "systemd_quote", REPO / "plugins/filter/systemd_quote.py")
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


# --- what systemd loaded, read back (systemctl show, systemd 252 of the test hosts) ---------------------------------

SHOWN = """ExecStart={ path=/opt/sglang/venv/bin/sglang ; argv[]=/opt/sglang/venv/bin/sglang serve --config \
/var/lib/llm-serving/releases/sglang-0123456789ab/config.yaml x $$HOME a b ; ignore_errors=no ; start_time=[n/a] ; \
stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }
User=sglang
Group=sglang
Description=sglang inference server (kimi)
ActiveState=inactive
"""
INTENDED = {"User": "sglang", "Group": "sglang", "Description": "sglang inference server (kimi)",
            "ExecStart": ["/opt/sglang/venv/bin/sglang", "serve", "--config",
                          "/var/lib/llm-serving/releases/sglang-0123456789ab/config.yaml", "x", "$HOME", "a b"]}


def test_the_loaded_unit_matches_the_release() -> None:
    shown = systemd_quote.systemd_show(SHOWN)
    assert shown["ActiveState"] == "inactive"
    assert systemd_quote.unit_problems(shown, INTENDED) == []


def test_a_value_that_became_a_directive_is_named() -> None:
    """The injection an unchecked profile name once made: Description= ended, a root ExecStartPre= followed."""
    injected = SHOWN.replace("Description=sglang inference server (kimi)", "Description=sglang inference server (x") + (
        "ExecStartPre={ path=/bin/touch ; argv[]=/bin/touch /tmp/pwned ; ignore_errors=no ; start_time=[n/a] }\n")
    problems = systemd_quote.unit_problems(systemd_quote.systemd_show(injected), INTENDED)
    assert problems == [
        "Description='sglang inference server (x', the release says 'sglang inference server (kimi)'",
        "ExecStartPre='{ path=/bin/touch ; argv[]=/bin/touch /tmp/pwned ; ignore_errors=no ; start_time=[n/a] }': "
        "the release sets no such command"]


def test_another_command_line_or_user_is_named() -> None:
    shown = systemd_quote.systemd_show(SHOWN.replace("User=sglang", "User=root").replace(" a b ;", " a ;"))
    problems = systemd_quote.unit_problems(shown, INTENDED)
    assert problems[0] == "User='root', the release says 'sglang'"
    assert problems[1].startswith("ExecStart runs ['/opt/sglang/venv/bin/sglang serve --config ") and len(problems) == 2
