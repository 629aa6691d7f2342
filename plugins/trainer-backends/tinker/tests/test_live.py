"""One step against the real Tinker service, with a small model.

Runs only when ``TINKER_API_KEY`` is set: samples a completion, trains one step on it with a
REINFORCE-style loss, and checks that the sampler moved to the new weights and that a saved
state loads back; takes one supervised step on Tinker's cross_entropy loss; and trains one
step of a PPO objective on each loss path (Tinker's ``ppo`` kernel and the client-side loss),
printing the seconds per step of both (run with ``pytest -s`` to see them).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import pytest
from reference.service_faults import Reinforce
from rllm_core.algorithms.objective import Objective
from rllm_core.testing.managed import check_one_supervised_step
from rllm_core.types import Datum, SampleRequest, SamplingParams
from rllm_loss_ppo.plugin import PPOClipConfig
from rllm_loss_ppo.ppo_clip import PPOClip
from rllm_trainer_backend_tinker.backend import TinkerBackend
from rllm_trainer_backend_tinker.plugin import TinkerBackendConfig

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        not os.environ.get("TINKER_API_KEY"),
        reason="TINKER_API_KEY is not set: the live Tinker tests need Tinker credentials",
    ),
]

BASE_MODEL = os.environ.get("RLLM_TINKER_TEST_MODEL", "meta-llama/Llama-3.2-1B")


def test_sample_train_publish_save_and_load(tmp_path):
    backend = TinkerBackend(
        TinkerBackendConfig(model=BASE_MODEL, lora_rank=8, checkpoint_ttl_s=3600)
    )
    try:
        prompt = [1, 450, 4996, 17354, 1701]
        request = SampleRequest(prompt_token_ids=prompt, params=SamplingParams(max_tokens=8))
        result = asyncio.run(backend.sampler().sample(request))
        assert 1 <= len(result.completion_token_ids) <= 8
        assert len(result.logprobs) == len(result.completion_token_ids)
        assert all(value <= 0.0 for value in result.logprobs)
        assert result.weight_version == 0

        tokens = prompt + result.completion_token_ids
        n_prompt, n = len(prompt), len(tokens)
        datum = Datum(
            token_ids=tokens,
            logprobs=[0.0] * n_prompt + result.logprobs,
            advantages=[0.0] * n_prompt + [1.0] * (n - n_prompt),
            action_mask=[False] * n_prompt + [True] * (n - n_prompt),
            observation_mask=[False] * n,
        )
        metrics = backend.forward_backward([datum], Objective.of(Reinforce()))
        assert metrics["action_tokens"] == n - n_prompt
        backend.optim_step()
        assert backend.weight_version == 1
        again = asyncio.run(backend.sampler().sample(request))
        assert again.weight_version == 1

        backend.save_state(str(tmp_path))
        backend.load_state(str(tmp_path))
        assert backend.weight_version == 1
    finally:
        backend.close()


def test_one_supervised_step():
    backend = TinkerBackend(TinkerBackendConfig(model=BASE_MODEL, lora_rank=8))
    try:
        prompt, answer = [1, 450, 4996, 17354, 1701], [263, 4996, 17354, 1701, 29889]
        check_one_supervised_step(backend, prompt, answer, "tinker")
    finally:
        backend.close()


def test_one_step_on_each_loss_path():
    """A group of 4 sampled completions with group-normalized rewards (longer is better), a
    PPO objective with token-mean aggregation, as the quickstart trains; one step per path."""
    prompt = [1, 450, 4996, 17354, 1701]
    objective = Objective.of(PPOClip(PPOClipConfig(eps_high=0.28)), name="ppo-clip")
    seconds = {}
    for path in ("native", "custom"):
        backend = TinkerBackend(TinkerBackendConfig(model=BASE_MODEL, lora_rank=8, loss_path=path))
        try:
            request = SampleRequest(prompt_token_ids=prompt, params=SamplingParams(max_tokens=16))

            async def group(request=request, backend=backend):
                return await asyncio.gather(*(backend.sampler().sample(request) for _ in range(4)))

            results = asyncio.run(group())
            rewards = [float(len(r.completion_token_ids)) for r in results]
            mean, spread = statistics.fmean(rewards), statistics.pstdev(rewards) or 1.0
            datums = []
            for result, reward in zip(results, rewards, strict=True):
                n_prompt, n = len(prompt), len(prompt) + len(result.completion_token_ids)
                advantage = (reward - mean) / spread
                datums.append(
                    Datum(
                        token_ids=prompt + result.completion_token_ids,
                        logprobs=[0.0] * n_prompt + result.logprobs,
                        advantages=[0.0] * n_prompt + [advantage] * (n - n_prompt),
                        action_mask=[False] * n_prompt + [True] * (n - n_prompt),
                        observation_mask=[False] * n,
                    )
                )
            assert backend.loss_route(objective).path == path
            start = time.perf_counter()
            metrics = backend.forward_backward(datums, objective)
            backend.optim_step()
            seconds[path] = time.perf_counter() - start
            assert metrics["tinker/native"] == (1.0 if path == "native" else 0.0)
            assert "ppo-clip/clip_fraction" in metrics and "offpolicy/k3" in metrics
            assert backend.weight_version == 1
        finally:
            backend.close()
    print(
        f"\ntinker {BASE_MODEL}: native {seconds['native']:.2f} s/step,"
        f" custom {seconds['custom']:.2f} s/step"
    )
