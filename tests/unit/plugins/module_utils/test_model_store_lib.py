"""Unit tests of the model store's parsing, planning and verification (plugins/module_utils/bws_model*.py)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
import sys
import threading
import types
from pathlib import Path

import pytest

from tests.module_utils_loader import load_module_util

REPO_ROOT = Path(__file__).resolve().parents[4]


bws_model = load_module_util("model.store")
parallel = load_module_util("model.parallel")
load_module_util("model.hub")
transfer = load_module_util("model.transfer")
ModelStoreError = bws_model.ModelStoreError


def safetensors(tensor_bytes: list[int]) -> bytes:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for index, size in enumerate(tensor_bytes):
        header[f"t{index}"] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\x01" * offset


def write_model(root: Path, shards: int = 2) -> dict[str, bytes]:
    root.mkdir(parents=True, exist_ok=True)
    files = {"config.json": b'{"hidden_size": 8}'}
    weight_map = {}
    for number in range(1, shards + 1):
        name = f"model-{number:05d}-of-{shards:05d}.safetensors"
        files[name] = safetensors([100 * number, 37])
        weight_map[f"w{number}"] = name
    files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


# ---------------------------------------------------------------- listings


def test_hf_tree_takes_lfs_sha256_and_git_ids_and_skips_directories():
    entries = [
        {"type": "directory", "oid": "a" * 40, "size": 0, "path": "original"},
        {"type": "file", "oid": "b" * 40, "size": 12, "path": "config.json"},
        {
            "type": "file",
            "oid": "c" * 40,
            "size": 134,
            "path": "model-00001.safetensors",
            "lfs": {"oid": "D" * 64, "size": 9_000_000_000, "pointerSize": 134},
        },
    ]
    files = bws_model.parse_hf_tree(entries)
    assert [f.to_dict() for f in files] == [
        {"path": "config.json", "size": 12, "git_oid": "b" * 40},
        {"path": "model-00001.safetensors", "size": 9_000_000_000, "sha256": "d" * 64},
    ]


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "a/../../b", "a//b", ".model_store/x", "x.part", ""])
def test_listing_paths_that_leave_the_directory_or_use_reserved_names_are_refused(path):
    with pytest.raises(ModelStoreError, match="refusing listing path"):
        bws_model.safe_relpath(path)


def test_link_header_next_page():
    header = '<https://hub/api/models/a/b/tree/main?cursor=xyz>; rel="next", <https://hub/x>; rel="prev"'
    assert bws_model.parse_link_next(header) == "https://hub/api/models/a/b/tree/main?cursor=xyz"
    assert bws_model.parse_link_next('<https://hub/x>; rel="prev"') is None
    assert bws_model.parse_link_next(None) is None


def test_rsync_list_output_gives_regular_files_with_sizes():
    text = (
        "drwxr-xr-x          4,096 2026/11/29 09:00:00 .\n"
        "-rw-r--r--             56 2026/11/29 09:00:00 config.json\n"
        "-rw-r--r--  9,663,676,416 2026/11/29 09:00:00 model-00001-of-00064.safetensors\n"
        "lrwxrwxrwx             11 2026/11/29 09:00:00 link -> config.json\n"
        "-rw-r--r--             10 2026/11/29 09:00:00 sub dir/file with spaces.txt\n"
        "-rw-r--r--            100 2026/11/29 09:00:00 half.safetensors.part\n"
    )
    assert [(f.path, f.size) for f in bws_model.parse_rsync_list(text)] == [
        ("config.json", 56),
        ("model-00001-of-00064.safetensors", 9_663_676_416),
        ("sub dir/file with spaces.txt", 10),
    ]


def test_manifest_entries_are_validated():
    files = bws_model.parse_manifest({"files": [{"path": "a.bin", "size": 3, "sha256": "A" * 64}]})
    assert files[0].sha256 == "a" * 64
    with pytest.raises(ModelStoreError, match="sha256"):
        bws_model.parse_manifest({"files": [{"path": "a.bin", "size": 3, "sha256": "xyz"}]})
    with pytest.raises(ModelStoreError, match="size"):
        bws_model.parse_manifest({"files": [{"path": "a.bin", "size": -1}]})
    with pytest.raises(ModelStoreError, match='"files" list'):
        bws_model.parse_manifest({"shards": []})


def test_include_and_exclude_patterns():
    files = [bws_model.RemoteFile(p, 1) for p in ("config.json", "model.safetensors", "docs/x.md", "figures/a.png")]
    kept = bws_model.filter_files(files, include=[], exclude=["*.md", "figures/*"])
    assert [f.path for f in kept] == ["config.json", "model.safetensors"]
    assert [f.path for f in bws_model.filter_files(files, ["*.json"], [])] == ["config.json"]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"type": "s3", "bucket": "x"}, "needs a type"),
        ({"type": "hf"}, r"missing keys \['repo'\]"),
        ({"type": "hf", "repo": "a/b", "revison": "main"}, r"unknown keys \['revison'\]"),
        ({"type": "rsync", "src": "h:/p", "options": "-z"}, "list of strings"),
    ],
)
def test_bad_sources_are_named(source, message):
    with pytest.raises(ModelStoreError, match=message):
        transfer.validate_source(source)


# ---------------------------------------------------------------- hashing


def test_git_blob_id_matches_git_hash_object():
    data = b'{"hidden_size": 8}\n'
    digest = bws_model.Digest(len(data), want_git_oid=True)
    digest.update(data)
    expected = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # what `git hash-object` prints
    assert digest.mismatch(bws_model.RemoteFile("config.json", len(data), git_oid=expected)) is None
    assert "git blob id" in digest.mismatch(bws_model.RemoteFile("config.json", len(data), git_oid="0" * 40))


# ---------------------------------------------------------------- completeness check


def test_safetensors_expected_size_reads_the_header(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(safetensors([10, 20]))
    assert bws_model.safetensors_expected_size(str(path)) == path.stat().st_size
    path.write_bytes(b"\x00\x00")
    with pytest.raises(ModelStoreError, match="8-byte"):
        bws_model.safetensors_expected_size(str(path))


def test_complete_directory(tmp_path):
    files = write_model(tmp_path / "m")
    result = bws_model.check_model_dir(str(tmp_path / "m"), require_index=True)
    assert result["complete"] is True, result["msg"]
    assert result["problems"] == []
    assert result["total_bytes"] == sum(len(data) for data in files.values())
    assert result["files_checked"] == len(files)


def test_missing_shard_is_named_first_with_what_to_do(tmp_path):
    write_model(tmp_path / "m", shards=3)
    (tmp_path / "m" / "model-00002-of-00003.safetensors").unlink()
    result = bws_model.check_model_dir(str(tmp_path / "m"))
    assert result["complete"] is False
    assert result["problems"] == [
        {
            "file": "model-00002-of-00003.safetensors",
            "reason": "missing",
            "expected_bytes": None,
            "actual_bytes": None,
        }
    ]
    assert result["msg"].startswith(f"model-00002-of-00003.safetensors is missing in {tmp_path / 'm'}")
    assert "fetch_models.yml" in result["msg"]


def test_truncated_shard_found_from_its_own_header(tmp_path):
    files = write_model(tmp_path / "m")
    shard = tmp_path / "m" / "model-00002-of-00002.safetensors"
    shard.write_bytes(files[shard.name][:-5])
    result = bws_model.check_model_dir(str(tmp_path / "m"))
    size = len(files[shard.name])
    assert result["problems"] == [
        {"file": shard.name, "reason": "short", "expected_bytes": size, "actual_bytes": size - 5}
    ]
    assert f"(expected {size} bytes, found {size - 5})" in result["msg"]


def test_partial_download_and_missing_index(tmp_path):
    files = write_model(tmp_path / "m")
    shard = tmp_path / "m" / "model-00001-of-00002.safetensors"
    shard.rename(str(shard) + ".part")
    (tmp_path / "m" / "model.safetensors.index.json").unlink()
    result = bws_model.check_model_dir(str(tmp_path / "m"), require_index=True)
    assert result["problems"][0]["file"] == "model.safetensors.index.json"
    assert result["problems"][0]["reason"] == "missing"
    # without the index the partial shard is not known to be wanted; with it, it is reported as partial
    (tmp_path / "m" / "model.safetensors.index.json").write_bytes(files["model.safetensors.index.json"])
    result = bws_model.check_model_dir(str(tmp_path / "m"), require_index=True)
    assert result["problems"][0]["reason"] == "partial"
    assert "is only partly downloaded" in result["msg"]


def test_manifest_sizes_are_checked_for_every_listed_file(tmp_path):
    root = tmp_path / "m"
    write_model(root)
    (root / "tokenizer.json").write_text("{}")
    bws_model.write_json_atomic(str(root / ".model_store" / "manifest.json"), bws_model.build_manifest(str(root)))
    (root / "tokenizer.json").write_text("{ }")
    result = bws_model.check_model_dir(str(root))
    assert result["problems"] == [
        {"file": "tokenizer.json", "reason": "too_long", "expected_bytes": 2, "actual_bytes": 3}
    ]


def test_missing_directory(tmp_path):
    result = bws_model.check_model_dir(str(tmp_path / "nope"))
    assert result["complete"] is False
    assert "does not exist" in result["msg"]


# ---------------------------------------------------------------- plan / fetch / finalize with a local source


def store_for(source: Path, dest: Path, **kwargs):
    return transfer.ModelStore(
        str(dest), transfer.make_source({"type": "local", "path": str(source)}, None, 5), **kwargs
    )


def test_plan_counts_partial_bytes_and_disk_check_names_needed_and_free(tmp_path, monkeypatch):
    files = write_model(tmp_path / "src")
    dest = tmp_path / "dest"
    dest.mkdir()
    shard = "model-00001-of-00002.safetensors"
    (dest / f"{shard}.part").write_bytes(files[shard][:50])
    store = store_for(tmp_path / "src", dest, reserve_bytes=1000)
    plan = store.plan()
    assert plan["needed_bytes"] == sum(len(d) for d in files.values()) - 50
    assert {e["path"]: e["part_bytes"] for e in plan["to_fetch"]}[shard] == 50
    plan["free_bytes"] = plan["needed_bytes"] + 999  # one byte short of the reserve
    with pytest.raises(ModelStoreError, match=r"not enough disk .* need .* \+ reserve .* free .*Nothing was written"):
        store.fetch(plan)
    assert sorted(os.listdir(dest)) == [f"{shard}.part"]


def test_fetch_resumes_a_part_verifies_and_records_then_nothing_to_do(tmp_path):
    files = write_model(tmp_path / "src")
    dest = tmp_path / "dest"
    dest.mkdir()
    shard = "model-00002-of-00002.safetensors"
    (dest / f"{shard}.part").write_bytes(files[shard][:77])
    store = store_for(tmp_path / "src", dest)
    plan = store.plan()
    assert sorted(store.fetch(plan)) == sorted(files)
    assert store.finalize(store.plan(listing=plan["listing"])) is True
    assert all((dest / name).read_bytes() == data for name, data in files.items())
    manifest = json.loads((dest / ".model_store" / "manifest.json").read_text())
    assert manifest["complete"] is True
    # the local source publishes no checksums: the ones computed while verifying are recorded
    assert {e["path"]: e["sha256"] for e in manifest["files"]} == {
        name: hashlib.sha256(data).hexdigest() for name, data in files.items()
    }
    again = store.plan()
    assert again["complete"] is True and again["to_fetch"] == []


def test_a_file_of_the_wrong_size_is_never_overwritten(tmp_path):
    write_model(tmp_path / "src")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "config.json").write_text("mine")
    store = store_for(tmp_path / "src", dest)
    plan = store.plan()
    assert plan["conflicts"] == [{"file": "config.json", "expected_bytes": 18, "actual_bytes": 4}]
    with pytest.raises(ModelStoreError, match=r"config.json .* is 4 bytes but the source has 18.*not overwritten"):
        store.fetch(plan)
    assert (dest / "config.json").read_text() == "mine"


def test_a_complete_copy_is_not_replaced_when_the_source_changes(tmp_path):
    write_model(tmp_path / "src")
    dest = tmp_path / "dest"
    store = store_for(tmp_path / "src", dest)
    plan = store.plan()
    store.fetch(plan)
    store.finalize(store.plan(listing=plan["listing"]))
    (tmp_path / "src" / "config.json").write_text('{"hidden_size": 16, "x": 1}')
    assert store.plan()["complete"] is True  # without refresh the record is trusted: no listing at all
    with pytest.raises(ModelStoreError, match=r"holds a complete copy .* first config.json.* not overwritten"):
        store.plan(refresh=True)
    assert (dest / "config.json").read_text() == '{"hidden_size": 8}'


def test_corrupt_existing_file_is_reported_not_replaced(tmp_path):
    files = write_model(tmp_path / "src")
    bws_model.write_json_atomic(
        str(tmp_path / "src" / ".model_store" / "manifest.json"),
        bws_model.build_manifest(str(tmp_path / "src")),
    )
    dest = tmp_path / "dest"
    dest.mkdir()
    shard = "model-00001-of-00002.safetensors"
    corrupt = b"\x02" * len(files[shard])
    (dest / shard).write_bytes(corrupt)
    store = store_for(tmp_path / "src", dest)
    plan = store.plan()
    store.fetch(plan)
    with pytest.raises(ModelStoreError, match=f"{shard} in .* has sha256 .* not overwritten"):
        store.finalize(store.plan(listing=plan["listing"]))
    assert (dest / shard).read_bytes() == corrupt


def test_batches_group_small_files_and_keep_large_ones_alone():
    entries = [
        {"path": "big-1", "size": 900, "part_bytes": 0},
        {"path": "a", "size": 10, "part_bytes": 0},
        {"path": "b", "size": 20, "part_bytes": 0},
        {"path": "big-2", "size": 800, "part_bytes": 400},
    ]
    batches = transfer.batches(entries, batch_bytes=100)
    assert [b["paths"] for b in batches] == [["a", "b"], ["big-2"], ["big-1"]]
    assert batches[1]["label"] == "big-2 (800 B, resuming at 400 B)"
    assert batches[0]["label"] == "2 files: a, b (30 B)"


def test_progress_file_reports_bytes_rate_and_eta(tmp_path):
    progress = transfer.Progress(str(tmp_path / "progress.json"), total_bytes=1000, done_before=100)
    progress.update(300, "x.safetensors", final=True)
    doc = json.loads((tmp_path / "progress.json").read_text())
    assert doc["file"] == "x.safetensors"
    assert doc["bytes_done"] == 400 and doc["bytes_total"] == 1000 and doc["slice_bytes"] == 300
    assert doc["rate_bytes_per_s"] > 0 and doc["eta_s"] is not None
    line = transfer.progress_line(doc)
    assert line.startswith("400 B of 1000 B (40%), ") and "/s, ETA " in line


def test_content_range_must_start_at_the_range_asked_for():
    item = bws_model.RemoteFile("x", 100)
    check = parallel.ParallelFetch.check_answer

    class Answer:
        status = 206

        def __init__(self, header: str) -> None:
            self.headers = {"Content-Range": header}

    assert check(Answer("bytes 40-99/100"), parallel.Piece(40, 100), item, "u") == 0
    with pytest.raises(ModelStoreError, match="Content-Range"):
        check(Answer("bytes 0-99/100"), parallel.Piece(40, 100), item, "u")
    with pytest.raises(ModelStoreError, match="source changed"):
        check(Answer("bytes 40-119/120"), parallel.Piece(40, 100), item, "u")


# ---------------------------------------------------------------- parallel ranges, hashed in order


class FakeRanges:
    """Serves bytes [start, end) of in-memory files like urllib would, cutting chosen ranges short once."""

    def __init__(self, files: dict[str, bytes], cut: dict[int, int] | None = None, delay_first: float = 0.0):
        self.files = files
        self.cut = dict(cut or {})  # range start -> bytes to send before the connection drops
        self.asked: list[tuple[str, int, int]] = []
        self.delay_first = delay_first

    def open(self, url: str, start: int, end: int, size: int):
        import io
        import time

        self.asked.append((url, start, end))
        if self.delay_first and start == 0:
            time.sleep(self.delay_first)  # the first range arrives last: later ranges must wait for it
        body = self.files[url][start:end]
        if start in self.cut:
            body = body[: self.cut.pop(start)]
        answer = io.BytesIO(body)
        answer.status = 206
        answer.headers = {"Content-Range": f"bytes {start}-{end - 1}/{size}"}
        return answer


def parallel_fetch(dest: Path, files: dict[str, bytes], server: FakeRanges, **kwargs):
    items = [
        bws_model.RemoteFile(name, len(data), sha256=hashlib.sha256(data).hexdigest()) for name, data in files.items()
    ]
    recorded = {}
    fetch = parallel.ParallelFetch(
        str(dest),
        items,
        lambda item: item.path,
        server.open,
        retry_delay=0.0,
        on_file_done=lambda item, sha: recorded.__setitem__(item.path, sha),
        **kwargs,
    )
    return fetch, recorded


def test_ranges_on_several_streams_are_hashed_in_order_while_they_arrive(tmp_path):
    data = os.urandom(5 * 1024 * 1024 + 123)
    files = {"big.safetensors": data, "small.json": b"{}"}
    server = FakeRanges(files, delay_first=0.3)
    fetch, recorded = parallel_fetch(tmp_path, files, server, streams=4, piece_bytes=1024 * 1024)
    assert sorted(fetch.run()) == ["big.safetensors", "small.json"]
    assert (tmp_path / "big.safetensors").read_bytes() == data
    assert recorded["big.safetensors"] == hashlib.sha256(data).hexdigest()
    starts = sorted(start for url, start, _ in server.asked if url == "big.safetensors")
    assert starts == [i * 1024 * 1024 for i in range(6)]
    assert not list(tmp_path.rglob("*.part"))
    assert not (tmp_path / ".model_store" / "parts" / "big.safetensors.json").exists()


def test_memory_held_ahead_of_the_hashing_position_stays_within_the_budget(tmp_path, monkeypatch):
    data = os.urandom(12 * 1024 * 1024)
    server = FakeRanges({"f": data}, delay_first=0.5)
    mib = 1024 * 1024
    fetch, _ = parallel_fetch(tmp_path, {"f": data}, server, streams=4, piece_bytes=mib, buffer_bytes=4 * mib)
    peak = []
    original = fetch.copy_piece

    def watched(job, piece, response):
        original(job, piece, response)
        peak.append(fetch.buffered)

    monkeypatch.setattr(fetch, "copy_piece", watched)
    fetch.run()
    # the budget, plus the chunk (here a whole 1 MiB range) at the hashing position that is never held back
    assert 3 * mib <= max(peak) <= 5 * mib
    assert (tmp_path / "f").read_bytes() == data


def test_a_truncated_range_is_fetched_again_from_where_it_stopped(tmp_path):
    data = os.urandom(3 * 1024 * 1024)
    server = FakeRanges({"f": data}, cut={1024 * 1024: 1000})
    fetch, recorded = parallel_fetch(tmp_path, {"f": data}, server, streams=2, piece_bytes=1024 * 1024)
    fetch.run()
    assert (tmp_path / "f").read_bytes() == data and recorded["f"] == hashlib.sha256(data).hexdigest()
    assert ("f", 1024 * 1024 + 1000, 2 * 1024 * 1024) in server.asked


def test_kept_ranges_of_an_interrupted_run_are_not_fetched_again(tmp_path):
    data = os.urandom(4 * 1024 * 1024)
    mib = 1024 * 1024
    server = FakeRanges({"f": data}, cut={2 * mib: 5000})
    fetch, _ = parallel_fetch(tmp_path, {"f": data}, server, streams=2, piece_bytes=mib, retries=0)
    with pytest.raises(ModelStoreError, match=r"^f: .*gave up after 0 retries: re-run to resume"):
        fetch.run()
    assert not (tmp_path / "f").exists()
    kept = parallel.kept_ranges(str(tmp_path), "f", len(data))
    assert (2 * mib, 2 * mib + 5000) in kept or any(s <= 2 * mib and e == 2 * mib + 5000 for s, e in kept)
    server.asked.clear()
    fetch, recorded = parallel_fetch(tmp_path, {"f": data}, server, streams=2, piece_bytes=mib)
    fetch.run()
    assert (tmp_path / "f").read_bytes() == data and recorded["f"] == hashlib.sha256(data).hexdigest()
    fetched_again = sum(end - start for _, start, end in server.asked)
    assert fetched_again == len(data) - sum(e - s for s, e in kept)


def test_a_sha256_mismatch_names_the_file_and_leaves_nothing_that_looks_complete(tmp_path):
    data = os.urandom(2 * 1024 * 1024)
    server = FakeRanges({"f.safetensors": data})
    fetch, recorded = parallel_fetch(tmp_path, {"f.safetensors": data}, server, piece_bytes=1024 * 1024)
    fetch.waiting[0][1].sha256 = "0" * 64
    with pytest.raises(ModelStoreError, match=r"^f.safetensors downloaded with sha256 .* set aside as .*rejected"):
        fetch.run()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["f.safetensors.part.rejected"]
    assert parallel.kept_ranges(str(tmp_path), "f.safetensors", len(data)) == []
    assert recorded == {}


# ---------------------------------------------------------------- Hub client: digests of the bytes as written

hub = load_module_util("model.hub")
MIB = 1024 * 1024


def load_runner():
    """roles/model_store/files/bws_hf_fetch.py (it imports huggingface_hub only when it runs a job)."""
    spec = importlib.util.spec_from_file_location("bws_hf_fetch", REPO_ROOT / "roles/model_store/files/bws_hf_fetch.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    return runner


def fake_file_download(data: bytes, how: str) -> types.SimpleNamespace:
    """huggingface_hub.file_download's http_get as far as the runner sees it: it writes the body into the file
    it is given, calls itself (the module's name) to resume after a cut, and rewinds when a server ignores the
    Range of the resume."""
    module = types.SimpleNamespace()

    def http_get(url, temp_file, *, resume_size=0, server_ignores_range=False):
        if resume_size == 0 and how in ("resume", "rewind", "seek"):
            temp_file.write(data[:MIB])
            return module.http_get(url, temp_file, resume_size=MIB, server_ignores_range=how == "rewind")
        if how == "seek":  # looks back into the file, then carries on at the end
            temp_file.seek(10)
            temp_file.seek(resume_size)
        if server_ignores_range:
            temp_file.seek(max(temp_file.tell() - resume_size, 0))
            temp_file.truncate()
            resume_size = 0
        for start in range(resume_size, len(data), MIB):
            temp_file.write(data[start : start + MIB])
        return None

    module.http_get = http_get
    return module


@pytest.mark.parametrize("how", ["whole", "resume", "rewind", "seek"])
def test_the_runner_hashes_the_bytes_the_client_writes(tmp_path, how):
    runner = load_runner()
    data = os.urandom(3 * MIB + 17)
    module = fake_file_download(data, how)
    events, current = [], threading.local()
    runner.hash_while_writing(module, current, events.append)
    current.job = {"path": "f.bin", "file": None, "size": len(data), "want_git": True}
    with open(tmp_path / "f.bin", "wb") as handle:
        module.http_get("http://hub/f.bin", handle)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert events == [{"body": "f.bin"}]
    digests = current.job["file"].digests()
    if how == "seek":  # the client wrote somewhere else than at the end: the module reads the file instead
        assert digests == {}
    else:
        git = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
        assert digests == {"sha256": hashlib.sha256(data).hexdigest(), "git_oid": git}


def test_the_runner_reports_no_digest_for_a_file_it_did_not_see_whole(tmp_path):
    runner = load_runner()
    with open(tmp_path / "f", "wb") as handle:
        hashing = runner.HashingFile(handle, 10, want_git=False)
        hashing.write(b"12345")
    assert hashing.digests() == {}  # 5 of 10 bytes
    with open(tmp_path / "g", "wb") as handle:
        handle.write(b"kept")
        assert runner.HashingFile(handle, 4, want_git=False).digests() == {}  # did not start at byte 0


def test_streamed_digests_verify_a_hub_file_without_reading_it(tmp_path, monkeypatch):
    data = b"\x07" * 1000
    (tmp_path / "a.safetensors").write_bytes(data)
    (tmp_path / "config.json").write_bytes(b"{}")
    sha = hashlib.sha256(data).hexdigest()
    lfs = bws_model.RemoteFile("a.safetensors", len(data), sha256=sha)
    blob = hashlib.sha1(b"blob 2\0{}", usedforsecurity=False).hexdigest()
    small = bws_model.RemoteFile("config.json", 2, git_oid=blob)
    reads = []
    original = bws_model.Digest.update_from_file
    monkeypatch.setattr(bws_model.Digest, "update_from_file", lambda self, *a: reads.append(a) or original(self, *a))

    assert hub.check_fetched(str(tmp_path), lfs, "read", {"sha256": sha}) == ("sha256", sha)
    small_sha = hashlib.sha256(b"{}").hexdigest()
    streamed = {"sha256": small_sha, "git_oid": blob}
    assert hub.check_fetched(str(tmp_path), small, "read", streamed) == ("git-oid", small_sha)
    assert reads == []
    # a git blob id is published but the runner has none: the file is read
    assert hub.check_fetched(str(tmp_path), small, "read", {"sha256": small_sha}) == ("git-oid", small_sha)
    assert hub.check_fetched(str(tmp_path), lfs, "read", None) == ("sha256", sha)
    assert len(reads) == 2
    assert hub.check_fetched(str(tmp_path), lfs, "trust", None) == ("hf-client", sha)


def test_a_streamed_sha256_mismatch_sets_the_hub_file_aside(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"\x07" * 1000)
    item = bws_model.RemoteFile("a.safetensors", 1000, sha256="1" * 64)
    with pytest.raises(ModelStoreError, match=r"^a.safetensors downloaded with sha256 0+ but the source publishes 1+"):
        hub.check_fetched(str(tmp_path), item, "read", {"sha256": "0" * 64})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors.part.rejected"]


def test_the_plan_says_which_fetch_program_and_lock_the_tools_venv_holds(tmp_path):
    venv = tmp_path / "venv"
    assert hub.client_held(str(venv)) == {}  # no Python: the role installs
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    assert hub.client_held(str(venv)) == {"runner_sha1": None, "lock_sha1": None}
    runner = REPO_ROOT / "roles/model_store/files/bws_hf_fetch.py"
    (venv / "bws_hf_fetch.py").write_bytes(runner.read_bytes())
    (venv / "hf-client.lock.installed").write_bytes(b"huggingface_hub==2.4.0\n")
    assert hub.client_held(str(venv)) == {
        "runner_sha1": hashlib.sha1(runner.read_bytes(), usedforsecurity=False).hexdigest(),
        "lock_sha1": hashlib.sha1(b"huggingface_hub==2.4.0\n", usedforsecurity=False).hexdigest(),
    }
