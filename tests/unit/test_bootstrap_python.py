"""Bootstrap's interpreter search, run for real with a PATH that holds only the tools it needs.

Bootstrap on a host whose only Python is 3.11 (Debian 12's) must stop at once, before installing anything,
with one message that says what to install; scripts/env.sh must put the toolchain on PATH without changing
the caller's shell options.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What bootstrap.sh/lib.sh run before the interpreter check (and nothing that could install).
TOOLS = ("dirname", "date", "sha256sum", "cut", "cat", "ls")


def _python311() -> str | None:
    """A real 3.11 interpreter binary (not a pyenv shim, which needs pyenv on PATH)."""
    for candidate in ("/usr/bin/python3", "python3.11"):
        path = shutil.which(candidate)
        if not path:
            continue
        code = "import sys; print(sys.executable); sys.exit(sys.version_info[:2] != (3, 11))"
        probe = subprocess.run([path, "-c", code], check=False, capture_output=True, text=True)
        if probe.returncode == 0:
            return os.path.realpath(probe.stdout.strip())
    return None


def _bin_with(tmp_path: Path, python3: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "python3").symlink_to(python3)
    return bin_dir


def _env(tmp_path: Path, bin_dir: Path) -> dict[str, str]:
    return {"PATH": str(bin_dir), "HOME": str(tmp_path / "home"), "BWS_CACHE_DIR": str(tmp_path / "cache"),
            "LANG": "C.UTF-8"}


def test_bootstrap_with_only_python_311_stops_at_once_saying_what_to_install(tmp_path: Path) -> None:
    python311 = _python311()
    if python311 is None:
        pytest.skip("no Python 3.11 on this machine to stand for Debian 12's")
    env = _env(tmp_path, _bin_with(tmp_path, python311))
    result = subprocess.run(["/bin/bash", str(REPO / "scripts" / "bootstrap.sh")], check=False, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == "", "nothing may be installed or staged before the interpreter check"
    message = result.stderr
    assert message.startswith("error: no Python >= 3.12 found"), message
    assert "found python3 3.11." in message
    sudo = "" if os.geteuid() == 0 else "sudo "  # root is told the commands without sudo (it may have none)
    assert f"Ubuntu 24.04 (python3 is 3.12):  {sudo}apt install python3.12-venv" in message
    assert "Debian 12 (ships 3.11; its archive has no python3.12)" in message
    assert f"\n      {sudo}apt install pipx && pipx install uv && ~/.local/bin/uv python install 3.12" in message
    # what each route needs beyond PyPI and the Debian mirror
    assert "the Python itself comes from GitHub: python-build-standalone" in message
    assert "built from python.org's sources" in message
    assert message.count("error:") == 1
    assert not (tmp_path / "cache" / "venv").exists()


def test_the_search_takes_a_312_interpreter_with_its_venv_module(tmp_path: Path) -> None:
    env = _env(tmp_path, _bin_with(tmp_path, sys.executable))
    result = subprocess.run(["/bin/bash", "-c", f"source {REPO}/scripts/lib.sh; find_python"], check=False,
                            env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "bin" / "python3")


def test_env_sh_puts_the_toolchain_on_path_and_leaves_shell_options_alone(tmp_path: Path) -> None:
    script = f"""
    before="$-:$(shopt -o pipefail)"
    source {REPO}/scripts/env.sh
    source {REPO}/scripts/env.sh
    after="$-:$(shopt -o pipefail)"
    echo "$before|$after|$ANSIBLE_CONFIG"
    echo "$PATH" | tr ':' '\\n' | grep -c "^$VENV_DIR/bin$"
    """
    env = {**os.environ, "BWS_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run(["/bin/bash", "-c", script], check=False, env=env, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    options, count = result.stdout.strip().splitlines()
    before, after, config = options.split("|")
    flags = after.split(":")[0]
    assert before == after and "e" not in flags and "u" not in flags, options
    assert after.endswith("off"), "pipefail must stay off"
    assert config == str(REPO / "ansible.cfg")
    assert count == "1", "sourcing twice must not grow PATH"


def test_env_sh_moves_the_toolchain_before_a_bin_that_pyenv_put_first(tmp_path: Path) -> None:
    """A Python started through pyenv's shims prepends its version's bin (its own pytest and python) to the PATH
    its children inherit: the test command's scheduler, started so on a machine without the venv yet, gave every
    stage pyenv's pytest (no xdist) until env.sh moved the venv back to the front."""
    venv_bin = tmp_path / "cache" / "venv" / "bin"
    shadow = tmp_path / "pyenv-version-bin"
    script = 'source "$1"; echo "$PATH"'
    path = f"{shadow}:/usr/bin:{venv_bin}:/bin"
    env = {**os.environ, "BWS_CACHE_DIR": str(tmp_path / "cache"), "PATH": path}
    result = subprocess.run(["/bin/bash", "-c", script, "env.sh", str(REPO / "scripts" / "env.sh")], check=False,
                            env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().split(":") == [str(venv_bin), str(shadow), "/usr/bin", "/bin"]
