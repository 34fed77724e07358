#!/usr/bin/env python3
"""Write a tiny, well-formed model directory (config.json, safetensors shards and their index).

Used to give sandbox and test hosts weights that the real completeness check accepts. Stdlib only;
it runs on the test host with the distribution's python3. Not a model: the tensors are zeros.
"""

import json
import struct
import sys
from pathlib import Path


def write_shard(path: Path, tensors: dict[str, int]) -> dict[str, str]:
    """Write a safetensors file with float32 zero tensors of the given element counts."""
    header, offset = {}, 0
    for name, count in tensors.items():
        header[name] = {"dtype": "F32", "shape": [count], "data_offsets": [offset, offset + 4 * count]}
        offset += 4 * count
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))
    return {name: path.name for name in tensors}


def make_model(directory: Path, shards: int = 2) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for index in range(1, shards + 1):
        shard = directory / f"model-{index:05d}-of-{shards:05d}.safetensors"
        weight_map.update(write_shard(shard, {f"layers.{index}.weight": 256 * index}))
        total += 4 * 256 * index
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    (directory / "config.json").write_text(json.dumps({"architectures": ["TinyForCausalLM"],
                                                       "model_type": "tiny"}, indent=2) + "\n")


if __name__ == "__main__":
    for target in sys.argv[1:]:
        make_model(Path(target))
