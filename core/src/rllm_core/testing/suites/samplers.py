"""Conformance suite for samplers (the :class:`~rllm_core.ports.Sampler` port).

Subclass the suite in a test module and provide its fixtures::

    class TestMySampler(SamplerConformance):
        vocab_size = 64

        @pytest.fixture
        def sampler(self):
            sampler = MySampler(...)
            yield sampler
            sampler.close()

        @pytest.fixture
        def publish_weights(self, trainer):
            async def publish():
                await asyncio.to_thread(trainer.step)
                return trainer.weight_version
            return publish

Fixtures:

- ``sampler`` (required): a fresh sampler. A :class:`~rllm_core.ports.WorkerPool` is closed
  (``aclose``) by each check on the event loop it ran on; anything else the fixture closes.
- ``publish_weights`` (optional): an async callable that makes newer weights the ones the
  sampler must sample from (an optimizer step of its trainer, an update of a
  :class:`~rllm_core.ports.PolicyFollower`) and returns their version.
- ``score_completion`` (optional): ``score_completion(prompt, completion)``, the logprob of each
  completion token under the sampler's current weights at temperature 1 (a trainer's
  :class:`~rllm_core.ports.LogprobScorer`); the sampled logprobs must agree within
  ``logprob_tolerance``.
- ``reject_next_request`` / ``make_upstream_unreachable`` (optional): callables that make the
  sampler's model servers refuse the next request, or become unreachable. A sampler without
  servers leaves them out.

Class attributes: ``vocab_size`` (token ids the model accepts; the prompts use ids below it),
``logprob_tolerance``, and ``deadline_s``, the most any check may take before it counts as hung.

What the checks hold the sampler to:

- a result holds as many logprobs as completion tokens, at least one and at most
  ``max_tokens``, each finite and at most 0, and the sampler's current ``weight_version``;
- ``finish_reason="stop"`` means the last token is a stop token and no other is;
  ``"length"`` means no stop token and exactly ``max_tokens`` tokens (for a prompt far from the
  context limit); a stop token that ended the completion is included in it;
- concurrent requests are each answered by their own rules;
- after newer weights are published, the sampler and its samples report their version;
- the logprobs are those of the sampling distribution (with ``score_completion``);
- failing model servers raise :class:`~rllm_core.errors.UpstreamRejectedError` (a refusal) or
  :class:`~rllm_core.errors.UpstreamUnavailableError` (none reachable);
- a :class:`~rllm_core.ports.StreamingSampler` streams non-empty ``(token_ids, logprobs)``
  pairs, then one result that is their concatenation, and keeps serving after a consumer
  closes a stream early; a :class:`~rllm_core.ports.WorkerPool` reports
  :class:`~rllm_core.types.WorkerStatus` es and closes twice; a
  :class:`~rllm_core.ports.BusyClock` never goes back; a :class:`~rllm_core.ports.SharedPool`
  gives client options that travel as JSON, and reports the model and version it was told to
  use.

Checks drive the sampler with :func:`asyncio.run` in plain synchronous tests. Every test method
takes its fixtures as arguments, so a test can call one directly with a hand-built sampler.
:func:`assert_well_formed` is public for a sampler's own tests.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ClassVar, TypeVar

import pytest

from rllm_core.errors import UpstreamRejectedError, UpstreamUnavailableError
from rllm_core.ports import BusyClock, Sampler, SharedPool, StreamingSampler, WorkerPool
from rllm_core.types import SampleRequest, SampleResult, SamplingParams, WorkerStatus

__all__ = ["SamplerConformance", "assert_well_formed"]

T = TypeVar("T")


def assert_well_formed(result: Any, request: SampleRequest, case: str = "") -> SampleResult:
    """``result`` answers ``request`` by the port's rules (see the module docstring); returns it."""
    where = f"{case}: " if case else ""
    assert isinstance(result, SampleResult), f"{where}sample returned {type(result).__name__}"
    tokens, logprobs = result.completion_token_ids, result.logprobs
    params = request.params
    assert len(tokens) == len(logprobs), (
        f"{where}{len(tokens)} completion tokens but {len(logprobs)} logprobs"
    )
    assert 1 <= len(tokens) <= params.max_tokens, (
        f"{where}{len(tokens)} completion tokens for max_tokens {params.max_tokens}"
    )
    for index, value in enumerate(logprobs):
        assert isinstance(value, float) and math.isfinite(value) and value <= 0.0, (
            f"{where}logprobs[{index}] is {value!r}, not a finite float <= 0"
        )
    stops = set(params.stop_token_ids)
    early = [i for i, token in enumerate(tokens[:-1]) if token in stops]
    assert not early, f"{where}stop tokens at {early} did not end the completion {tokens}"
    if result.finish_reason == "stop":
        assert tokens[-1] in stops, (
            f"{where}finish_reason 'stop' but the last token {tokens[-1]} is not among the"
            f" stop ids {sorted(stops)}; include the stop token that ended the completion"
        )
    else:
        assert result.finish_reason == "length", f"{where}finish_reason {result.finish_reason!r}"
        assert tokens[-1] not in stops, (
            f"{where}the completion ends with stop token {tokens[-1]} but finish_reason is 'length'"
        )
        assert len(tokens) == params.max_tokens, (
            f"{where}finish_reason 'length' after {len(tokens)} of {params.max_tokens} tokens"
        )
    assert type(result.weight_version) is int, (
        f"{where}weight_version is {result.weight_version!r}, not an int"
    )
    return result


@pytest.mark.rllm_conformance
class SamplerConformance:
    """The :class:`~rllm_core.ports.Sampler` contract; see the module docstring."""

    vocab_size: ClassVar[int] = 32
    logprob_tolerance: ClassVar[float] = 1e-3
    deadline_s: ClassVar[float] = 60.0

    @pytest.fixture
    def sampler(self) -> Any:
        pytest.fail(f"{type(self).__name__} must define a 'sampler' fixture returning a sampler")

    @pytest.fixture
    def publish_weights(self) -> Callable[[], Awaitable[int]] | None:
        return None

    @pytest.fixture
    def score_completion(self) -> Callable[[list[int], list[int]], Sequence[float]] | None:
        return None

    @pytest.fixture
    def reject_next_request(self) -> Callable[[], None] | None:
        return None

    @pytest.fixture
    def make_upstream_unreachable(self) -> Callable[[], None] | None:
        return None

    def prompt(self, length: int = 8, start: int = 1) -> list[int]:
        """``length`` ids below ``vocab_size``, none of them 0."""
        return [1 + (start + 5 * i) % (self.vocab_size - 1) for i in range(length)]

    def request(self, **params: Any) -> SampleRequest:
        return SampleRequest(prompt_token_ids=self.prompt(), params=SamplingParams(**params))

    def drive(self, sampler: Any, body: Coroutine[Any, Any, T]) -> T:
        """Run ``body`` within ``deadline_s``, then close a worker pool on the same loop."""

        async def main() -> T:
            try:
                return await asyncio.wait_for(body, self.deadline_s)
            except TimeoutError:
                pytest.fail(f"the sampler did not answer within {self.deadline_s} s")
            finally:
                if isinstance(sampler, WorkerPool):
                    await sampler.aclose()

        return asyncio.run(main())

    # ------------------------------------------------------------------ the port

    def test_is_a_sampler(self, sampler: Any) -> None:
        assert isinstance(sampler, Sampler), (
            f"{type(sampler).__name__} lacks weight_version or sample() of the Sampler port"
        )
        assert type(sampler.weight_version) is int, (
            f"weight_version is {sampler.weight_version!r}, not an int"
        )

    def test_a_result_is_well_formed_and_reports_the_current_version(self, sampler: Any) -> None:
        request = self.request(max_tokens=5, stop_token_ids=(self.vocab_size - 1,))
        result = self.drive(sampler, sampler.sample(request))
        assert_well_formed(result, request)
        assert result.weight_version == sampler.weight_version, (
            f"the result reports weight version {result.weight_version}, the sampler"
            f" {sampler.weight_version}"
        )

    def test_without_stop_ids_it_runs_to_max_tokens(self, sampler: Any) -> None:
        request = self.request(max_tokens=4)
        result = assert_well_formed(self.drive(sampler, sampler.sample(request)), request)
        assert result.finish_reason == "length", (
            f"no stop ids, yet finish_reason is {result.finish_reason!r}"
        )

    def test_the_stop_token_that_ends_the_completion_is_included(self, sampler: Any) -> None:
        every_id = tuple(range(self.vocab_size))
        request = self.request(max_tokens=4, stop_token_ids=every_id)
        result = assert_well_formed(self.drive(sampler, sampler.sample(request)), request)
        assert result.finish_reason == "stop" and len(result.completion_token_ids) == 1, (
            f"every id is a stop id, so the first token ends the completion: got"
            f" {result.completion_token_ids} ({result.finish_reason!r})"
        )

    def test_concurrent_requests_each_follow_their_own_rules(self, sampler: Any) -> None:
        requests = [
            SampleRequest(
                prompt_token_ids=self.prompt(8, start=index),
                params=SamplingParams(max_tokens=1 + index, seed=index),
                request_id=f"r{index}",
            )
            for index in range(6)
        ]

        async def body() -> list[SampleResult]:
            return list(await asyncio.gather(*(sampler.sample(r) for r in requests)))

        for index, (request, result) in enumerate(
            zip(requests, self.drive(sampler, body()), strict=True)
        ):
            assert_well_formed(result, request, f"concurrent request {index}")
            assert result.finish_reason == "length", (
                f"concurrent request {index}: {result.finish_reason!r} without stop ids"
            )

    def test_samples_come_from_the_newest_published_weights(
        self, sampler: Any, publish_weights: Callable[[], Awaitable[int]] | None
    ) -> None:
        if publish_weights is None:
            pytest.skip("provide a 'publish_weights' fixture to check weight versions")
        assert publish_weights is not None
        before = sampler.weight_version
        request = self.request(max_tokens=3)

        async def body() -> tuple[int, int, SampleResult]:
            version = await publish_weights()
            return version, sampler.weight_version, await sampler.sample(request)

        version, reported, result = self.drive(sampler, body())
        assert version > before, f"publish_weights returned {version}, not above {before}"
        assert reported == version, (
            f"after version {version} was published the sampler reports {reported}"
        )
        assert_well_formed(result, request)
        assert result.weight_version == version, (
            f"a sample taken after version {version} was published reports {result.weight_version}"
        )

    def test_logprobs_are_those_of_the_sampling_distribution(
        self,
        sampler: Any,
        score_completion: Callable[[list[int], list[int]], Sequence[float]] | None,
    ) -> None:
        if score_completion is None:
            pytest.skip("provide a 'score_completion' fixture to check logprobs")
        assert score_completion is not None
        request = self.request(max_tokens=6, temperature=1.0, seed=3)
        result = assert_well_formed(self.drive(sampler, sampler.sample(request)), request)
        scored = list(score_completion(request.prompt_token_ids, result.completion_token_ids))
        assert scored == pytest.approx(result.logprobs, abs=self.logprob_tolerance), (
            f"sampled logprobs {result.logprobs} differ from the model's {scored}"
        )

    def test_a_refused_request_raises_upstream_rejected(
        self, sampler: Any, reject_next_request: Callable[[], None] | None
    ) -> None:
        if reject_next_request is None:
            pytest.skip("provide a 'reject_next_request' fixture to check refusals")
        assert reject_next_request is not None
        reject_next_request()
        with pytest.raises(UpstreamRejectedError):
            self.drive(sampler, sampler.sample(self.request(max_tokens=2)))

    def test_unreachable_servers_raise_upstream_unavailable(
        self, sampler: Any, make_upstream_unreachable: Callable[[], None] | None
    ) -> None:
        if make_upstream_unreachable is None:
            pytest.skip("provide a 'make_upstream_unreachable' fixture to check outages")
        assert make_upstream_unreachable is not None
        make_upstream_unreachable()
        with pytest.raises(UpstreamUnavailableError):
            self.drive(sampler, sampler.sample(self.request(max_tokens=2)))

    # ------------------------------------------------------------------ what it may also offer

    def test_streaming(self, sampler: Any) -> None:
        if not isinstance(sampler, StreamingSampler):
            pytest.skip("the sampler does not stream")
        request = self.request(max_tokens=5)

        async def body() -> tuple[list[Any], SampleResult]:
            items = [item async for item in sampler.sample_stream(request)]
            stream = sampler.sample_stream(request)
            await stream.__anext__()
            await stream.aclose()
            return items, await sampler.sample(request)

        items, after = self.drive(sampler, body())
        assert items and isinstance(items[-1], SampleResult), (
            f"the stream did not end with one SampleResult: {items[-1:]!r}"
        )
        pairs = items[:-1]
        assert not any(isinstance(item, SampleResult) for item in pairs), (
            "the stream yielded more than one SampleResult"
        )
        tokens: list[int] = []
        logprobs: list[float] = []
        for index, (ids, values) in enumerate(pairs):
            assert ids and len(ids) == len(values), (
                f"stream item {index} holds {len(ids)} tokens and {len(values)} logprobs"
            )
            tokens += ids
            logprobs += values
        result = assert_well_formed(items[-1], request, "streamed")
        assert (result.completion_token_ids, result.logprobs) == (tokens, logprobs), (
            "the streamed result is not the concatenation of the streamed pairs"
        )
        assert_well_formed(after, request, "a request after a stream closed early")

    def test_worker_pool(self, sampler: Any) -> None:
        if not isinstance(sampler, WorkerPool):
            pytest.skip("the sampler is not a WorkerPool")

        async def body() -> Sequence[Any]:
            await sampler.sample(self.request(max_tokens=2))
            status = sampler.status()
            await sampler.aclose()
            return status

        status = self.drive(sampler, body())
        assert status and all(isinstance(s, WorkerStatus) for s in status), (
            f"status() returned {status!r}, not WorkerStatus records"
        )

    def test_busy_clock_never_goes_back(self, sampler: Any) -> None:
        if not isinstance(sampler, BusyClock):
            pytest.skip("the sampler has no busy clock")
        before = sampler.busy_seconds
        self.drive(sampler, sampler.sample(self.request(max_tokens=3)))
        after = sampler.busy_seconds
        assert isinstance(after, float) and 0.0 <= before <= after, (
            f"busy_seconds went from {before!r} to {after!r}"
        )

    def test_shared_pool(self, sampler: Any) -> None:
        if not isinstance(sampler, SharedPool):
            pytest.skip("the sampler is not a SharedPool")
        options = sampler.client_options()
        assert isinstance(options, dict), f"client_options() returned {options!r}, not a dict"
        # A gateway worker gets them through its environment.
        assert json.loads(json.dumps(options)) == options, (
            f"client_options() {options!r} do not travel as JSON unchanged"
        )
        model, version = sampler.served_policy()
        assert model is None or isinstance(model, str), f"served_policy() model {model!r}"
        assert version == sampler.weight_version, (
            f"served_policy() says version {version}, weight_version {sampler.weight_version}"
        )
        sampler.use("adapter-v7", version + 7)
        assert sampler.served_policy() == ("adapter-v7", version + 7)
        assert sampler.weight_version == version + 7
        sampler.use(model, version)
        assert sampler.served_policy() == (model, version)
        if isinstance(sampler, WorkerPool):
            self.drive(sampler, sampler.aclose())
