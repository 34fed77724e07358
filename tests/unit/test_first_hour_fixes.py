"""A newcomer's first hour (issue 44): the stage clock of nested scripts, scripts/env.sh sourced from sh, and the
collection's tarball (git ignores it; the README's install works without Galaxy)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
STAGE_LINE = re.compile(r"^### \[\s*(\d+)s\] (.*)$", re.MULTILINE)
# Anything that tries to reach a server through these gets a refused connection at once.
NO_NETWORK = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
              "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": ""}


def clean_environment(**extra: str) -> dict[str, str]:
    """This environment without what scripts/env.sh and scripts/lib.sh set, so that they set it themselves."""
    dropped = {"REPO_ROOT", "CACHE_DIR", "VENV_DIR", "COLLECTIONS_DIR", "BWS_STAGE_T0", "ANSIBLE_CONFIG",
               "ANSIBLE_COLLECTIONS_PATH"}
    return {**{k: v for k, v in os.environ.items() if k not in dropped}, **extra}


def run(argv: list[str], cwd: Path = REPO, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=clean_environment(**extra), capture_output=True, text=True,
                          timeout=120, check=False)


# --- the stage clock ------------------------------------------------------------------------------------------------


def write_script(path: Path, body: str) -> Path:
    path.write_text(f'#!/usr/bin/env bash\nsource "{REPO}/scripts/lib.sh"\n{body}')
    return path


def stages_of(ran: subprocess.CompletedProcess[str]) -> list[tuple[str, int]]:
    return [(name, int(seconds)) for seconds, name in STAGE_LINE.findall(ran.stdout)]


def test_a_child_script_continues_the_stage_clock(tmp_path: Path):
    """The first script starts the clock and exports it; the script it runs keeps it, whatever the time is."""
    child = write_script(tmp_path / "child.sh", 'stage child\necho "child t0=$BWS_STAGE_T0"\n')
    parent = write_script(tmp_path / "parent.sh", f'stage parent\necho "parent t0=$BWS_STAGE_T0"\nbash "{child}"\n'
                                                  'stage "parent again"\n')
    ran = run(["bash", str(parent)])
    assert ran.returncode == 0, ran.stderr
    stages = stages_of(ran)
    assert [name for name, _ in stages] == ["parent", "child", "parent again"], ran.stdout
    seconds = [s for _, s in stages]
    assert seconds == sorted(seconds), f"the clock went back: {ran.stdout}"
    t0 = dict(re.findall(r"^(parent|child) t0=(\d+)$", ran.stdout, re.MULTILINE))
    assert set(t0) == {"parent", "child"} and t0["child"] == t0["parent"], ran.stdout


def test_a_child_script_continues_an_inherited_stage_clock(tmp_path: Path):
    """A clock started 1000 s ago (the time is set, not waited for) goes on in the script and in its child."""
    child = write_script(tmp_path / "child.sh", 'stage child\n')
    parent = write_script(tmp_path / "parent.sh", f'stage parent\nbash "{child}"\nstage "parent again"\n')
    ran = run(["bash", str(parent)], BWS_STAGE_T0=str(int(time.time()) - 1000))
    assert ran.returncode == 0, ran.stderr
    stages = stages_of(ran)
    assert [name for name, _ in stages] == ["parent", "child", "parent again"], ran.stdout
    seconds = [s for _, s in stages]
    assert seconds == sorted(seconds), f"the clock went back: {ran.stdout}"
    assert all(s >= 1000 for s in seconds), f"a script restarted the clock: {ran.stdout}"


@pytest.mark.parametrize("unusable", ["yesterday", "{t0}x", "-{t0}", ""])
def test_an_unusable_inherited_clock_starts_a_new_one(tmp_path: Path, unusable: str):
    """Not a number of seconds (a word, the epoch of 1000 s ago with a suffix or a sign, nothing): the script starts
    its own clock at 0, so what it prints is not the 1000 s (or more) that the inherited value would say."""
    script = write_script(tmp_path / "script.sh", "stage once\n")
    ran = run(["bash", str(script)], BWS_STAGE_T0=unusable.format(t0=int(time.time()) - 1000))
    assert ran.returncode == 0, ran.stderr
    (once,) = [s for _, s in stages_of(ran)]
    assert 0 <= once < 1000, ran.stdout


# --- scripts/env.sh from sh and from bash ---------------------------------------------------------------------------


def test_env_sh_sourced_from_sh_refuses_and_says_why():
    if run(["sh", "-c", "echo ${BASH_VERSION:-}"]).stdout.strip():
        pytest.skip("sh is bash here: env.sh works in it")
    ran = run(["sh", "-c", ". ./scripts/env.sh; echo after=$? root=${REPO_ROOT:-unset}"])
    assert ran.returncode != 0 or "after=0" not in ran.stdout, ran.stdout
    assert "scripts/env.sh: source it from bash" in ran.stderr and "not sh" in ran.stderr, ran.stderr
    assert "Bad substitution" not in ran.stderr, ran.stderr
    assert "root=unset" in ran.stdout, ran.stdout  # never REPO_ROOT=/


def test_env_sh_sourced_from_bash_sets_the_toolchain_once(tmp_path: Path):
    venv = tmp_path / "venv"
    ran = run(["bash", "-c", 'source scripts/env.sh && source scripts/env.sh && echo "$REPO_ROOT" && echo "$PATH"'],
              BWS_VENV_DIR=str(venv))
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    root, path = ran.stdout.splitlines()
    assert root == str(REPO)
    assert path.split(":").count(f"{venv}/bin") == 1 and path.startswith(f"{venv}/bin:"), path


# --- the collection's tarball ---------------------------------------------------------------------------------------


def collection_version() -> str:
    return yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]


def readme_install_flags() -> list[str]:
    """The flags the README gives `ansible-galaxy collection install` for the built tarball."""
    readme = " ".join((REPO / "README.md").read_text().split())
    found = re.search(r"`ansible-galaxy collection build && ansible-galaxy collection install ((?:-[-\w]+ )*)"
                      r"blackwell-serving-\*\.tar\.gz`", readme)
    assert found, "the README's build-and-install command"
    return found.group(1).split()


def test_git_ignores_the_built_tarball():
    tarball = f"blackwell-serving-{collection_version()}.tar.gz"
    ignored = subprocess.run(["git", "check-ignore", "-q", tarball], cwd=REPO, check=False)
    assert ignored.returncode == 0, f"{tarball} is not in .gitignore"


def galaxy_program() -> str:
    beside = Path(sys.executable).parent / "ansible-galaxy"
    program = str(beside) if beside.exists() else shutil.which("ansible-galaxy")
    if program is None:
        pytest.skip("ansible-galaxy is not installed (bash scripts/bootstrap.sh)")
    return program


def dependencies_path() -> Path:
    """Where scripts/bootstrap.sh puts the pinned collections (scripts/env.sh's COLLECTIONS_DIR)."""
    ran = run(["bash", "-c", 'source scripts/env.sh && echo "$COLLECTIONS_DIR"'])
    path = Path(ran.stdout.strip())
    dependencies = yaml.safe_load((REPO / "galaxy.yml").read_text())["dependencies"]
    missing = [name for name in dependencies if not (path / "ansible_collections" / name.replace(".", "/")).is_dir()]
    assert missing == [], f"the collection's dependencies are not under {path}: bash scripts/bootstrap.sh"
    return path


def test_the_readme_installs_the_built_collection_without_galaxy(tmp_path: Path):
    galaxy, flags = galaxy_program(), readme_install_flags()
    assert "--offline" in flags, flags
    config = tmp_path / "ansible.cfg"
    config.write_text("")
    offline = {"ANSIBLE_CONFIG": str(config), "ANSIBLE_GALAXY_CACHE_DIR": str(tmp_path / "cache"), **NO_NETWORK}
    built = run([galaxy, "collection", "build", "--output-path", str(tmp_path / "build")], **offline)
    assert built.returncode == 0, built.stdout + built.stderr
    tarball = tmp_path / "build" / f"blackwell-serving-{collection_version()}.tar.gz"
    install = [galaxy, "collection", "install", *flags, "-p", str(tmp_path / "installed"), str(tarball)]
    installed = run(install, cwd=tmp_path, ANSIBLE_COLLECTIONS_PATH=str(dependencies_path()), **offline)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    manifest = tmp_path / "installed" / "ansible_collections" / "blackwell" / "serving" / "MANIFEST.json"
    assert json.loads(manifest.read_text())["collection_info"]["version"] == collection_version()
    # without the dependencies on the path it stops and names them, rather than going to Galaxy for them
    alone = run([*install[:-3], "-p", str(tmp_path / "alone"), str(tarball)], cwd=tmp_path,
                ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "empty"), **offline)
    assert alone.returncode != 0 and "ansible.posix" in alone.stdout + alone.stderr, alone.stdout + alone.stderr
