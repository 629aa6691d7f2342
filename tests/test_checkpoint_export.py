"""The export round trip: a run trains a tiny Llama (SmolLM2's tokenizer and chat template) one
step with LoRA or full training and checkpoints it, and the torch backend built from the run's
plan trains that checkpoint one step further; ``rllm-core checkpoints export`` writes the
checkpoint with and without ``--merge``; transformers (and peft for the adapter) load what it
wrote with the backend's own logits, and its tokenizer
applies the chat template. The command's refusals name what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reference.cli_process import overrides, run_cli, run_folder
from reference.quickstart import PLAN, write_tasks
from reference.run_cuts import checkpoint_of

torch = pytest.importorskip("torch")

IDS = [1, 17, 42, 5, 88, 9, 60, 3]
CONVERSATION = [{"role": "user", "content": "What is 2 + 2?"}]


def _train(tmp_path: Path, model: Path, lora: str) -> Path:
    tasks, held_out = write_tasks(tmp_path)
    settings = overrides(
        "run.steps=1",
        "run.save_every=1",
        "algorithm.batch_size=2",
        "algorithm.group_size=2",
        "sampling.max_tokens=4",
        f'trainer.model="{model}"',
        "trainer.learning_rate=0.05",
        f"trainer.lora={lora}",
        f'tasks.path="{tasks}"',
        f'tasks.eval_path="{held_out}"',
    )
    done = run_cli("run", str(PLAN), "--plain", *settings, cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    checkpoint = checkpoint_of(run_folder(done, tmp_path, "quickstart") / "checkpoints", 1)
    assert (checkpoint / "trainer" / "state.json").is_file()
    return checkpoint


def _train_on(checkpoint: Path) -> torch.Tensor:
    """Build the torch backend from the run's plan, load the checkpoint, take one more step
    with advantages of both signs (a run's first step on a random model earns no reward, so it
    leaves the policy where it was), save it over the checkpoint and return the backend's own
    logits."""
    import random

    from rllm_core.algorithms.objective import Objective
    from rllm_core.run.checkpoints import run_folder_of
    from rllm_core.types import Datum
    from rllm_loss_ppo.plugin import ReinforceLossConfig
    from rllm_loss_ppo.reinforce import Reinforce
    from rllm_trainer_backend_torch.backend import TorchBackend
    from rllm_trainer_backend_torch.plugin import TorchBackendConfig

    run_dir = run_folder_of(checkpoint)
    assert run_dir is not None
    resolved = json.loads((run_dir / "plan.resolved.json").read_text())
    config = next(c for c in resolved["components"] if c["where"] == "[trainer]")["config"]
    backend = TorchBackend(TorchBackendConfig.model_validate(config))
    rng = random.Random(5)
    datums = [
        Datum(
            token_ids=[rng.randrange(1, 400) for _ in range(10)],
            logprobs=[-1.0] * 10,
            advantages=[1.0 if i % 2 else -1.0] * 10,
            action_mask=[j >= 4 for j in range(10)],
            observation_mask=[False] * 10,
        )
        for i in range(4)
    ]
    try:
        backend.load_state(str(checkpoint / "trainer"))
        before = _logits(backend.model)
        backend.forward_backward(datums, Objective.of(Reinforce(ReinforceLossConfig())))
        backend.optim_step()
        backend.save_state(str(checkpoint / "trainer"))
        after = _logits(backend.model)
        assert not torch.allclose(before, after, atol=1e-4)
        return after
    finally:
        backend.close()


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=torch.tensor([IDS])).logits


def _export(checkpoint: Path, out: Path, *extra: str) -> dict:
    done = run_cli("checkpoints", "export", str(checkpoint), "--out", str(out), "--json", *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _check_tokenizer(folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nWhat is 2 + 2?<|im_end|>" in text


def test_a_lora_checkpoint_exports_as_an_adapter_and_merged(tiny_smol_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    checkpoint = _train(tmp_path, tiny_smol_model_dir, "{rank = 4, alpha = 8.0}")
    expected = _train_on(checkpoint)

    adapter = _export(checkpoint, tmp_path / "adapter")
    assert (adapter["kind"], adapter["version"], adapter["lora_rank"]) == ("lora", 2, 4)
    folder = Path(adapter["path"])
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in folder.iterdir()
    }
    reloaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(tiny_smol_model_dir)), str(folder)
    )
    torch.testing.assert_close(_logits(reloaded), expected, rtol=0, atol=1e-5)
    _check_tokenizer(folder)

    merged = _export(checkpoint, tmp_path / "merged", "--merge")
    assert (merged["kind"], merged["version"], merged["lora_rank"]) == ("full", 2, 0)
    folder = Path(merged["path"])
    assert not (folder / "adapter_config.json").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(str(folder))
    torch.testing.assert_close(_logits(reloaded), expected, rtol=0, atol=1e-5)
    _check_tokenizer(folder)

    # The checkpoint's own adapter folder is the same adapter.
    reloaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(tiny_smol_model_dir)),
        str(checkpoint / "trainer" / "adapter"),
    )
    torch.testing.assert_close(_logits(reloaded), expected, rtol=0, atol=1e-5)


def test_a_full_checkpoint_exports_as_a_model_folder_with_or_without_merge(
    tiny_smol_model_dir, tmp_path
):
    from transformers import AutoModelForCausalLM

    checkpoint = _train(tmp_path, tiny_smol_model_dir, "{rank = 0}")
    expected = _train_on(checkpoint)
    assert not (checkpoint / "trainer" / "adapter").exists()
    for name, extra in (("plain", ()), ("merged", ("--merge",))):
        exported = _export(checkpoint, tmp_path / name, *extra)
        assert (exported["kind"], exported["version"]) == ("full", 2)
        folder = Path(exported["path"])
        reloaded = AutoModelForCausalLM.from_pretrained(str(folder))
        torch.testing.assert_close(_logits(reloaded), expected, rtol=0, atol=1e-5)
        _check_tokenizer(folder)

    # Refusals: an existing non-empty --out, a folder that is no checkpoint, one outside a run.
    done = run_cli("checkpoints", "export", str(checkpoint), "--out", str(tmp_path / "plain"))
    assert done.returncode == 2
    assert "already exists and is not an empty folder" in done.stderr
    assert str(tmp_path / "plain") in done.stderr
    missing = checkpoint.parent / "step-9"
    done = run_cli("checkpoints", "export", str(missing), "--out", str(tmp_path / "x"))
    assert done.returncode == 2
    assert f"checkpoint folder '{missing}' does not exist" in done.stderr
    stray = tmp_path / "a" / "b" / "step-1"
    (stray / "trainer").mkdir(parents=True)
    done = run_cli("checkpoints", "export", str(stray), "--out", str(tmp_path / "x"))
    assert done.returncode == 2
    assert "is not inside a run folder" in done.stderr
    assert not (tmp_path / "x").exists()


def test_a_backend_that_does_not_export_is_refused_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step-3" / "trainer").mkdir(parents=True)
    trainer = {"where": "[trainer]", "kind": "trainer_backend", "name": "tinker", "config": {}}
    (run_dir / "plan.resolved.json").write_text(json.dumps({"components": [trainer]}))
    done = run_cli(
        "checkpoints",
        "export",
        str(run_dir / "checkpoints" / "step-3"),
        "--out",
        str(tmp_path / "out"),
    )
    assert done.returncode == 2, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert "the run's trainer backend 'tinker'" in message
    assert "does not export weights (WeightExporter)" in message
    assert str(run_dir / "plan.resolved.json") in message
