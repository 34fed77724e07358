"""plugins/modules/engine_release.py: the release's file names, one directory level below the release at most."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.module_utils_loader import load_library_module, load_module_util

engine_release = load_library_module("engine_release")
release_files_util = load_module_util("release.files")


def params(tmp_path: Path, *names: str) -> dict:
    return {"state_dir": str(tmp_path), "group": "root", "directories": [],
            "secret_files": [{"name": "config.yaml", "content": "api-key: x\n"}],
            "files": [{"name": name, "content": f"{name}\n"} for name in names]}


def test_a_dist_info_directory_of_a_plugin_is_made_with_the_release(tmp_path: Path) -> None:
    p = params(tmp_path, "bws_sglang_guard.py", "bws_sglang_guard-1.dist-info/METADATA",
               "bws_sglang_guard-1.dist-info/entry_points.txt", "release.json")
    release = str(tmp_path / "releases" / "sglang-abc")
    assert engine_release.release_subdirectories(p) == ["bws_sglang_guard-1.dist-info"]
    dirs = engine_release.directories(p, release)
    assert [d.path for d in dirs][-1] == os.path.join(release, "bws_sglang_guard-1.dist-info")
    files = engine_release.release_files(p, release)
    assert files[0].secret and files[0].path.endswith("/config.yaml"), "secrets first, release.json last"
    assert files[-1].path.endswith("/release.json")
    if os.geteuid() != 0:
        pytest.skip("writing root:root files needs root")
    release_files_util.apply(dirs, files, check_mode=False)
    dist_info = Path(release) / "bws_sglang_guard-1.dist-info"
    assert stat.S_IMODE(dist_info.stat().st_mode) == 0o750
    assert (dist_info / "entry_points.txt").read_text() == "bws_sglang_guard-1.dist-info/entry_points.txt\n"


@pytest.mark.parametrize("name", ["../escape", "a/b/c", "/etc/passwd", "dir/..", "dir/", "", ".", "./x"])
def test_a_name_outside_the_release_or_deeper_than_one_level_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(release_files_util.ReleaseFilesError, match="must be a plain name inside the release"):
        engine_release.release_files(params(tmp_path, name), str(tmp_path / "releases" / "r"))


def test_release_json_records_when_its_release_was_created_and_keeps_it(tmp_path: Path) -> None:
    wanted = '{\n    "engine": "sglang",\n    "id": "sglang-abc"\n}\n'
    new = release_files_util.with_created(wanted, None, "2026-12-04T18:40:12Z")
    assert json.loads(new) == {"engine": "sglang", "id": "sglang-abc", "created": "2026-12-04T18:40:12Z"}
    assert new == json.dumps(json.loads(new), indent=4, sort_keys=True, separators=(",", ": ")) + "\n"
    # Written again later: the file on the host keeps its time, so the content is the same (nothing changes).
    assert release_files_util.with_created(wanted, new.encode(), "2026-12-05T00:00:00Z") == new
    # A release written before `created` was recorded stays as it is; so does content that is not a JSON object.
    assert release_files_util.with_created(wanted, wanted.encode(), "2026-12-05T00:00:00Z") == wanted
    assert release_files_util.with_created("[1]\n", None, "2026-12-05T00:00:00Z") == "[1]\n"
    assert release_files_util.with_created("not json", None, "2026-12-05T00:00:00Z") == "not json"


def test_engine_release_stamps_only_release_json(tmp_path: Path) -> None:
    release = tmp_path / "releases" / "sglang-abc"
    release.mkdir(parents=True)
    files = [{"name": "sglang.service", "content": "{}"}, {"name": "release.json", "content": '{"id": "sglang-abc"}'}]
    stamped = engine_release.stamped_files(files, str(release), "2026-12-04T18:40:12Z")
    assert stamped[0] == files[0]
    assert json.loads(stamped[1]["content"])["created"] == "2026-12-04T18:40:12Z"
    (release / "release.json").write_text(stamped[1]["content"])
    again = engine_release.stamped_files(files, str(release), "2026-12-09T00:00:00Z")
    assert again[1]["content"] == stamped[1]["content"]
