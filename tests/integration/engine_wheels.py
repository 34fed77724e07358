"""The ENGINE TEST DOUBLE (tests/doubles/engine_double.py) as installable wheels, and engine locks naming them, so
the deploy's own install step (role python_env: uv, hashes, a venv per content) runs on the test hosts.

Each wheel is the double under the module name `bws_engine_double` with a console script `sglang`, plus a
version-specific `fault`: a wheel of another version can be one whose engine misbehaves, as a bad engine
version does. The locks have the shape of roles/sglang/locks/*.yml where the role reads them (`requirements`,
`hashes`)."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

from tests.integration.engine_host import REPO

DISTRIBUTION = "bws_engine_double"
UV_VERSION = "0.13.9"  # roles/python_env/defaults/main.yml python_env_uv_version

ENTRY = '''"""ENGINE TEST DOUBLE, packaged: version {version}."""
import os
import sys

from bws_engine_double.engine import main as _main

FAULT = {fault!r}


def main() -> None:
    if FAULT:
        os.environ.setdefault("ENGINE_DOUBLE_FAULT", FAULT)
    sys.exit(_main(sys.argv))
'''


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(directory: Path, version: str, fault: str = "") -> Path:
    """A py3-none-any wheel of the double; `fault` is the ENGINE_DOUBLE_FAULT its engine runs with."""
    dist_info = f"{DISTRIBUTION}-{version}.dist-info"
    files = {
        f"{DISTRIBUTION}/__init__.py": ENTRY.format(version=version, fault=fault).encode(),
        f"{DISTRIBUTION}/engine.py": (REPO / "tests" / "doubles" / "engine_double.py").read_bytes(),
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist_info}/entry_points.txt": f"[console_scripts]\nsglang = {DISTRIBUTION}:main\n".encode(),
    }
    record = [_record_line(name, data) for name, data in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{DISTRIBUTION}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return wheel


def write_lock(path: Path, wheel: Path) -> Path:
    version = wheel.name.split("-")[1]
    path.write_text(yaml.safe_dump({
        "engine": "sglang",
        "requirements": [f"{DISTRIBUTION}=={version}"],
        "hashes": {DISTRIBUTION: [hashlib.sha256(wheel.read_bytes()).hexdigest()]},
    }))
    return path


def download_uv_wheel(directory: Path) -> None:
    """The uv wheel python_env installs uv from, in air-gapped mode (PyPI; pip's cache makes a repeat cheap)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                    "--only-binary=:all:", "--platform=manylinux_2_17_x86_64", "--python-version=3.11",
                    f"--dest={directory}", f"uv=={UV_VERSION}"], check=True)
