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
    TOOLS_VENV,
    hf_profile,
    make_tiny_model,
    mirror_double,
    run_fetch_playbook,
    scratch,
)

from tests.module_utils_loader import load_module_util
from tests.playbook_run import run_module

pytestmark = pytest.mark.integration

TOKEN = "hf_testtoken_0123456789"
SHARD = "model-00002-of-00003.safetensors"


def write_mirror_manifest(model_dir: Path) -> None:
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "plugins" / "module_utils" / "model" / "store.py"), "write-manifest",
         str(model_dir)],
        check=True,
        capture_output=True,
    )


def assert_manifest_is_sha256sum(dest: Path) -> None:
    """Every sha256 of the manifest equals an independent sha256sum(1) of the file; nothing else is listed."""
    manifest = json.loads((dest / ".model_store" / "manifest.json").read_text())
    assert manifest["complete"] is True
    recorded = {entry["path"]: entry["sha256"] for entry in manifest["files"]}
    skipped = {".model_store", ".cache"}
    on_disk = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file() and not skipped & set(p.parts))
    assert sorted(recorded) == on_disk
    output = subprocess.run(["sha256sum", *on_disk], cwd=dest, capture_output=True, text=True, check=True).stdout
    assert {line.split()[1]: line.split()[0] for line in output.splitlines()} == recorded


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
            assert dry.rc == 0, dry.stdout
            assert dry.recap("localhost")["changed"] >= 2
            batch = "tiny: 6 files: tokenizer_config.json, config.json, model.safetensors.index.json, ..."
            assert f"{batch} (141.6 KiB)" in dry.stdout
            assert not (work / "models").exists(), "check mode wrote to the host"
            assert not [r for r in mirror.requests() if "/resolve/" in r["path"] or "/cdn/" in r["path"]]

            first = run_fetch_playbook(work, profiles, extra)
            assert first.rc == 0, first.stdout
            assert first.recap("localhost")["changed"] >= 2
            assert same_tree(hub / "acme" / "tiny", work / "models" / "tiny")
            assert same_tree(hub / "acme" / "draft", work / "models" / "draft")
            assert f"{work / 'models' / 'draft'}: 47.3 KiB of 47.3 KiB (100%)" in first.stdout
            assert "done; finished 6 files" in first.stdout
            assert TOKEN not in first.stdout
            for dest in (work / "models" / "tiny", work / "models" / "draft"):
                assert_manifest_is_sha256sum(dest)
            # the Hub files came through the huggingface_hub client, whose state stays out of the manifest; each
            # was verified from the digests of its bytes as the client wrote them (no second read)
            assert (work / "models" / "tiny" / ".cache" / "huggingface" / "download").is_dir()
            profile = hub_profile(work / "models" / "tiny")
            assert (profile["verified_in_stream"], profile["verified_by_read"]) == (6, 0)
            shard_mode = stat.S_IMODE((work / "models" / "tiny" / SHARD).stat().st_mode)
            assert shard_mode == 0o644
            requests = mirror.requests()
            # the client asks resolve with HEAD (with the token); LFS files redirect to another host name, which
            # the client follows without the token
            heads = [r for r in requests if r["method"] == "HEAD" and "/resolve/" in r["path"]]
            assert len(heads) == 6 and all(r["auth"] for r in heads)
            assert sorted(r["status"] for r in heads) == [200, 200, 200, 302, 302, 302]
            cdn = [r for r in requests if r["path"].startswith("/cdn/")]
            assert len(cdn) == 3 and not any(r["auth"] for r in cdn)
            assert any("cursor=2" in r["path"] for r in requests), "the paged tree was not followed"

            second = run_fetch_playbook(work, profiles, extra)
            assert second.rc == 0, second.stdout
            assert second.recap("localhost")["changed"] == 0, second.stdout
            assert len(mirror.requests()) == len(requests), "a complete copy was listed again without refresh"


def mirror_profile(dest: Path, url: str) -> dict:
    return {"tiny": {"model": {"path": str(dest), "source": {"type": "http", "url": url}}, "drafter": None}}


def test_mirror_ranges_resume_across_runs_and_a_truncated_range_is_fetched_again():
    with scratch() as work:
        hub = work / "hub"
        source = make_tiny_model(hub / "acme" / "tiny", floats_per_tensor=300_000)  # 2.3 MiB shards: 3 ranges each
        write_mirror_manifest(source)
        dest = work / "models" / "tiny"
        extra = {"engine_profile": "tiny", "model_store_retries": 0}
        # the first body longer than 20000 bytes stops after 20000 bytes, and no retry is allowed: the run fails
        with mirror_double(hub, work / "cut.jsonl", "--cut-after", "20000", "--cut-count", "1") as mirror:
            first = run_fetch_playbook(work, mirror_profile(dest, f"{mirror.url}/mirror/acme/tiny/"), extra)
            cut = next(r for r in mirror.requests() if r["bytes"] == 20000)
        assert first.rc != 0
        shard = cut["path"].rsplit("/", 1)[1]
        assert f"{shard}: transfer of {shard}.part stopped at " in first.stdout
        assert "gave up after 0 retries: re-run to resume" in first.stdout
        assert not (dest / shard).exists()
        record = json.loads((dest / ".model_store" / "parts" / f"{shard}.json").read_text())
        cut_start = int(cut["range"].split("=")[1].split("-")[0]) if cut["range"] else 0
        assert [cut_start, cut_start + 20000] in record["done"] or any(
            start <= cut_start and end == cut_start + 20000 for start, end in record["done"]
        )
        parts = dest / ".model_store" / "parts"

        def kept(name: str) -> int:
            doc = json.loads((parts / f"{name}.json").read_text()) if (parts / f"{name}.json").exists() else {}
            return sum(end - start for start, end in doc.get("done", []))

        missing = [p for p in source.iterdir() if p.is_file() and not (dest / p.name).exists()]
        remaining = sum(p.stat().st_size - kept(p.name) for p in missing)
        assert 0 < remaining < sum(p.stat().st_size for p in source.iterdir() if p.is_file())

        # next run: the kept ranges stay; one range is cut again and fetched again within the run
        extra["model_store_retries"] = 1
        with mirror_double(hub, work / "resume.jsonl", "--cut-after", "20000", "--cut-count", "1") as mirror:
            second = run_fetch_playbook(work, mirror_profile(dest, f"{mirror.url}/mirror/acme/tiny/"), extra)
            assert second.rc == 0, second.stdout
            served = mirror.requests()
        assert f"bytes={cut_start + 20000}-" in " ".join(str(r["range"]) for r in served if r["path"].endswith(shard))
        again = next(r for r in served if r["bytes"] == 20000)
        again_start = int(again["range"].split("=")[1].split("-")[0]) if again["range"] else 0
        assert any(
            r["path"] == again["path"] and str(r["range"]).startswith(f"bytes={again_start + 20000}-") for r in served
        ), "the truncated range was not asked for again from where it stopped"
        files = [r for r in served if not r["path"].endswith(".model_store/manifest.json")]
        # exactly what was still missing: neither the kept ranges nor the 20000 bytes of the range cut in this run
        # (kept, and asked for again from where it stopped) move twice
        assert sum(r["bytes"] for r in files) == remaining
        assert same_tree(source, dest)
        assert_manifest_is_sha256sum(dest)
        assert not list(dest.rglob("*.part")) and not list((dest / ".model_store" / "parts").rglob("*.json"))


def test_a_sha256_mismatch_names_the_file_and_leaves_nothing_that_looks_complete():
    with scratch() as work:
        source = make_tiny_model(work / "hub" / "acme" / "tiny", floats_per_tensor=300_000)
        write_mirror_manifest(source)
        manifest_path = source / ".model_store" / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        bad = next(entry for entry in manifest["files"] if entry["path"] == SHARD)
        bad["sha256"] = "0" * 64
        manifest_path.write_text(json.dumps(manifest))
        dest = work / "models" / "tiny"
        with mirror_double(work / "hub", work / "requests.jsonl") as mirror:
            profiles = mirror_profile(dest, f"{mirror.url}/mirror/acme/tiny/")
            result = run_fetch_playbook(work, profiles, {"engine_profile": "tiny"})
        assert result.rc != 0
        assert f"{SHARD} downloaded with sha256 " in result.stdout
        assert "but the source publishes " + "0" * 64 in result.stdout
        assert not (dest / SHARD).exists() and not (dest / f"{SHARD}.part").exists()
        assert (dest / f"{SHARD}.part.rejected").exists()
        assert not (dest / ".model_store" / "manifest.json").exists()


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
        assert result.rc != 0, result.stdout
        assert "Not enough disk on" in result.stdout
        assert "(145027 bytes)" in result.stdout  # needed: the whole listing
        assert "free 64.00 KB" in result.stdout
        assert "Nothing was written" in result.stdout
        assert "ON-TMPFS:\n" in result.stdout + "\n", "something was written to the full file system"
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
        assert first.rc == 0, first.stdout
        for dest in (local_dest, rsync_dest):
            # 9.8 KiB of the shard were kept: the first slice line counts them as done
            assert f"{dest}: 47.3 KiB of 47.3 KiB (100%)" in first.stdout
        assert same_tree(local_source, local_dest)
        assert same_tree(rsync_source, rsync_dest)
        assert_manifest_is_sha256sum(local_dest)
        assert_manifest_is_sha256sum(rsync_dest)
        assert not (in_place / ".model_store").exists(), "an in-place directory was written to"

        # the source changes: a refresh must refuse, and the complete copy stays byte for byte
        changed_shard = sorted(local_source.glob("*.safetensors"))[0]
        changed_shard.write_bytes(changed_shard.read_bytes() + b"\0" * 8)
        before = {p.name: p.read_bytes() for p in local_dest.iterdir() if p.is_file()}
        second = run_fetch_playbook(work, profiles, {**extra, "model_store_refresh": True})
        assert second.rc != 0
        assert "holds a complete copy" in second.stdout
        assert f"first {changed_shard.name}" in second.stdout
        assert "It is not overwritten" in second.stdout
        assert {p.name: p.read_bytes() for p in local_dest.iterdir() if p.is_file()} == before


def run_model_check(work: Path, path: Path) -> dict:
    return run_module("blackwell.serving.model_check", f"path={path} require_index=true fail_on_incomplete=true",
                      workdir=work, timeout=60)


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


def hub_profile(dest: Path) -> dict:
    """The Hub client run's timeline that the last slice left in progress.json."""
    return json.loads((dest / ".model_store" / "progress.json").read_text())["profile"]["hub_client"]


def load_transfer():
    return load_module_util("model.transfer")


def hub_store(dest: Path, endpoint: str, token: str | None = None, repo: str = "acme/tiny"):
    source = load_transfer().make_source({"type": "hf", "repo": repo, "endpoint": endpoint}, token, 5)
    return load_transfer().ModelStore(str(dest), source, retries=0)


def test_hub_errors_say_what_to_do_and_a_server_without_range_is_read_up_to_the_kept_bytes():
    error = load_module_util("model.store").ModelStoreError
    with scratch() as work:
        hub = work / "hub"
        source = make_tiny_model(hub / "acme" / "tiny")
        with mirror_double(hub, work / "auth.jsonl", "--token", TOKEN) as mirror:
            with pytest.raises(error, match=r"HTTP 401 .*not authorised.*model_store_hf_token"):
                hub_store(work / "dest", mirror.url, token="wrong").plan()
            with pytest.raises(error, match=r"HTTP 404 .*Repository not found.*check the repository"):
                hub_store(work / "dest", mirror.url, token=TOKEN, repo="acme/nope").plan()
        assert not (work / "dest").exists()

        write_mirror_manifest(source)
        dest = work / "dest"
        dest.mkdir()
        shard = sorted(source.glob("*.safetensors"))[0]
        (dest / f"{shard.name}.part").write_bytes(shard.read_bytes()[:1000])  # kept by an earlier run
        transfer = load_transfer()
        with mirror_double(hub, work / "norange.jsonl", "--no-range") as mirror:
            spec = {"type": "http", "url": f"{mirror.url}/mirror/acme/tiny/"}
            store = transfer.ModelStore(str(dest), transfer.make_source(spec, None, 5), retries=0)
            plan = store.plan()
            store.fetch(plan)
            assert store.finalize(store.plan(listing=plan["listing"])) is True
            ranges = [r["range"] for r in mirror.requests() if r["path"].endswith(shard.name)]
        assert ranges == [f"bytes=1000-{shard.stat().st_size - 1}"]  # got the whole file (200): read past 1000
        assert same_tree(source, dest)
        assert_manifest_is_sha256sum(dest)


@pytest.mark.parametrize(("url", "allowed"), [
    ("https://huggingface.co/api/models/x", True), ("http://127.0.0.1:8080/api", True), ("http://localhost/x", True),
    ("http://[::1]:9/x", True), ("http://huggingface.co/api", False), ("http://127.0.0.1.nip.io/x", False),
    ("ftp://huggingface.co/x", False),
])
def test_the_token_goes_only_over_https_or_to_a_mirror_on_this_host(url: str, allowed: bool) -> None:
    assert load_transfer().token_may_go_to(url) is allowed


def test_a_plain_http_endpoint_with_a_token_is_refused_before_any_request() -> None:
    transfer, error = load_transfer(), load_module_util("model.store").ModelStoreError
    spec = {"type": "hf", "repo": "acme/tiny", "endpoint": "http://user:pw@mirror.example.com/"}
    with pytest.raises(error, match=r"the Hub endpoint http://mirror.example.com is not https: the token"):
        transfer.make_source(spec, TOKEN, 5)
    assert transfer.make_source(spec, None, 5).endpoint() == "http://user:pw@mirror.example.com"  # no token: fine
    with pytest.raises(error, match=r"refusing to send the Hub token to http://mirror.example.com/x: it goes only"):
        transfer.HttpClient(TOKEN, 5).request("http://user:pw@mirror.example.com/x?q=1")


@pytest.mark.parametrize(("start", "target", "kept"), [
    ("https://huggingface.co/a", "https://huggingface.co/b", True),
    ("https://huggingface.co/a", "http://huggingface.co/b", False),  # a downgrade on the same host
    ("https://huggingface.co/a", "https://cdn-lfs.huggingface.co/b", False),
    ("https://huggingface.co/a", "https://huggingface.co:8443/b", False),
    ("http://127.0.0.1:8080/a", "http://127.0.0.1:8080/b", True),
])
def test_a_redirect_keeps_the_token_only_on_the_same_origin_and_never_in_clear(start, target, kept) -> None:
    import urllib.request

    handler = load_transfer()._RedirectKeepingAuthOnSameOrigin()
    request = urllib.request.Request(start, headers={"Authorization": f"Bearer {TOKEN}"})
    new = handler.redirect_request(request, None, 302, "Found", {}, target)
    assert new.has_header("Authorization") is kept


# ---------------------------------------------------------------- the real huggingface_hub client


def hub_extra(**more) -> dict:
    return {"engine_profile": "tiny", "model_store_slice_s": 1, **more}


def test_hub_client_gated_repository_fails_naming_the_token_variable():
    with scratch() as work:
        make_tiny_model(work / "hub" / "acme" / "tiny", shards=1)
        dest = work / "models" / "tiny"
        # a gated repository: the listing answers anyone, the files need an accepted token
        with mirror_double(work / "hub", work / "requests.jsonl", "--token", TOKEN, "--gated") as mirror:
            profiles = hf_profile("tiny", dest, "acme/tiny", mirror.url)
            result = run_fetch_playbook(work, profiles, hub_extra(model_store_hf_token="hf_not_accepted"))
            heads = [r for r in mirror.requests() if r["method"] == "HEAD"]
        assert result.rc != 0
        assert "HTTP 401 from " in result.stdout and "the repository is gated" in result.stdout
        assert "set model_store_hf_token (default: HF_TOKEN" in result.stdout
        assert "hf_not_accepted" not in result.stdout
        assert heads and all(r["status"] == 401 and r["auth"] for r in heads)
        assert not list(dest.glob("*.safetensors")) and not (dest / ".model_store" / "manifest.json").exists()


def test_hub_client_interrupted_fetch_is_resumed():
    chunk = load_module_util("model.hub").CHUNK_BYTES
    with scratch() as work:
        # one 12.2 MiB shard: the client writes in chunks of CHUNK_BYTES and resumes after the last whole chunk
        source = make_tiny_model(work / "hub" / "acme" / "tiny", shards=1, floats_per_tensor=1_600_000)
        shard = "model-00001-of-00001.safetensors"
        dest = work / "models" / "tiny"
        extra = hub_extra(model_store_hf_token=TOKEN)
        # every body longer than 100 KiB is cut: the client gives up on the shard, the small files are kept
        with mirror_double(
            work / "hub",
            work / "cut.jsonl",
            "--token",
            TOKEN,
            "--redirect-host",
            "localhost",
            "--cut-after",
            "102400",
            "--cut-count",
            "100",
        ) as mirror:
            first = run_fetch_playbook(work, hf_profile("tiny", dest, "acme/tiny", mirror.url), extra)
        assert first.rc != 0
        assert f"{shard}: the huggingface_hub client failed" in first.stdout and "re-run to resume" in first.stdout
        assert not (dest / shard).exists()
        assert sorted(p.name for p in dest.iterdir() if p.is_file()) == [
            "config.json",
            "model.safetensors.index.json",
            "tokenizer_config.json",
        ]

        # next run: only the shard is asked for; cut once after 11 MiB, the client resumes with a Range, and the
        # digests of what it wrote before and after the cut verify the shard
        with mirror_double(
            work / "hub",
            work / "resume.jsonl",
            "--token",
            TOKEN,
            "--redirect-host",
            "localhost",
            "--cut-after",
            str(11 * 1024 * 1024),
            "--cut-count",
            "1",
        ) as mirror:
            second = run_fetch_playbook(work, hf_profile("tiny", dest, "acme/tiny", mirror.url), extra)
            assert second.rc == 0, second.stdout
            files = [r for r in mirror.requests() if "/resolve/" in r["path"] or "/cdn/" in r["path"]]
        assert {r["path"].rsplit("/", 1)[1] for r in files} == {shard}
        gets = [r for r in files if r["method"] == "GET"]
        kept = 11 * 1024 * 1024 // chunk * chunk
        assert [r["range"] for r in gets] == [None, f"bytes={kept}-"] and not any(r["auth"] for r in gets)
        assert same_tree(source, dest)
        assert_manifest_is_sha256sum(dest)
        assert (hub_profile(dest)["verified_in_stream"], hub_profile(dest)["verified_by_read"]) == (1, 0)
        assert (TOOLS_VENV / "hf-client.lock.installed").is_file()


def client_venv(work: Path) -> Path:
    """The role's tools venv (created by a first Hub fetch where missing) with this checkout's fetch program."""
    if not (TOOLS_VENV / "bin" / "python").exists():
        make_tiny_model(work / "first" / "acme" / "tiny", shards=1)
        with mirror_double(work / "first", work / "first.jsonl") as mirror:
            profiles = hf_profile("tiny", work / "first-models" / "tiny", "acme/tiny", mirror.url)
            assert run_fetch_playbook(work, profiles, hub_extra()).rc == 0
    venv = work / "tools-venv"
    venv.mkdir()
    for name in ("bin", "lib", "pyvenv.cfg"):
        (venv / name).symlink_to(TOOLS_VENV / name)
    (venv / "bws_hf_fetch.py").symlink_to(REPO_ROOT / "roles" / "model_store" / "files" / "bws_hf_fetch.py")
    return venv


def test_hub_client_file_that_differs_from_the_listing_is_set_aside():
    error = load_module_util("model.store").ModelStoreError
    with scratch() as work:
        make_tiny_model(work / "hub" / "acme" / "tiny", shards=1)
        shard = "model-00001-of-00001.safetensors"
        dest = work / "models" / "tiny"
        client = {"venv": str(client_venv(work)), "workers": 2, "xet": False, "verify": "read"}
        transfer = load_transfer()
        with mirror_double(work / "hub", work / "requests.jsonl", "--redirect-host", "localhost") as mirror:
            spec = {"type": "hf", "repo": "acme/tiny", "endpoint": mirror.url}
            store = transfer.ModelStore(str(dest), transfer.make_source(spec, None, 5, client), retries=0)
            plan = store.plan()
            # the listing publishes another sha256 than the bytes the Hub serves
            for entry in plan["to_fetch"] + plan["listing"]["files"]:
                if entry["path"] == shard:
                    entry["sha256"] = "0" * 64
            message = rf"^{shard} downloaded with sha256 [0-9a-f]{{64}} but the source publishes 0{{64}}\. It was set"
            with pytest.raises(error, match=message):
                store.fetch(plan)
        assert (dest / f"{shard}.part.rejected").is_file()
        assert not (dest / shard).exists() and not (dest / ".model_store" / "manifest.json").exists()
        assert (dest / "config.json").is_file()  # the files that agree with the listing are kept


def test_a_link_planted_in_a_model_directory_is_refused_and_what_it_names_keeps_its_mode():
    """Whoever can write into a model directory plants `x -> <a root-only file>`; the store's recursive chown and
    chmod, as root, would make that file readable by every local user. Refused, naming the link, before any mode
    changes; the walk that lists a local source refuses links too, so no file a link names is copied."""
    with scratch() as work:
        source = make_tiny_model(work / "src", shards=1, seed=7)
        dest = work / "models" / "m"
        secret = work / "root-only"
        secret.write_text("not for the engines\n")
        secret.chmod(0o600)
        profiles = {"p": {"model": {"path": str(dest), "source": {"type": "local", "path": str(source)}},
                          "drafter": None}}
        first = run_fetch_playbook(work, profiles, {"model_store_profiles": "p"})
        assert first.rc == 0, first.stdout
        (dest / "x").symlink_to(secret)
        again = run_fetch_playbook(work, profiles, {"model_store_profiles": "p"})
        text = " ".join(again.stdout.split())
        assert again.rc != 0, text[-3000:]
        assert f"Symbolic links in the model directories, which the model store never makes and never follows: " \
               f"{dest / 'x'}." in text, text[-3000:]
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        (dest / "x").unlink()

        (source / "extra.json").symlink_to(secret)  # a link in the source: never followed, never copied
        listed = run_fetch_playbook(work, profiles, {"model_store_profiles": "p", "model_store_refresh": True})
        text = " ".join(listed.stdout.split())
        assert listed.rc != 0, text[-3000:]
        assert f"holds 1 symbolic link(s), which the model store never follows or copies: {source / 'extra.json'} " \
               f"-> {secret}" in text, text[-3000:]
        assert not (dest / "extra.json").exists() and stat.S_IMODE(secret.stat().st_mode) == 0o600
