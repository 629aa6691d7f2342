"""A plan naming its model by Hugging Face Hub id: a tiny random Llama with SmolLM2's tokenizer
and chat template saved into a Hugging Face cache laid out by the test, with
``HF_HUB_OFFLINE=1``. ``plan check`` resolves the renderer's tokenizer to the snapshot, and
``rllm-core run`` trains on it; an id missing from the cache is a warning of the check naming
the id, the cache and the pull command (an error with --strict). Nothing is downloaded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from reference.cli_process import overrides, plan_check, run_cli, run_folder
from reference.quickstart import PLAN, write_tasks

pytest.importorskip("torch")

REPO = "acme/tiny-smol"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, tiny_smol_model_dir) -> Path:
    cache = tmp_path / "hf-cache"
    repo = cache / "models--acme--tiny-smol"
    shutil.copytree(tiny_smol_model_dir, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT, encoding="utf-8")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _plan(tmp_path: Path, model: str) -> tuple[Path, list[str]]:
    tasks, held_out = write_tasks(tmp_path)
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.read_text(encoding="utf-8"), encoding="utf-8")
    settings = overrides(
        "run.steps=1",
        "run.save_every=1",
        "algorithm.batch_size=2",
        "algorithm.group_size=2",
        "sampling.max_tokens=4",
        f'trainer.model="{model}"',
        "trainer.lora={rank = 4, alpha = 8.0}",
        f'tasks.path="{tasks}"',
        f'tasks.eval_path="{held_out}"',
    )
    return plan, settings


def test_a_run_trains_the_model_a_hub_id_names_from_the_cache(hub_cache, tmp_path):
    plan, settings = _plan(tmp_path, REPO)
    snapshot = hub_cache / "models--acme--tiny-smol" / "snapshots" / COMMIT
    done = run_cli("plan", "check", "--json", str(plan), *settings, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f'"model": "{REPO}"' in done.stdout
    assert str(snapshot) in done.stdout  # the renderer's tokenizer, from the trainer's model
    done = run_cli("run", str(plan), "--plain", *settings, cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = run_folder(done, tmp_path, "quickstart")
    assert (run_dir / "metrics.jsonl").read_text().count("\n") >= 1


def test_plan_check_names_a_hub_id_missing_from_the_cache(hub_cache, tmp_path):
    plan, settings = _plan(tmp_path, "acme/absent@v2")
    done = run_cli("plan", "check", str(plan), *settings, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert f"warning: {plan}: [trainer].model:" in message
    assert "'acme/absent@v2' is not in the Hugging Face cache" in message
    assert str(hub_cache) in message
    assert "rllm-core models pull acme/absent@v2" in message
    strict = run_cli("plan", "check", "--strict", str(plan), *settings, cwd=tmp_path, timeout=120)
    assert strict.returncode == 2 and "rllm-core models pull acme/absent@v2" in strict.stderr


def test_plan_check_accepts_the_hub_id_written_in_the_plan(hub_cache, tmp_path):
    plan, _ = _plan(tmp_path, REPO)
    text = (
        plan.read_text(encoding="utf-8")
        .replace('model = "smollm2-135m-instruct"', f'model = "{REPO}"')
        .replace('"../tasks/arithmetic.jsonl"', '"easy.jsonl"')
        .replace('"../tasks/arithmetic-eval.jsonl"', '"held-out.jsonl"')
    )
    plan.write_text(text, encoding="utf-8")
    checked = {c["where"]: c["config"] for c in plan_check(plan, tmp_path)["components"]}
    snapshot = hub_cache / "models--acme--tiny-smol" / "snapshots" / COMMIT
    assert checked["[trainer]"]["model"] == REPO
    assert checked["[renderer]"]["tokenizer"] == str(snapshot)


def test_renderers_take_a_tokenizer_by_hub_id(tmp_path, monkeypatch, smollm2_tokenizer_dir):
    from rllm_core.errors import ModelNotCachedError
    from rllm_core.types import Message
    from rllm_renderer_chatml.plugin import ChatMLConfig
    from rllm_renderer_chatml.renderer import ChatMLRenderer
    from rllm_renderer_hf.plugin import HFConfig
    from rllm_renderer_hf.renderer import HFRenderer

    cache = tmp_path / "hf-cache"
    repo = cache / "models--acme--smol-tokenizer"
    shutil.copytree(smollm2_tokenizer_dir, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT, encoding="utf-8")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    messages = [Message(role="user", content="What is 2 + 2?")]
    by_id = ChatMLRenderer.from_config(ChatMLConfig(tokenizer="acme/smol-tokenizer"))
    by_folder = ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(smollm2_tokenizer_dir)))
    assert by_id.render(messages).token_ids == by_folder.render(messages).token_ids
    hf = HFRenderer(HFConfig(tokenizer=f"acme/smol-tokenizer@{COMMIT}"))
    assert hf.render(messages).token_ids == by_folder.render(messages).token_ids
    with pytest.raises(ModelNotCachedError, match="'acme/other' is not in the Hugging Face cache"):
        HFRenderer(HFConfig(tokenizer="acme/other"))


def test_a_run_downloads_a_hub_id_missing_from_the_cache_when_online(
    hub_cache, tmp_path, monkeypatch, tiny_smol_model_dir
):
    """What ``rllm-core run``, ``sft`` and ``eval`` prepare with (``download=True``): the
    missing id is fetched through huggingface_hub (replaced here by one that copies the tiny
    model into the cache as the real one lays it out) before the plan is resolved."""
    import sys
    import types

    from rllm_core.run.components import prepare_plan

    calls = []

    def snapshot_download(repo_id, revision=None, cache_dir=None):
        calls.append(repo_id)
        repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
        shutil.copytree(tiny_smol_model_dir, repo / "snapshots" / COMMIT)
        (repo / "refs").mkdir()
        (repo / "refs" / revision).write_text(COMMIT, encoding="utf-8")
        return str(repo / "snapshots" / COMMIT)

    module = types.ModuleType("huggingface_hub")
    module.snapshot_download = snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", module)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    plan, settings = _plan(tmp_path, "acme/fetched")
    args = [value for flag, value in zip(settings[::2], settings[1::2], strict=True)]
    resolved = prepare_plan(plan, args, run_dir=tmp_path / "run", download=True)
    snapshot = hub_cache / "models--acme--fetched" / "snapshots" / COMMIT
    assert calls == ["acme/fetched"]
    assert resolved.plan.renderer.options["tokenizer"] == str(snapshot)
    checked = prepare_plan(plan, args, run_dir=tmp_path / "run")  # plan check never downloads
    assert checked.plan.trainer.options["model"] == "acme/fetched" and calls == ["acme/fetched"]
