"""Against the real Fireworks service: runs only with FIREWORKS_API_KEY set, and costs money.

``RLLM_FIREWORKS_TEST_MODEL`` picks the base model (default Qwen3-8B). One test samples, trains
a REINFORCE step and samples again; the other takes one supervised step on the trainer's
cross_entropy loss.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from reference.service_faults import Reinforce
from rllm_core.algorithms.objective import Objective
from rllm_core.types import Datum, SampleRequest, SamplingParams
from rllm_trainer_backend_fireworks.backend import FireworksBackend
from rllm_trainer_backend_fireworks.plugin import FireworksBackendConfig

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        not os.environ.get("FIREWORKS_API_KEY"), reason="FIREWORKS_API_KEY is not set"
    ),
]


MODEL = os.environ.get("RLLM_FIREWORKS_TEST_MODEL", "accounts/fireworks/models/qwen3-8b")


def test_sample_train_step_and_sample_again() -> None:
    model = MODEL
    backend = FireworksBackend(FireworksBackendConfig(model=model, lora_rank=8))
    try:
        sampler = backend.sampler()
        prompt = [9707, 11, 1879]
        request = SampleRequest(prompt_token_ids=prompt, params=SamplingParams(max_tokens=8))
        first = asyncio.run(sampler.sample(request))
        assert len(first.logprobs) == len(first.completion_token_ids) > 0
        assert first.weight_version == 0
        n = len(first.completion_token_ids)
        datum = Datum(
            token_ids=prompt + first.completion_token_ids,
            logprobs=[0.0] * len(prompt) + first.logprobs,
            advantages=[0.0] * len(prompt) + [1.0] * n,
            action_mask=[False] * len(prompt) + [True] * n,
            observation_mask=[False] * (len(prompt) + n),
        )
        metrics = backend.forward_backward([datum], Objective.of(Reinforce()))
        assert "reinforce/loss" in metrics
        backend.optim_step()
        second = asyncio.run(sampler.sample(request))
        assert second.weight_version == 1
    finally:
        backend.close()


def test_one_supervised_step() -> None:
    backend = FireworksBackend(FireworksBackendConfig(model=MODEL, lora_rank=8))
    try:
        prompt, answer = [9707, 11, 1879], [358, 1079, 6247, 13]
        tokens = prompt + answer
        datum = Datum(
            token_ids=tokens,
            logprobs=[0.0] * len(tokens),
            advantages=[0.0] * len(tokens),
            action_mask=[False] * len(prompt) + [True] * len(answer),
            observation_mask=[False] * len(tokens),
        )
        metrics = backend.forward_backward_supervised([datum, datum])
        assert metrics["tokens"] == 2 * len(answer) and metrics["sequences"] == 2
        assert 0.0 < metrics["nll"] < 50.0
        # The trainer's own sum of the weighted losses is the same mean: the weights normalize it.
        assert metrics["fireworks/loss:sum"] == pytest.approx(metrics["nll"], rel=1e-3)
        backend.optim_step()
        assert backend.weight_version == 1
    finally:
        backend.close()
