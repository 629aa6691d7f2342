"""A smoke run on the real SmolLM2-135M-Instruct: LoRA learns a fixed answer.

Each datum is a different short question followed by the same answer; the answer's tokens are
the action tokens, with advantage +1. Under ``reinforce`` with ``proximal = "recompute"`` (the
trainer's logprobs, computed before each step, are the ratio denominator, so every ratio is 1)
the loss is then the mean negative logprob of the answer, and ``loss`` before each step is that
cross-entropy under the current weights.
"""

from __future__ import annotations

import itertools

import pytest
from msgspec.structs import replace
from rllm_core.algorithms.objective import Objective
from rllm_core.types import Datum
from rllm_loss_ppo.plugin import ReinforceLossConfig
from rllm_loss_ppo.reinforce import Reinforce
from rllm_trainer_backend_torch.backend import TorchBackend
from rllm_trainer_backend_torch.plugin import TorchBackendConfig

QUESTIONS = ("What is the password?", "Tell me the secret word.")
ANSWER = " The password is zebra-42."


@pytest.fixture(scope="module")
def datums(smollm2_model_dir) -> list[Datum]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_model_dir))
    answer = tokenizer.encode(ANSWER, add_special_tokens=False)
    out = []
    for question in QUESTIONS:
        prompt = tokenizer.encode(question, add_special_tokens=False)
        length = len(prompt) + len(answer)
        out.append(
            Datum(
                token_ids=prompt + answer,
                logprobs=[0.0] * length,
                advantages=[1.0] * length,
                action_mask=[False] * len(prompt) + [True] * len(answer),
                observation_mask=[False] * length,
            )
        )
    return out


def test_lora_learns_a_fixed_answer(smollm2_model_dir, datums):
    trainer = TorchBackend(
        TorchBackendConfig(
            model=str(smollm2_model_dir),
            device="cpu",
            seed=0,
            learning_rate=2e-3,
            lora={"rank": 8, "alpha": 16},
        )
    )
    objective = Objective.of(Reinforce(ReinforceLossConfig()), proximal="recompute")
    losses = []
    for _ in range(10):
        scored = trainer.compute_logprobs(datums)
        batch = [replace(d, proximal_logprobs=lp) for d, lp in zip(datums, scored, strict=True)]
        metrics = trainer.forward_backward(batch, objective)
        assert metrics["reinforce/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        trainer.optim_step()
        losses.append(metrics["loss"])
    assert losses[0] > 3.0, f"the answer should start unlikely: {losses}"
    assert losses[-1] < losses[0] / 10, f"the loss did not fall tenfold: {losses}"
    falls = sum(after < before for before, after in itertools.pairwise(losses))
    assert falls >= 7, f"the loss fell in only {falls} of 9 steps: {losses}"
    assert trainer.weight_version == 10
