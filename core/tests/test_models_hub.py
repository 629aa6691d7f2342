"""Hugging Face Hub ids in ``resolve_model`` / ``resolve_tokenizer``: read from a Hugging Face
cache laid out by the test (``models--owner--name/refs/<rev>``, ``snapshots/<hash>/``), never
downloaded; precedence against catalog names and local folders; plan paths left as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rllm_core import models
from rllm_core.errors import ModelNotCachedError, ModelNotFoundError
from rllm_core.models import HubId, parse_hub_id
from rllm_core.plan.load import _rebase

MAIN = "a" * 40
TAGGED = "b" * 40


def _snapshot(cache: Path, repo: str, commit: str, files: dict[str, str]) -> Path:
    folder = cache / ("models--" + repo.replace("/", "--")) / "snapshots" / commit
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def _ref(cache: Path, repo: str, name: str, commit: str) -> None:
    ref = cache / ("models--" + repo.replace("/", "--")) / "refs" / name
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit, encoding="utf-8")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    model = {"config.json": json.dumps({"model_type": "llama"}), "tokenizer.json": "{}"}
    _snapshot(folder, "acme/tiny", MAIN, model)
    _snapshot(folder, "acme/tiny", TAGGED, {**model, "config.json": "{}"})
    _ref(folder, "acme/tiny", "main", MAIN)
    _ref(folder, "acme/tiny", "v1", TAGGED)
    _snapshot(folder, "acme/tok-only", MAIN, {"tokenizer_config.json": "{}"})
    _ref(folder, "acme/tok-only", "main", MAIN)
    return folder


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("acme/tiny", HubId("acme/tiny")),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", HubId("HuggingFaceTB/SmolLM2-135M-Instruct")),
        ("acme/tiny@v1", HubId("acme/tiny", "v1")),
        (f"acme/tiny@{MAIN}", HubId("acme/tiny", MAIN)),
        ("acme/tiny@refs/pr/1", HubId("acme/tiny", "refs/pr/1")),
        ("tiny", None),
        ("./acme/tiny", None),
        ("/models/acme/tiny", None),
        ("a/b/c", None),
        ("../tiny", None),
        ("acme/..", None),
        ("~/tiny", None),
    ],
)
def test_parse_hub_id(value, parsed):
    assert parse_hub_id(value) == parsed


def test_a_hub_id_resolves_to_its_snapshot_by_branch_tag_or_commit(cache):
    snapshots = cache / "models--acme--tiny" / "snapshots"
    assert models.resolve_model("acme/tiny") == snapshots / MAIN
    assert models.resolve_model("acme/tiny@main") == snapshots / MAIN
    assert models.resolve_model("acme/tiny@v1") == snapshots / TAGGED
    assert models.resolve_model(f"acme/tiny@{TAGGED}") == snapshots / TAGGED
    assert models.resolve_tokenizer("acme/tiny") == snapshots / MAIN


def test_hf_home_names_the_cache_when_hf_hub_cache_is_unset(cache, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "hub").symlink_to(cache)
    assert models.hub_cache_dir() == tmp_path / "home" / "hub"
    assert models.resolve_model("acme/tiny").name == MAIN


def test_a_missing_id_names_the_id_the_cache_and_what_to_do(cache):
    with pytest.raises(ModelNotCachedError) as caught:
        models.resolve_model("acme/absent")
    message = str(caught.value)
    assert "'acme/absent' is not in the Hugging Face cache " + str(cache) in message
    assert "rllm-core models pull acme/absent" in message
    assert "HF_HUB_CACHE / HF_HOME" in message
    assert "./acme/absent" in message
    assert caught.value.name == "acme/absent"
    assert caught.value.folder == str(cache / "models--acme--absent")


def test_a_missing_revision_names_the_revision(cache):
    with pytest.raises(
        ModelNotCachedError,
        match=r"no models--acme--tiny snapshot for revision"
        r" 'v9'.*--revision v9",
    ):
        models.resolve_model("acme/tiny@v9")


def test_a_snapshot_without_the_files_is_neither_model_nor_tokenizer(cache):
    with pytest.raises(ModelNotCachedError, match=r"holds no config.json, so it is no model"):
        models.resolve_model("acme/tok-only")
    folder = cache / "models--acme--tok-only" / "snapshots" / MAIN
    assert models.resolve_tokenizer("acme/tok-only") == folder
    (folder / "tokenizer_config.json").unlink()
    with pytest.raises(ModelNotCachedError, match=r"tokenizer.json or tokenizer_config.json"):
        models.resolve_tokenizer("acme/tok-only")


def test_an_existing_folder_wins_over_a_hub_id_of_the_same_spelling(cache, tmp_path):
    local = tmp_path / "acme" / "tiny"
    local.mkdir(parents=True)
    (local / "config.json").write_text("{}", encoding="utf-8")
    assert models.resolve_model("acme/tiny") == Path("acme/tiny")
    assert models.resolve_tokenizer("acme/tiny") == Path("acme/tiny")
    (local / "config.json").unlink()
    with pytest.raises(ModelNotFoundError, match=r"has no config\.json"):
        models.resolve_model("acme/tiny")


def test_a_catalog_name_is_never_taken_for_a_folder_or_an_id(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("RLLM_CORE_CACHE", str(tmp_path / "rllm-cache"))
    name = models.known_models()[0]
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ModelNotCachedError, match=f"rllm-core models pull {name}"):
        models.resolve_model(name)


def test_a_plan_keeps_a_hub_id_as_written_and_makes_a_folder_absolute(tmp_path):
    plan_folder = tmp_path / "plan"
    plan_folder.mkdir()
    assert _rebase("acme/tiny", plan_folder, or_name=True) == "acme/tiny"
    assert _rebase("acme/tiny@v1", plan_folder, or_name=True) == "acme/tiny@v1"
    (plan_folder / "acme" / "tiny").mkdir(parents=True)
    assert _rebase("acme/tiny", plan_folder, or_name=True) == str(plan_folder / "acme" / "tiny")
    assert _rebase("./tok", plan_folder, or_name=True) == str(plan_folder / "tok")


def test_pull_of_a_hub_id_offline_fails_naming_the_id_and_the_cache(cache, tmp_path):
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "rllm_core.cli", "models", "pull", "acme/absent"],
        env=dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"could not download acme/absent into {cache}" in done.stderr
    assert "HF_HUB_OFFLINE" in done.stderr
    assert not (cache / "models--acme--absent" / "snapshots").exists()


def _fake_hub(monkeypatch, cache: Path, calls: list) -> None:
    """A ``huggingface_hub`` whose ``snapshot_download`` lays the snapshot out as the real one
    does, recording what it was asked for."""
    import sys
    import types

    def snapshot_download(repo_id, revision=None, cache_dir=None):
        calls.append((repo_id, revision, cache_dir))
        folder = _snapshot(Path(cache_dir), repo_id, "c" * 40, {"config.json": "{}"})
        _ref(Path(cache_dir), repo_id, revision, "c" * 40)
        return str(folder)

    module = types.ModuleType("huggingface_hub")
    module.snapshot_download = snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", module)


def test_a_missing_id_is_downloaded_when_the_hub_may_be_reached(cache, monkeypatch):
    from rllm_core.models.hub import fetch_missing_hub_model

    calls: list = []
    _fake_hub(monkeypatch, cache, calls)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    lines: list[str] = []
    folder = fetch_missing_hub_model("acme/fresh@v1", progress=lines.append)
    assert calls == [("acme/fresh", "v1", str(cache))]
    assert folder == cache / "models--acme--fresh" / "snapshots" / ("c" * 40)
    assert models.resolve_model("acme/fresh@v1") == folder
    assert any("downloading acme/fresh@v1" in line for line in lines)
    assert fetch_missing_hub_model("acme/fresh@v1", progress=lines.append) is None
    assert len(calls) == 1  # cached now: nothing more to fetch


def test_nothing_is_downloaded_offline_or_for_names_and_folders(cache, monkeypatch, tmp_path):
    from rllm_core.models.hub import fetch_missing_hub_model

    calls: list = []
    _fake_hub(monkeypatch, cache, calls)
    assert fetch_missing_hub_model("acme/fresh", progress=print) is None  # HF_HUB_OFFLINE=1
    monkeypatch.delenv("HF_HUB_OFFLINE")
    (tmp_path / "owner" / "local").mkdir(parents=True)
    assert fetch_missing_hub_model("owner/local", progress=print) is None
    assert fetch_missing_hub_model("smollm2-135m-instruct", progress=print) is None
    assert fetch_missing_hub_model("not an id", progress=print) is None
    assert calls == []
