"""The torch backend's sampler on a tiny random Llama against the core's sampler conformance
suite, its weights published by the backend's optimizer steps; and the suite shown to reject
samplers that break the port's rules."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from msgspec.structs import replace
from rllm_core.algorithms.objective import Objective
from rllm_core.testing.suites.samplers import SamplerConformance, assert_well_formed
from rllm_core.testing.suites.trainer_backends import RecordingLoss, make_trainer_datums
from rllm_core.types import Datum, SampleRequest, SampleResult
from rllm_trainer_backend_torch.backend import TorchBackend
from rllm_trainer_backend_torch.plugin import TorchBackendConfig

VOCAB = 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama-sampler")
    model = tiny_llama(3, vocab_size=VOCAB, max_position_embeddings=64, initializer_range=0.2)
    model.save_pretrained(folder)
    return folder


@pytest.fixture
def backend(model_dir: Path) -> Iterator[TorchBackend]:
    config = TorchBackendConfig(
        model=str(model_dir), device="cpu", seed=0, lora={"rank": 0}, learning_rate=1e-2
    )
    backend = TorchBackend(config)
    yield backend
    backend.close()


def scorer(backend: TorchBackend) -> Callable[[list[int], list[int]], list[float]]:
    def score(prompt: list[int], completion: list[int]) -> list[float]:
        n = len(prompt) + len(completion)
        datum = Datum(
            token_ids=prompt + completion,
            logprobs=[0.0] * n,
            advantages=[0.0] * n,
            action_mask=[False] * n,
            observation_mask=[False] * n,
        )
        return backend.compute_logprobs([datum])[0][len(prompt) :]

    return score


def publisher(backend: TorchBackend) -> Callable[[], Awaitable[int]]:
    """Publishes a new version by an optimizer step, off the event loop."""

    def step() -> int:
        backend.forward_backward(make_trainer_datums(0), Objective.of(RecordingLoss()))
        backend.optim_step()
        return backend.weight_version

    async def publish() -> int:
        return await asyncio.to_thread(step)

    return publish


class TestTorchSampler(SamplerConformance):
    vocab_size = VOCAB

    @pytest.fixture
    def sampler(self, backend: TorchBackend):
        return backend.sampler()

    @pytest.fixture
    def publish_weights(self, backend: TorchBackend):
        return publisher(backend)

    @pytest.fixture
    def score_completion(self, backend: TorchBackend):
        return scorer(backend)


# ------------------------------------------------------------------ the suite rejects breakage

SUITE = SamplerConformance()
SUITE.vocab_size = VOCAB


class Wrapped:
    """Delegates to the torch sampler; subclasses break one rule."""

    def __init__(self, inner) -> None:
        self.inner = inner

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def sample(self, request: SampleRequest) -> SampleResult:
        return await self.inner.sample(request)


class StaleVersion(Wrapped):
    """Reports the version it first saw."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.first = inner.weight_version

    async def sample(self, request: SampleRequest) -> SampleResult:
        return replace(await self.inner.sample(request), weight_version=self.first)


class Greedy(Wrapped):
    """Reports the logprob of every token as 0 (a greedy sampler's false certainty)."""

    async def sample(self, request: SampleRequest) -> SampleResult:
        result = await self.inner.sample(request)
        return replace(result, logprobs=[0.0] * len(result.logprobs))


class OneTooMany(Wrapped):
    async def sample(self, request: SampleRequest) -> SampleResult:
        result = await self.inner.sample(request)
        return replace(
            result,
            completion_token_ids=[*result.completion_token_ids, 1],
            logprobs=[*result.logprobs, -1.0],
        )


def test_catches_tokens_after_the_stop_token(backend) -> None:
    with pytest.raises(AssertionError, match=r"stop tokens at \[0\] did not end the completion"):
        SUITE.test_the_stop_token_that_ends_the_completion_is_included(
            OneTooMany(backend.sampler())
        )


def test_catches_a_completion_over_max_tokens(backend) -> None:
    with pytest.raises(AssertionError, match="5 completion tokens for max_tokens 4"):
        SUITE.test_without_stop_ids_it_runs_to_max_tokens(OneTooMany(backend.sampler()))


def test_catches_a_stale_weight_version(backend) -> None:
    publish = publisher(backend)
    with pytest.raises(AssertionError, match="published reports 0"):
        SUITE.test_samples_come_from_the_newest_published_weights(
            StaleVersion(backend.sampler()), publish
        )


def test_catches_logprobs_of_another_distribution(backend) -> None:
    with pytest.raises(AssertionError, match="differ from the model's"):
        SUITE.test_logprobs_are_those_of_the_sampling_distribution(
            Greedy(backend.sampler()), scorer(backend)
        )


def test_catches_a_stop_token_left_out_of_a_stopped_completion() -> None:
    request = SampleRequest(prompt_token_ids=[1, 2])
    request = replace(request, params=replace(request.params, max_tokens=4, stop_token_ids=(9,)))
    dropped = SampleResult(
        completion_token_ids=[5, 6], logprobs=[-1.0, -1.0], finish_reason="stop", weight_version=0
    )
    with pytest.raises(AssertionError, match="include the stop token that ended the completion"):
        assert_well_formed(dropped, request)
