"""playbooks/fetch_models.yml against localhost: real transfers from the mirror double, local and rsync
sources, interruption and resume, a full disk, and completeness reports naming the file and what to do."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_helpers import (
    REPO_ROOT,
    hf_profile,
    make_tiny_model,
    mirror_double,
    run_fetch_playbook,
    scratch,
)

from tests.module_utils_loader import load_module_util

pytestmark = pytest.mark.integration

TOKEN = "hf_testtoken_0123456789"
SHARD = "model-00002-of-00003.safetensors"


def write_mirror_manifest(model_dir: Path) -> None:
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "module_utils" / "bws_model.py"), "write-manifest", str(model_dir)],
        check=True,
        capture_output=True,
    )


def same_tree(source: Path, copy: Path) -> bool:
    names = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file() and ".model_store" not in p.parts)
    return bool(names) and all(filecmp.cmp(source / name, copy / name, shallow=False) for name in names)


def test_hub_and_mirror_fetch_is_complete_verified_and_idempotent():
    with scratch() as work:
        hub = work / "hub"
        make_tiny_model(hub / "acme" / "tiny")
        make_tiny_model(hub / "acme" / "draft", shards=1, seed=7)
        write_mirror_manifest(hub / "acme" / "draft")
        with mirror_double(
            hub, work / "requests.jsonl", "--redirect-host", "localhost", "--page-size", "2", "--token", TOKEN
        ) as mirror:
            drafter = {
                "path": str(work / "models" / "draft"),
                "source": {"type": "http", "url": f"{mirror.url}/mirror/acme/draft/"},
            }
            profiles = hf_profile("tiny", work / "models" / "tiny", "acme/tiny", mirror.url, drafter)
            # default batching: the small files and the tiny shards of one directory move in one task item
            extra = {
                "engine_profile": "tiny",
                "model_store_hf_token": TOKEN,
                "model_store_batch_bytes": 268435456,
            }

            dry = run_fetch_playbook(work, profiles, extra, check=True)
            assert dry.rc == 0, dry.output
            assert dry.recap()["changed"] >= 2
            batch = "tiny: 6 files: tokenizer_config.json, config.json, model.safetensors.index.json, ..."
            assert f"{batch} (141.6 KiB)" in dry.output
            assert not (work / "models").exists(), "check mode wrote to the host"
            assert not [r for r in mirror.requests() if "/resolve/" in r["path"] or "/cdn/" in r["path"]]

            first = run_fetch_playbook(work, profiles, extra)
            assert first.rc == 0, first.output
            assert first.recap()["changed"] >= 2
            assert same_tree(hub / "acme" / "tiny", work / "models" / "tiny")
            assert same_tree(hub / "acme" / "draft", work / "models" / "draft")
            assert "draft: 4 files: " in first.output
            assert TOKEN not in first.output
            manifest = json.loads((work / "models" / "tiny" / ".model_store" / "manifest.json").read_text())
            assert manifest["complete"] is True
            assert all(
                len(entry["sha256"]) == 64 for entry in manifest["files"] if entry["path"].endswith(".safetensors")
            )
            shard_mode = stat.S_IMODE((work / "models" / "tiny" / SHARD).stat().st_mode)
            assert shard_mode == 0o644
            requests = mirror.requests()
            # the LFS redirect goes to another host name: the token went to the API and resolve, never the CDN
            cdn = [r for r in requests if r["path"].startswith("/cdn/")]
            assert cdn and not any(r["auth"] for r in cdn)
            assert any("cursor=2" in r["path"] for r in requests), "the paged tree was not followed"

            second = run_fetch_playbook(work, profiles, extra)
            assert second.rc == 0, second.output
            assert second.recap()["changed"] == 0, second.output
            assert len(mirror.requests()) == len(requests), "a complete copy was listed again without refresh"


def test_interrupted_transfer_resumes_from_the_partial_file():
    with scratch() as work:
        hub = work / "hub"
        source = make_tiny_model(hub / "acme" / "tiny")
        dest = work / "models" / "tiny"
        profiles = hf_profile("tiny", dest, "acme/tiny", "")
        extra = {"engine_profile": "tiny", "model_store_retries": 1}
        # bodies longer than 20000 bytes are cut after 20000 bytes, twice: one resume within the run, then
        # the run gives up
        with mirror_double(hub, work / "cut.jsonl", "--cut-after", "20000", "--cut-count", "2") as mirror:
            profiles["tiny"]["model"]["source"]["endpoint"] = mirror.url
            first = run_fetch_playbook(work, profiles, extra)
        assert first.rc != 0
        shards = sorted(p.name for p in source.glob("*.safetensors"))
        first_shard = shards[0]
        assert f"{first_shard}: transfer of {first_shard}.part stopped at 40000" in first.output
        assert "re-run to resume" in first.output
        assert (dest / f"{first_shard}.part").stat().st_size == 40000
        assert not (dest / first_shard).exists()
        ranges = [r["range"] for r in mirror.requests() if r["path"].endswith(first_shard)]
        assert ranges == [None, "bytes=20000-"]

        with mirror_double(hub, work / "resume.jsonl") as mirror:
            profiles["tiny"]["model"]["source"]["endpoint"] = mirror.url
            second = run_fetch_playbook(work, profiles, extra)
            assert second.rc == 0, second.output
            assert f"{first_shard} (47.1 KiB, resuming at 39.1 KiB)" in second.output
            served = [r for r in mirror.requests() if r["path"].endswith(first_shard)]
        assert [r["range"] for r in served] == ["bytes=40000-"]
        assert served[0]["bytes"] == (source / first_shard).stat().st_size - 40000
        assert same_tree(source, dest)
        assert not list(dest.glob("*.part"))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare for tmpfs")
def test_not_enough_disk_fails_before_writing_a_byte():
    with scratch() as work:
        hub = work / "hub"
        make_tiny_model(hub / "acme" / "tiny")
        models = work / "models"
        models.mkdir()
        profiles = hf_profile("tiny", models / "tiny", "acme/tiny", "")
        # a 64 KiB tmpfs in a private mount namespace; after the play, list what is on it
        wrap = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount -t tmpfs -o size=64k tmpfs "$0" || exit 99; "$@"; rc=$?; '
            'echo "ON-TMPFS:$(find "$0" -mindepth 1)"; exit $rc',
            str(models),
        ]
        with mirror_double(hub, work / "requests.jsonl") as mirror:
            profiles["tiny"]["model"]["source"]["endpoint"] = mirror.url
            result = run_fetch_playbook(work, profiles, {"engine_profile": "tiny"}, wrap=wrap)
            downloads = [r for r in mirror.requests() if "/resolve/" in r["path"]]
        if result.rc == 99:
            pytest.skip("this machine does not allow a tmpfs mount in a private mount namespace")
        assert result.rc != 0, result.output
        assert "Not enough disk on" in result.output
        assert "(145027 bytes)" in result.output  # needed: the whole listing
        assert "free 64.00 KB" in result.output
        assert "Nothing was written" in result.output
        assert "ON-TMPFS:\n" in result.output + "\n", "something was written to the full file system"
        assert downloads == []


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")
def test_local_and_rsync_sources_resume_and_never_overwrite_a_complete_copy():
    with scratch() as work:
        local_source = make_tiny_model(work / "src" / "local", shards=1, seed=3)
        rsync_source = make_tiny_model(work / "src" / "rsync", shards=1, seed=4)
        in_place = make_tiny_model(work / "models" / "in-place", shards=1, seed=5)
        local_dest, rsync_dest = work / "models" / "local", work / "models" / "rsync"
        # partial files from an earlier, interrupted run
        for source, dest in ((local_source, local_dest), (rsync_source, rsync_dest)):
            dest.mkdir(parents=True)
            shard = sorted(source.glob("*.safetensors"))[0]
            (dest / f"{shard.name}.part").write_bytes(shard.read_bytes()[:10000])
        profiles = {
            "loc": {
                "model": {"path": str(local_dest), "source": {"type": "local", "path": str(local_source)}},
                "drafter": {"path": str(in_place), "source": {"type": "local", "path": str(in_place)}},
            },
            "rs": {
                "model": {"path": str(rsync_dest), "source": {"type": "rsync", "src": f"{rsync_source}/"}},
                "drafter": None,
            },
        }
        extra = {"model_store_profiles": "loc,rs"}
        first = run_fetch_playbook(work, profiles, extra)
        assert first.rc == 0, first.output
        for dest in (local_dest, rsync_dest):
            assert f"{dest}: model-00001-of-00001.safetensors (47.1 KiB, resuming at 9.8 KiB)" in first.output
        assert same_tree(local_source, local_dest)
        assert same_tree(rsync_source, rsync_dest)
        assert not (in_place / ".model_store").exists(), "an in-place directory was written to"

        # the source changes: a refresh must refuse, and the complete copy stays byte for byte
        changed_shard = sorted(local_source.glob("*.safetensors"))[0]
        changed_shard.write_bytes(changed_shard.read_bytes() + b"\0" * 8)
        before = {p.name: p.read_bytes() for p in local_dest.iterdir() if p.is_file()}
        second = run_fetch_playbook(work, profiles, {**extra, "model_store_refresh": True})
        assert second.rc != 0
        assert "holds a complete copy" in second.output
        assert f"first {changed_shard.name}" in second.output
        assert "It is not overwritten" in second.output
        assert {p.name: p.read_bytes() for p in local_dest.iterdir() if p.is_file()} == before


def run_model_check(work: Path, path: Path) -> dict:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
    }
    env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.builtin.json"
    result = subprocess.run(
        [
            "ansible",
            "localhost",
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "-m",
            "model_check",
            "-a",
            f"path={path} require_index=true fail_on_incomplete=true",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # the JSON document sits between profile_tasks' banner and its timing table
    doc, _ = json.JSONDecoder().raw_decode(result.stdout[result.stdout.index("{") :])
    return doc["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_model_check_names_the_missing_and_the_truncated_shard():
    with scratch() as work:
        missing = make_tiny_model(work / "missing")
        (missing / SHARD).unlink()
        truncated = make_tiny_model(work / "truncated")
        shard = truncated / SHARD
        full_size = shard.stat().st_size
        shard.write_bytes(shard.read_bytes()[:-100])

        report = run_model_check(work, missing)
        assert report["failed"] is True and report["complete"] is False
        assert report["problems"][0] == {
            "file": SHARD,
            "reason": "missing",
            "expected_bytes": None,
            "actual_bytes": None,
        }
        assert report["msg"].startswith(f"{SHARD} is missing in {missing}")
        assert "fetch_models.yml" in report["msg"]

        report = run_model_check(work, truncated)
        assert report["failed"] is True
        assert report["problems"] == [
            {"file": SHARD, "reason": "short", "expected_bytes": full_size, "actual_bytes": full_size - 100}
        ]
        assert (
            f"{SHARD} is truncated in {truncated} (expected {full_size} bytes, found {full_size - 100})"
            in (report["msg"])
        )
        assert "resume" in report["msg"]
        assert shard.stat().st_size == full_size - 100  # the check changed nothing


def hub_store(dest: Path, endpoint: str, token: str | None = None, repo: str = "acme/tiny"):
    load_module_util("bws_model")
    transfer = load_module_util("bws_model_transfer")
    source = transfer.make_source({"type": "hf", "repo": repo, "endpoint": endpoint}, token, 5)
    return transfer.ModelStore(str(dest), source, retries=0)


def test_hub_errors_say_what_to_do_and_a_server_without_range_restarts_cleanly():
    error = load_module_util("bws_model").ModelStoreError
    with scratch() as work:
        hub = work / "hub"
        source = make_tiny_model(hub / "acme" / "tiny")
        with mirror_double(hub, work / "auth.jsonl", "--token", TOKEN) as mirror:
            with pytest.raises(error, match=r"HTTP 401 .*not authorised.*model_store_hf_token"):
                hub_store(work / "dest", mirror.url, token="wrong").plan()
            with pytest.raises(error, match=r"HTTP 404 .*Repository not found.*check the repository"):
                hub_store(work / "dest", mirror.url, token=TOKEN, repo="acme/nope").plan()
        assert not (work / "dest").exists()

        dest = work / "dest"
        dest.mkdir()
        shard = sorted(source.glob("*.safetensors"))[0]
        (dest / f"{shard.name}.part").write_bytes(b"\xff" * 1000)  # garbage a Range request would keep
        with mirror_double(hub, work / "norange.jsonl", "--no-range") as mirror:
            store = hub_store(dest, mirror.url)
            plan = store.plan()
            store.fetch(plan)
            assert store.finalize(store.plan(listing=plan["listing"])) is True
            ranges = [r["range"] for r in mirror.requests() if r["path"].endswith(shard.name)]
        assert ranges == ["bytes=1000-"]  # asked to resume, got the whole file (200): started again from 0
        assert same_tree(source, dest)
