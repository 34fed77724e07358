"""The baselines engine_status reads (module_utils/release/baselines.py): what verify recorded, with its history."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.blackwell.serving.plugins.module_utils.release.baselines import (
    baseline_lines,
    read_baselines,
)

KEY = {"engine": "sglang", "engine_version": "0.5.23", "model": "c0ffee", "tensor_parallel_size": 8,
       "gpu_model": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "workloads": {"sharegpt": {"output_len": 256}}}


def _baseline(timestamp: str, throughput: dict[str, float], **key: object) -> dict:
    return {"kind": "verify-baseline", "schema": 2, "host": "gpu1", "engine": "sglang", "profile": "kimi-k25-int4",
            "timestamp": timestamp, "key": {**KEY, **key}, "output_throughput": throughput}


def _write(path: Path, document: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document if isinstance(document, str) else json.dumps(document))


def test_no_recorded_baseline_is_an_empty_list_and_one_line_saying_how_to_record(tmp_path):
    assert read_baselines(str(tmp_path)) == []
    assert baseline_lines([]) == ["no throughput baseline recorded (verify_mode=baseline records one)"]


def test_each_key_is_listed_newest_first_with_the_ones_it_replaced(tmp_path):
    store = tmp_path / "verify-baselines"
    _write(store / "aaaaaaaaaaaaaaaa.json", _baseline("2026-12-07T10:00:00Z", {"1": 41.5, "8": 250.0}))
    _write(store / "history" / "aaaaaaaaaaaaaaaa-111111111111.json", _baseline("2026-12-01T09:00:00Z", {"1": 40.0}))
    _write(store / "history" / "aaaaaaaaaaaaaaaa-222222222222.json", _baseline("2026-12-03T09:00:00Z", {"1": 39.0}))
    _write(store / "bbbbbbbbbbbbbbbb.json", _baseline(
        "2026-12-07T12:00:00Z", {"1": 30.0}, layout={"tensor_parallel_size": 8, "expert_parallel_size": 8,
                                                     "data_parallel_size": 1}))
    # another key's history is not this key's
    _write(store / "history" / "cccccccccccccccc-333333333333.json", _baseline("2026-12-02T09:00:00Z", {"1": 1.0}))

    newest, older = read_baselines(str(tmp_path))

    assert newest["key"] == "bbbbbbbbbbbbbbbb" and newest["history"] == []
    assert newest["layout"] == {"tensor_parallel_size": 8, "expert_parallel_size": 8, "data_parallel_size": 1}
    assert older["key"] == "aaaaaaaaaaaaaaaa"
    assert older["recorded"] == "2026-12-07T10:00:00Z" and older["output_throughput"] == {"1": 41.5, "8": 250.0}
    assert (older["engine"], older["engine_version"], older["model"]) == ("sglang", "0.5.23", "c0ffee")
    assert [entry["recorded"] for entry in older["history"]] == ["2026-12-03T09:00:00Z", "2026-12-01T09:00:00Z"]
    assert older["history"][0] == {"file": "aaaaaaaaaaaaaaaa-222222222222.json", "recorded": "2026-12-03T09:00:00Z",
                                   "output_throughput": {"1": 39.0}}
    assert "workloads" not in older  # the key hash stands for them

    first, second = baseline_lines([newest, older])
    assert first == ("baseline bbbbbbbbbbbbbbbb recorded 2026-12-07T12:00:00Z: profile kimi-k25-int4, sglang 0.5.23, "
                     "tensor 8 x expert 8, NVIDIA RTX PRO 6000 Blackwell Server Edition: c1 30.0 tok/s")
    assert second.endswith("tensor 8, NVIDIA RTX PRO 6000 Blackwell Server Edition: c1 41.5 tok/s, c8 250.0 tok/s "
                           "(replaced 2 earlier, kept in verify-baselines/history/)")


def test_a_file_that_is_not_a_baseline_is_listed_with_why_not_skipped(tmp_path):
    store = tmp_path / "verify-baselines"
    _write(store / "dddddddddddddddd.json", "{half a docu")
    _write(store / "eeeeeeeeeeeeeeee.json", {"kind": "verify-report"})
    _write(store / "history" / "eeeeeeeeeeeeeeee-444444444444.json", "not json")

    broken = {entry["key"]: entry for entry in read_baselines(str(tmp_path))}

    assert broken["dddddddddddddddd"]["error"].startswith("cannot be read: ")
    assert broken["eeeeeeeeeeeeeeee"]["error"] == "is not a verify baseline (its kind is not verify-baseline)"
    assert broken["eeeeeeeeeeeeeeee"]["history"][0]["error"].startswith("cannot be read: ")
    assert "output_throughput" not in broken["dddddddddddddddd"]
    assert sorted(baseline_lines(list(broken.values())))[1] == (
        "baseline eeeeeeeeeeeeeeee: is not a verify baseline (its kind is not verify-baseline)")
