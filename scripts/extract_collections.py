"""Extract the collections pinned in requirements.yml from the `ansible` bundle wheel.

Galaxy is unreachable on some networks; PyPI carries the whole bundle. Only the pinned
collections are unpacked, and their versions must match the pins exactly.
"""

import json
import sys
import zipfile
from pathlib import Path

import yaml


def pinned_collections(requirements: Path) -> dict[str, str]:
    data = yaml.safe_load(requirements.read_text())
    return {c["name"]: str(c["version"]) for c in data["collections"]}


def extract(wheel: Path, pins: dict[str, str], dest: Path) -> None:
    with zipfile.ZipFile(wheel) as bundle:
        names = bundle.namelist()
        for fqcn, version in pins.items():
            prefix = "ansible_collections/" + fqcn.replace(".", "/") + "/"
            manifest = json.loads(bundle.read(prefix + "MANIFEST.json"))
            found = manifest["collection_info"]["version"]
            if found != version:
                sys.exit(f"{wheel.name} has {fqcn} {found}, requirements.yml pins {version}")
            bundle.extractall(dest, [n for n in names if n.startswith(prefix)])
            print(f"  {fqcn} {version}")


def main() -> None:
    wheel, requirements, dest = (Path(a) for a in sys.argv[1:4])
    extract(wheel, pinned_collections(requirements), dest)


if __name__ == "__main__":
    main()
