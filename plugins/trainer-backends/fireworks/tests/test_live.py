"""Against the real Fireworks service: runs only with FIREWORKS_API_KEY set, and costs money.

``RLLM_FIREWORKS_TEST_MODEL`` picks the base model (default Qwen3-8B). One test samples, trains
a REINFORCE step and samples again; one takes a PPO step on each loss path (the trainer's
``ppo`` kernel, then the custom-loss path) and prints the seconds each step took (run with
``-s`` to see them); one takes one supervised step on the trainer's cross_entropy loss; the
last trains a step and promotes it with ``promote_final`` (the model it creates stays on the
account). ``vocab_size`` is Qwen3's: the backends are built without a renderer's tokenizer.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from reference.service_faults import Reinforce
from rllm_core.algorithms.objective import Objective
from rllm_core.testing.managed import check_one_supervised_step
from rllm_core.types import Datum, SampleRequest, SamplingParams
from rllm_loss_ppo.plugin import PPOClipConfig
from rllm_loss_ppo.ppo_clip import PPOClip
from rllm_trainer_backend_fireworks.backend import FireworksBackend
from rllm_trainer_backend_fireworks.plugin import FireworksBackendConfig

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        not os.environ.get("FIREWORKS_API_KEY"), reason="FIREWORKS_API_KEY is not set"
    ),
]


MODEL = os.environ.get("RLLM_FIREWORKS_TEST_MODEL", "accounts/fireworks/models/qwen3-8b")
LIVE = {"model": MODEL, "lora_rank": 8, "vocab_size": 151936}


def test_sample_train_step_and_sample_again() -> None:
    backend = FireworksBackend(FireworksBackendConfig(**LIVE))
    try:
        sampler = backend.sampler()
        prompt = [9707, 11, 1879]
        request = SampleRequest(prompt_token_ids=prompt, params=SamplingParams(max_tokens=8))
        first = asyncio.run(sampler.sample(request))
        in_session = asyncio.run(
            sampler.sample(
                SampleRequest(prompt_token_ids=prompt, params=request.params, session_id="live-1")
            )
        )
        assert len(in_session.logprobs) == len(in_session.completion_token_ids) > 0
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


def test_one_step_on_each_loss_path() -> None:
    """The same PPO objective on both paths: as is it runs in the trainer's 'ppo' kernel; with
    a dual clip too large to bind (same gradient) it runs on the custom-loss path."""
    backend = FireworksBackend(FireworksBackendConfig(**LIVE))
    try:
        prompt = [9707, 11, 1879]
        request = SampleRequest(prompt_token_ids=prompt, params=SamplingParams(max_tokens=16))
        results = [asyncio.run(backend.sampler().sample(request)) for _ in range(4)]
        datums = [
            Datum(
                token_ids=prompt + r.completion_token_ids,
                logprobs=[0.0] * len(prompt) + r.logprobs,
                advantages=[0.0] * len(prompt) + [sign] * len(r.completion_token_ids),
                action_mask=[False] * len(prompt) + [True] * len(r.completion_token_ids),
                observation_mask=[False] * (len(prompt) + len(r.completion_token_ids)),
            )
            for r, sign in zip(results, (1.0, -1.0, 1.0, -1.0), strict=True)
        ]
        native = Objective.of(PPOClip(PPOClipConfig()), name="ppo-clip")
        custom = Objective.of(PPOClip(PPOClipConfig(dual_clip_c=1e6)), name="ppo-clip")
        assert backend.loss_route(native).path == "native"
        assert backend.loss_route(custom).path == "custom"
        seconds = {}
        for label, objective in (("native", native), ("custom", custom)):
            start = time.perf_counter()
            metrics = backend.forward_backward(datums, objective)
            backend.optim_step()
            seconds[label] = time.perf_counter() - start
            assert metrics["fireworks/native"] == (1.0 if label == "native" else 0.0)
            assert "ppo-clip/clip_fraction" in metrics and "offpolicy/k3" in metrics
        print(
            f"fireworks seconds per step: native {seconds['native']:.2f},"
            f" custom {seconds['custom']:.2f}"
        )
        assert backend.weight_version == 2
    finally:
        backend.close()


def test_one_supervised_step() -> None:
    backend = FireworksBackend(FireworksBackendConfig(**LIVE))
    try:
        prompt, answer = [9707, 11, 1879], [358, 1079, 6247, 13]
        check_one_supervised_step(backend, prompt, answer, "fireworks")
    finally:
        backend.close()


def test_promote_final_leaves_a_model_after_close() -> None:
    model_id = f"rllm-live-{int(time.time())}"
    backend = FireworksBackend(
        FireworksBackendConfig(**LIVE, promote_final=True, promoted_model_id=model_id)
    )
    try:
        prompt = [9707, 11, 1879]
        request = SampleRequest(prompt_token_ids=prompt, params=SamplingParams(max_tokens=8))
        result = asyncio.run(backend.sampler().sample(request))
        n = len(result.completion_token_ids)
        datum = Datum(
            token_ids=prompt + result.completion_token_ids,
            logprobs=[0.0] * len(prompt) + result.logprobs,
            advantages=[0.0] * len(prompt) + [1.0] * n,
            action_mask=[False] * len(prompt) + [True] * n,
            observation_mask=[False] * (len(prompt) + n),
        )
        backend.forward_backward([datum], Objective.of(Reinforce()))
        backend.optim_step()
    finally:
        backend.close()
    assert backend.promoted_model is not None
    assert backend.promoted_model.endswith(f"/models/{model_id}")
