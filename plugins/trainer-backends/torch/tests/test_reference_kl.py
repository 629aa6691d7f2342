"""The torch backend's reference model and entropy: with LoRA the reference is the policy with
its adapters disabled (the KL is exactly 0 at step 0, B = 0, and grows as the adapters
train, on the real SmolLM2); with full training a frozen copy of the starting weights; the
entropy comes from the forward pass's logits at the action positions, in each logprob path."""

from __future__ import annotations

import msgspec
import pytest
import torch
from rllm_core.algorithms.objective import Objective
from rllm_core.algorithms.reference_kl import ReferenceKL, entropy_from_logits
from rllm_core.ports import LossContext, LossOutput, ReferenceScorer
from rllm_core.testing.models import smollm2_model_dir
from rllm_core.types import Datum
from rllm_trainer_backend_torch.backend import TorchBackend
from rllm_trainer_backend_torch.logprobs import shared_prefix_logprobs, token_logprobs
from rllm_trainer_backend_torch.plugin import TorchBackendConfig


class Reinforce:
    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=ctx.aggregate(-ctx.advantages * ctx.logprobs, ctx.action_mask))


def datum(token_ids: list[int], prompt: int, advantage: float) -> Datum:
    n = len(token_ids)
    return Datum(
        token_ids=token_ids,
        logprobs=[0.0] * prompt + [-1.0] * (n - prompt),
        advantages=[advantage] * n,
        action_mask=[False] * prompt + [True] * (n - prompt),
        observation_mask=[False] * n,
    )


def with_reference(trainer: TorchBackend, datums: list[Datum]) -> list[Datum]:
    refs = trainer.compute_ref_logprobs(datums)
    return [msgspec.structs.replace(d, ref_logprobs=r) for d, r in zip(datums, refs, strict=True)]


def test_lora_reference_kl_is_zero_at_step_zero_and_grows_as_the_adapters_train():
    trainer = TorchBackend(
        TorchBackendConfig(
            model=str(smollm2_model_dir()),
            device="cpu",
            learning_rate=5e-3,
            lora={"rank": 4, "target_modules": ["q_proj", "v_proj"]},
        )
    )
    try:
        assert isinstance(trainer, ReferenceScorer)
        datums = [datum([1, 504, 3458, 28, 253, 5248, 30, 2, 1062, 314], 5, 1.0)]
        objective = Objective.of(Reinforce(), kl=ReferenceKL(0.1, "k3"))
        scored = with_reference(trainer, datums)
        kls = []
        for _ in range(3):
            metrics = trainer.forward_backward(scored, objective)
            kls.append((metrics["kl/ref_mean"], metrics["kl/ref_max"]))
            if len(kls) < 3:
                trainer.optim_step()
        # B = 0: the policy is its base model bitwise, then moves away from it.
        assert kls[0] == (0.0, 0.0)
        # With the adapters disabled the reference stays the base model: were they not, the
        # reference would follow the policy and the KL would stay 0.
        assert 0 < kls[1][0] < kls[2][0], kls
    finally:
        trainer.close()


def test_full_training_scores_against_a_frozen_copy_of_the_starting_weights(tmp_path, tiny_llama):
    tiny_llama(3, vocab_size=300, max_position_embeddings=64).save_pretrained(tmp_path)
    trainer = TorchBackend(
        TorchBackendConfig(model=str(tmp_path), device="cpu", lora={"rank": 0}, learning_rate=1e-2)
    )
    try:
        datums = [datum([3, 17, 250, 9, 44, 2], 2, 1.0), datum([8, 8, 100, 11], 1, -1.0)]
        start = trainer.compute_logprobs(datums)
        assert trainer.compute_ref_logprobs(datums) == start
        objective = Objective.of(Reinforce(), kl=ReferenceKL(0.5, "low-var-kl"))
        scored = with_reference(trainer, datums)
        assert trainer.forward_backward(scored, objective)["kl/ref_max"] == 0.0
        trainer.optim_step()
        assert trainer.compute_logprobs(datums) != start
        assert trainer.compute_ref_logprobs(datums) == start
        assert trainer.forward_backward(scored, objective)["kl/ref_mean"] > 0
        reference = trainer._reference
        assert reference is not None
        assert not any(p.requires_grad for p in reference.parameters())
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_llama) -> torch.nn.Module:
    return tiny_llama(5, vocab_size=300, max_position_embeddings=64)


IDS = torch.tensor([[3, 17, 250, 9, 44, 2, 0, 0], [3, 17, 250, 11, 12, 13, 14, 15]])
LENGTHS = torch.tensor([6, 8])
NEEDED = torch.tensor([[0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 1, 0, 1, 1]])


def test_entropy_at_action_positions_in_every_logprob_path(model):
    logits = model(input_ids=IDS).logits.float() / 0.7
    # The logits at t - 1 predict the token at t.
    expected = torch.nn.functional.pad(entropy_from_logits(logits[:, :-1]), (1, 0))
    mask = NEEDED.bool()
    for label, (logprobs, entropy) in {
        "full": token_logprobs(model, IDS, temperature=0.7, entropy=True),
        "needed": token_logprobs(model, IDS, temperature=0.7, needed=NEEDED, entropy=True),
        "shared": shared_prefix_logprobs(
            model, IDS, LENGTHS, temperature=0.7, needed=NEEDED, entropy=True
        ),
    }.items():
        torch.testing.assert_close(entropy[mask], expected[mask], atol=1e-5, rtol=0, msg=label)
        assert entropy.requires_grad and logprobs.requires_grad, label
        if label != "full":
            assert torch.all(entropy[~mask] == 0), label
        (grad,) = torch.autograd.grad(entropy[mask].sum(), model.lm_head.weight)
        assert grad.abs().sum() > 0


def test_the_backend_passes_entropy_and_the_bonus_changes_the_gradient(tmp_path, tiny_llama):
    tiny_llama(3, vocab_size=300, max_position_embeddings=64).save_pretrained(tmp_path)
    trainer = TorchBackend(TorchBackendConfig(model=str(tmp_path), device="cpu", lora={"rank": 0}))
    try:
        datums = [datum([3, 17, 250, 9, 44, 2], 2, 1.0)]
        plain = trainer.forward_backward(datums, Objective.of(Reinforce()))
        grad_plain = trainer.model.lm_head.weight.grad.clone()
        trainer.optimizer.zero_grad(set_to_none=True)
        bonus = trainer.forward_backward(datums, Objective.of(Reinforce(), entropy_coef=0.1))
        grad_bonus = trainer.model.lm_head.weight.grad.clone()
        with torch.no_grad():
            logits = trainer.model(input_ids=torch.tensor([datums[0].token_ids])).logits
        expected = entropy_from_logits(logits[0, 1:-1]).mean()
        assert "entropy/mean" not in plain
        assert bonus["entropy/mean"] == pytest.approx(float(expected), abs=1e-5)
        assert bonus["loss"] == pytest.approx(plain["loss"] - 0.1 * float(expected), abs=1e-5)
        assert not torch.equal(grad_plain, grad_bonus)
    finally:
        trainer.close()
