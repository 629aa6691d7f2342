"""export_weights: the trained policy as model servers load it, reloaded with transformers and
peft in a fresh model."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from rllm_core.algorithms.objective import Objective
from rllm_core.plugins.manager import get_plugin_manager
from rllm_core.plugins.specs import Kind
from rllm_core.ports import WeightExporter
from rllm_core.types import Datum
from rllm_loss_ppo.plugin import ReinforceLossConfig
from rllm_loss_ppo.reinforce import Reinforce
from rllm_trainer_backend_torch.backend import TorchBackend
from rllm_trainer_backend_torch.export import export_policy
from rllm_trainer_backend_torch.plugin import TorchBackendConfig

VOCAB = 96


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama) -> Path:
    """A tiny Llama folder with a real (word-level) tokenizer beside its weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-llama-export")
    tiny_llama(
        8, hidden_size=32, intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=32
    ).save_pretrained(folder)
    vocab = {"<unk>": 0, "</s>": 1} | {f"w{i}": i for i in range(2, VOCAB)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", eos_token="</s>"
    ).save_pretrained(folder)
    return folder


def trained(folder: Path, rank: int) -> TorchBackend:
    backend = TorchBackend(
        TorchBackendConfig(
            model=str(folder), device="cpu", seed=4, learning_rate=0.05, lora={"rank": rank}
        )
    )
    rng = random.Random(1)
    datums = [
        Datum(
            token_ids=[rng.randrange(VOCAB) for _ in range(8)],
            logprobs=[-1.0] * 8,
            advantages=[1.0 if i % 2 else -1.0] * 8,
            action_mask=[j >= 3 for j in range(8)],
            observation_mask=[False] * 8,
        )
        for i in range(4)
    ]
    backend.forward_backward(datums, Objective.of(Reinforce(ReinforceLossConfig())))
    backend.optim_step()
    return backend


def logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.tensor([[3, 17, 42, 5, 88, 9, 60]])
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_lora_export_is_a_peft_adapter_over_the_base_with_the_backends_logits(base_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    backend = trained(base_dir, rank=4)
    assert isinstance(backend, WeightExporter)
    exported = backend.export_weights(str(tmp_path / "v1"))
    assert (exported.version, exported.kind, exported.lora_rank) == (1, "lora", 4)
    assert exported.base_model == str(base_dir)
    folder = Path(exported.path)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in folder.iterdir()
    }
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == 4
    assert config["base_model_name_or_path"] == str(base_dir)
    reloaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(base_dir)), str(folder)
    ).eval()
    expected = logits(backend.model)
    torch.testing.assert_close(logits(reloaded), expected, rtol=0, atol=1e-6)
    # The adapters moved: the export is not the base model's behaviour.
    assert not torch.allclose(
        logits(AutoModelForCausalLM.from_pretrained(str(base_dir)).eval()), expected, atol=1e-4
    )


def test_a_full_export_is_a_model_folder_that_loads_alone(base_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    backend = trained(base_dir, rank=0)
    exported = backend.export_weights(str(tmp_path / "full"))
    assert (exported.version, exported.kind, exported.lora_rank) == (1, "full", 0)
    folder = Path(exported.path)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in folder.iterdir()
    }
    reloaded = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    torch.testing.assert_close(logits(reloaded), logits(backend.model), rtol=0, atol=1e-6)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer("w5 w7")["input_ids"] == [5, 7]


def test_exporting_again_replaces_the_folder_whole_and_leaves_nothing_beside_it(base_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    backend = trained(base_dir, rank=2)
    target = tmp_path / "adapter"
    backend.export_weights(str(target))
    first = (target / "adapter_model.safetensors").read_bytes()
    with torch.no_grad():
        for param in backend.trainable_parameters.values():
            param.add_(0.5)
    backend.export_weights(str(target))
    assert (target / "adapter_model.safetensors").read_bytes() != first
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]
    reloaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(base_dir)), str(target)
    ).eval()
    torch.testing.assert_close(logits(reloaded), logits(backend.model), rtol=0, atol=1e-6)


def test_a_failed_export_leaves_no_folder(base_dir, tmp_path, tiny_llama):
    plain = tiny_llama(1, vocab_size=VOCAB, max_position_embeddings=32)
    with pytest.raises(TypeError, match="needs a peft model"):
        export_policy(plain, tmp_path / "x", version=0, base_model=base_dir, lora_rank=2)
    assert list(tmp_path.iterdir()) == []


def test_the_torch_spec_says_it_exports_weights():
    spec = get_plugin_manager().get_record(Kind.TRAINER_BACKEND, "torch").spec
    assert spec.trait("exports_weights") is True


def test_a_merged_lora_export_is_a_model_folder_with_the_backends_logits(base_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    backend = trained(base_dir, rank=4)
    before = {name: param.detach().clone() for name, param in backend.model.named_parameters()}
    exported = backend.export_weights(str(tmp_path / "merged"), merge=True)
    assert (exported.version, exported.kind, exported.lora_rank) == (1, "full", 0)
    folder = Path(exported.path)
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert "adapter_config.json" not in names
    reloaded = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    assert not any("lora" in name for name, _ in reloaded.named_parameters())
    torch.testing.assert_close(logits(reloaded), logits(backend.model), rtol=0, atol=1e-5)
    assert AutoTokenizer.from_pretrained(str(folder))("w5 w7")["input_ids"] == [5, 7]
    # The backend keeps its adapters, unmerged, and trains on.
    after = dict(backend.model.named_parameters())
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name


def test_a_lora_export_carries_the_tokenizer(base_dir, tmp_path):
    from transformers import AutoTokenizer

    backend = trained(base_dir, rank=2)
    folder = Path(backend.export_weights(str(tmp_path / "adapter")).path)
    assert AutoTokenizer.from_pretrained(str(folder))("w5 w7")["input_ids"] == [5, 7]


@pytest.mark.parametrize("rank", [0, 3])
def test_a_lora_checkpoint_holds_a_peft_adapter_folder(base_dir, tmp_path, rank):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    backend = trained(base_dir, rank=rank)
    backend.save_state(str(tmp_path / "checkpoint"))
    adapter = tmp_path / "checkpoint" / "adapter"
    if rank == 0:
        assert not adapter.exists()
        return
    assert {p.name for p in adapter.iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
        "README.md",
    }
    reloaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(base_dir)), str(adapter)
    ).eval()
    torch.testing.assert_close(logits(reloaded), logits(backend.model), rtol=0, atol=1e-6)
    fresh = TorchBackend(
        TorchBackendConfig(
            model=str(base_dir), device="cpu", seed=9, learning_rate=0.05, lora={"rank": rank}
        )
    )
    fresh.load_state(str(tmp_path / "checkpoint"))
    torch.testing.assert_close(logits(fresh.model), logits(backend.model), rtol=0, atol=0)
