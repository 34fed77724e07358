"""The NVIDIA apt repository double builds under a deep directory: its signing key's gpg-agent keeps its sockets in a
short directory of its own (a Unix socket path holds at most 107 bytes; Molecule builds the double below HOME, and a
HOME longer than /root once made the agent fail to start)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tests" / "doubles" / "nvidia_apt_repo_double" / "build.sh"


def test_the_double_builds_and_signs_under_a_directory_too_deep_for_a_socket():
    with tempfile.TemporaryDirectory(prefix="deep-" + "d" * 80) as work:
        out = Path(work) / "nvidia-apt-repo-double"
        assert len(str(out / "gnupg" / "S.gpg-agent.browser")) > 107
        run = subprocess.run(["bash", str(BUILD), str(out), "6.1.0-test-amd64"], capture_output=True, text=True,
                             check=False)
        assert run.returncode == 0, run.stderr[-2000:]
        repo = out / "nvidia"
        signed = [p.name for p in repo.iterdir() if p.name in ("InRelease", "Release.gpg")] if repo.is_dir() else []
        assert sorted(signed) == ["InRelease", "Release.gpg"], sorted(p.name for p in out.rglob("*"))[:20]
