"""Seed ansible-test's pip bootstrap from the package registry.

ansible-test sanity makes a venv per test and bootstraps pip into it with a get-pip script that it downloads from
ci-files.testing.ansible.com, which these machines cannot reach. Its cache (~/.ansible/test/cache/get_pip_<version>.py)
is read first: this writes there a script that runs pip from PyPI's pip wheel of the version ansible-test asks for
(downloaded once into the project's cache), installing what ansible-test passes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from ansible_test._internal.python_requirements import get_venv_packages

GET_PIP_OWN_OPTIONS = ("--no-setuptools", "--no-wheel")  # get-pip.py's own options; pip install has neither

SEED = '''"""ansible-test's pip bootstrap, seeded from PyPI's pip wheel (scripts/ansible_test_seed.py)."""
import sys

sys.path.insert(0, {wheel!r})
from pip._internal.cli.main import main  # noqa: E402

sys.exit(main(["install", *(a for a in sys.argv[1:] if a not in {own!r})]))
'''


def main() -> None:
    version = get_venv_packages(SimpleNamespace(version=f"{sys.version_info[0]}.{sys.version_info[1]}"))["pip"]
    cache = Path(os.environ.get("CACHE_DIR", Path.home() / ".cache" / "blackwell-serving")) / "ansible-test-seed"
    wheel = cache / f"pip-{version}-py3-none-any.whl"
    if not wheel.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--dest", str(cache), f"pip=={version}"], check=True)
    script = Path.home() / ".ansible" / "test" / "cache" / f"get_pip_{version.replace('.', '_')}.py"
    text = SEED.format(wheel=str(wheel), own=GET_PIP_OWN_OPTIONS)
    if not script.is_file() or script.read_text() != text:
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(text)
    print(f"ansible-test pip {version} bootstrap: {script} (from {wheel.name})")


if __name__ == "__main__":
    main()
