"""module_utils/release/compare.py and engine_release's --diff: a new release compared with the serving one, keys
masked, so a changed flag shows and no key does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.module_utils_loader import load_library_module, load_module_util

compare = load_module_util("release.compare")
engine_release = load_library_module("engine_release")

API_KEY = "k3y-%s3cr3t$HOME-\\\"q'"  # as JSON writes it into the YAML config
ADMIN_KEY = "Zx9-admin-key-made-by-the-host-0123456789abc"
ROSTER_KEYS = ["api-key", "admin-api-key"]


def config(**flags: object) -> str:
    lines = ["# Managed by Ansible\n"] + [f"{key}: {value}\n" for key, value in sorted(flags.items())]
    return "".join(lines)


def serving_release(tmp_path: Path, name: str, files: dict[str, str]) -> None:
    directory = tmp_path / "releases" / name
    directory.mkdir(parents=True)
    for file, content in files.items():
        (directory / file).parent.mkdir(parents=True, exist_ok=True)
        (directory / file).write_text(content)


OLD = config(**{"admin-api-key": f'"{ADMIN_KEY}"', "api-key": f'"{API_KEY}"', "mem-fraction-static": "0.9",
                "tp-size": "8"})
NEW = config(**{"admin-api-key": f'"{ADMIN_KEY}"', "api-key": f'"{API_KEY}"', "mem-fraction-static": "0.8",
                "tp-size": "8"})


def every_text(entries: list[dict[str, str]]) -> str:
    return "".join(value for entry in entries for value in entry.values())


@pytest.mark.parametrize(("line", "masked"), [
    ('api-key: "abc123"\n', "api-key: ********\n"),
    ('admin-api-key: "abc123"\n', "admin-api-key: ********\n"),
    ("VLLM_API_KEY=abc123\n", "VLLM_API_KEY=********\n"),
    ('  "hf_token": "abc123",\n', '  "hf_token": ********,\n'),
    ("--ssl-keyfile-password abc123\n", "--ssl-keyfile-password abc123\n"),  # no assignment: left (argv never has keys)
    ("mem-fraction-static: 0.8\n", "mem-fraction-static: 0.8\n"),
    ("webhook_secret: s\n", "webhook_secret: ********\n"),
])
def test_values_of_key_like_names_are_masked_and_others_kept(line: str, masked: str) -> None:
    assert compare.mask_secret_values(line, ROSTER_KEYS)[0] == masked


def test_a_roster_flag_is_masked_as_a_suffix_with_dashes_and_underscores_alike() -> None:
    assert compare.is_secret_name("VLLM_API_KEY", ["api-key"])
    assert compare.is_secret_name("admin_api_key", ["admin-api-key"])
    assert not compare.is_secret_name("tp-size", ["api-key"])


def test_a_changed_flag_shows_against_the_serving_release_and_no_key_does(tmp_path: Path) -> None:
    serving_release(tmp_path, "sglang-old", {"config.yaml": OLD, "sglang.service": "ExecStart=a\n"})
    files = [compare.ReleaseFile("config.yaml", NEW, True),
             compare.ReleaseFile("sglang.service", "ExecStart=a\n", False)]
    entries = compare.compare_with_serving(str(tmp_path), "sglang-old", "sglang-new", files, ROSTER_KEYS)
    assert len(entries) == 1  # the unit is the same: no entry
    (entry,) = entries
    assert entry["before_header"].endswith("releases/sglang-old/config.yaml (serving)")
    assert entry["after_header"].endswith("releases/sglang-new/config.yaml")
    assert "mem-fraction-static: 0.9" in entry["before"] and "mem-fraction-static: 0.8" in entry["after"]
    assert "api-key: ********" in entry["after"] and "admin-api-key: ********" in entry["after"]
    text = every_text(entries)
    assert API_KEY not in text and ADMIN_KEY not in text and API_KEY.replace('\\"', '"') not in text


def test_a_rotated_key_alone_is_said_without_showing_it(tmp_path: Path) -> None:
    serving_release(tmp_path, "sglang-old", {"config.yaml": OLD})
    rotated = OLD.replace(API_KEY, "n3w-k3y-value-9876")
    entries = compare.compare_with_serving(str(tmp_path), "sglang-old", "sglang-new",
                                           [compare.ReleaseFile("config.yaml", rotated, True)], ROSTER_KEYS)
    assert entries[0]["after"].endswith("# config.yaml: a secret value changed (masked)\n")
    assert "n3w-k3y-value-9876" not in every_text(entries) and API_KEY not in every_text(entries)


def test_a_key_that_also_appears_under_another_name_is_scrubbed_there_too(tmp_path: Path) -> None:
    serving_release(tmp_path, "vllm-old", {"engine.env": "VLLM_API_KEY=abcdef123\n"})
    # Same value under a name the masking does not know: scrubbed because it was masked elsewhere.
    files = [compare.ReleaseFile("engine.env", "VLLM_API_KEY=abcdef123\nOTHER=abcdef123\n", True)]
    entries = compare.compare_with_serving(str(tmp_path), "vllm-old", "vllm-new", files, ROSTER_KEYS)
    assert "abcdef123" not in every_text(entries)
    assert "OTHER=********" in entries[0]["after"]


def test_a_credential_file_named_for_its_secret_is_masked_whole(tmp_path: Path) -> None:
    """The vllm role's `api-key` (LoadCredential): the key alone, no assignment to mask; a rotation says so."""
    serving_release(tmp_path, "vllm-old", {"api-key": "old-k3y-abcdef"})
    files = [compare.ReleaseFile("api-key", "n3w-k3y-abcdef", True)]
    entries = compare.compare_with_serving(str(tmp_path), "vllm-old", "vllm-new", files, ROSTER_KEYS)
    assert [(e["before"], e["after"]) for e in entries] == [
        ("********\n", "********\n# api-key: a secret value changed (masked)\n")]
    assert "k3y" not in every_text(entries)


def test_a_credential_file_only_the_serving_release_has_is_masked_whole(tmp_path: Path) -> None:
    serving_release(tmp_path, "vllm-old", {"api-key": "old-k3y-abcdef", "argv.json": "[]\n"})
    files = [compare.ReleaseFile("argv.json", '["--x"]\n', False)]
    entries = compare.compare_with_serving(str(tmp_path), "vllm-old", "vllm-new", files, ROSTER_KEYS)
    assert "k3y" not in every_text(entries)
    assert [e["before"] for e in entries if "api-key" in e["before_header"]] == ["********\n"]


def test_files_only_the_serving_release_has_are_shown_removed_and_masked(tmp_path: Path) -> None:
    """A switch from vLLM to SGLang: its argv and key file go, SGLang's config comes."""
    serving_release(tmp_path, "vllm-old", {"argv.json": '["vllm", "serve"]\n',
                                           "api-key.env": "VLLM_API_KEY=abcdef123\n",
                                           "plugin-1.dist-info/METADATA": "Name: plugin\n"})
    files = [compare.ReleaseFile("config.yaml", NEW, True)]
    entries = compare.compare_with_serving(str(tmp_path), "vllm-old", "sglang-new", files, ROSTER_KEYS)
    headers = [(e["before_header"].split("releases/")[1], e["after_header"].split("releases/")[1]) for e in entries]
    assert headers == [
        ("vllm-old/config.yaml (absent)", "sglang-new/config.yaml"),
        ("vllm-old/api-key.env (serving)", "sglang-new/api-key.env (absent)"),
        ("vllm-old/argv.json (serving)", "sglang-new/argv.json (absent)"),
        ("vllm-old/plugin-1.dist-info/METADATA (serving)", "sglang-new/plugin-1.dist-info/METADATA (absent)"),
    ]
    assert "abcdef123" not in every_text(entries) and API_KEY not in every_text(entries)


def test_the_serving_release_is_another_one_named_by_state_json() -> None:
    assert compare.serving_release_id({"current": "a", "status": "serving"}, "b") == "a"
    assert compare.serving_release_id({"current": "b"}, "b") is None
    assert compare.serving_release_id(None, "b") is None
    assert compare.serving_release_id({"current": "../etc"}, "b") is None


def test_engine_release_diff_replaces_whole_new_files_with_the_comparison(tmp_path: Path) -> None:
    serving_release(tmp_path, "sglang-old", {"config.yaml": OLD})
    release_dir = str(tmp_path / "releases" / "sglang-new")
    params = {"state_dir": str(tmp_path), "release_id": "sglang-new", "masked_names": ROSTER_KEYS,
              "secret_files": [{"name": "config.yaml", "content": NEW}], "files": []}
    written = [{"before_header": release_dir, "after_header": release_dir, "before": "", "after": "directory\n"},
               {"before_header": f"{release_dir}/x (absent)", "after_header": f"{release_dir}/x", "before": "",
                "after": "whole file\n"},
               {"before_header": "/etc/modules-load.d/nvidia.conf", "after_header": "/etc/modules-load.d/nvidia.conf",
                "before": "", "after": "nvidia\n"}]
    diff = engine_release.release_diff(params, written, release_dir, "sglang-old")
    assert [d["after_header"] for d in diff] == [release_dir, "/etc/modules-load.d/nvidia.conf",
                                                 f"{release_dir}/config.yaml"]
    assert engine_release.release_diff(params, written, release_dir, None) == written
