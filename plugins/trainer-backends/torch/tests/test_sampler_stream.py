"""TorchSampler.sample_stream on a tiny random Llama: tokens handed out while decoding, the
same completion as ``sample``, early close, errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
import torch
from rllm_core.ports.training import StreamingSampler
from rllm_core.types import SampleRequest, SampleResult, SamplingParams
from rllm_trainer_backend_torch.gate import WeightGate
from rllm_trainer_backend_torch.sampler import TorchSampler
from rllm_trainer_backend_torch.testing import ForwardRecorder, assert_gate_free

VOCAB = 512


@pytest.fixture(scope="module")
def model(tiny_llama) -> torch.nn.Module:
    # Larger initial weights than the default, so that sampled tokens vary.
    return tiny_llama(0, vocab_size=VOCAB, initializer_range=0.2)


def request(prompt: list[int], **params) -> SampleRequest:
    return SampleRequest(prompt_token_ids=prompt, params=SamplingParams(**params))


def prompt_of(length: int, start: int = 3) -> list[int]:
    return [(start + 37 * i) % VOCAB for i in range(length)]


async def collect(
    sampler: TorchSampler,
    req: SampleRequest,
    between: Callable[[], Awaitable[None]] | None = None,
) -> tuple[list[tuple[list[int], list[float]]], SampleResult]:
    """Every piece ``sample_stream`` yields, then its result; awaits ``between()`` after
    each piece."""
    pieces: list[tuple[list[int], list[float]]] = []
    results = []
    async for item in sampler.sample_stream(req):
        if isinstance(item, SampleResult):
            results.append(item)
        else:
            pieces.append(item)
            if between is not None:
                await between()
    assert len(results) == 1
    return pieces, results[0]


def test_it_is_a_streaming_sampler(sampler: TorchSampler) -> None:
    assert isinstance(sampler, StreamingSampler)


@pytest.mark.parametrize(
    "params",
    [
        {"max_tokens": 30, "temperature": 0.9, "top_p": 0.95, "seed": 4},
        {"max_tokens": 25, "temperature": 0.0},
        {"max_tokens": 1, "temperature": 1.0, "seed": 1},
    ],
    ids=["sampled", "greedy", "one-token"],
)
@pytest.mark.parametrize("slow_reader", [False, True], ids=["eager-reader", "slow-reader"])
def test_the_pieces_concatenate_to_what_sample_gives(
    sampler: TorchSampler, recorder: ForwardRecorder, params: dict, slow_reader: bool
) -> None:
    req = request(prompt_of(6), **params)

    async def three_more_forwards() -> None:
        target = min(len(recorder.shapes) + 3, params["max_tokens"])
        while len(recorder.shapes) < target:
            await asyncio.sleep(0.001)

    pieces, result = asyncio.run(
        collect(sampler, req, three_more_forwards if slow_reader else None)
    )
    expected = asyncio.run(sampler.sample(req))
    assert result == expected
    assert all(ids and len(ids) == len(logprobs) for ids, logprobs in pieces)
    assert [t for ids, _ in pieces for t in ids] == expected.completion_token_ids
    assert [v for _, values in pieces for v in values] == expected.logprobs
    if slow_reader and params["max_tokens"] > 1:
        # A reader slower than the decoder gets what accumulated since its last read.
        assert max(len(ids) for ids, _ in pieces) > 1
        assert len(pieces) < params["max_tokens"] / 2


def test_a_stop_token_is_streamed_and_ends_the_stream(sampler: TorchSampler) -> None:
    prompt = prompt_of(7)
    free = sampler.sample_many([request(prompt, max_tokens=30, seed=3)])[0]
    cut = next(
        i for i in range(3, 30) if free.completion_token_ids[i] not in free.completion_token_ids[:i]
    )
    stop = free.completion_token_ids[cut]
    pieces, result = asyncio.run(
        collect(sampler, request(prompt, max_tokens=30, seed=3, stop_token_ids=(stop,)))
    )
    assert [t for ids, _ in pieces for t in ids] == free.completion_token_ids[: cut + 1]
    assert result.finish_reason == "stop"


def test_pieces_arrive_while_the_completion_is_decoding(
    sampler: TorchSampler, recorder: ForwardRecorder
) -> None:
    recorder.delay_s = 0.005
    seen: list[int] = []

    async def run() -> SampleResult:
        async for item in sampler.sample_stream(request(prompt_of(5), max_tokens=60, seed=2)):
            if isinstance(item, SampleResult):
                return item
            seen.append(len(recorder.shapes))
        raise AssertionError("no result")

    result = asyncio.run(run())
    assert len(result.completion_token_ids) == 60
    # The prefill chose the first token; it reached the reader long before the 60th forward.
    assert seen[0] < 15
    assert len(seen) > 5
    assert seen == sorted(seen)


def test_concurrent_streams_match_their_samples_alone(make_sampler) -> None:
    sampler = make_sampler(max_batch_size=3)
    requests = [
        request(prompt_of(2 + 3 * i, start=7 * i), max_tokens=4 + 5 * i, temperature=0.9, seed=i)
        for i in range(6)
    ]

    async def run() -> list:
        return await asyncio.gather(*(collect(sampler, r) for r in requests))

    streamed = asyncio.run(run())
    for (pieces, result), req in zip(streamed, requests, strict=True):
        alone = sampler.sample_many([req])[0]
        assert [t for ids, _ in pieces for t in ids] == result.completion_token_ids
        assert result.completion_token_ids == alone.completion_token_ids
        assert result.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_closing_the_stream_early_frees_its_slot_and_others_are_unaffected(
    make_sampler, gate: WeightGate, recorder: ForwardRecorder
) -> None:
    # Two slots: the long stream and `steady` fill them; `waiting` gets a slot only when the
    # closed stream leaves the batch, long before `steady` ends.
    sampler = make_sampler(max_batch_size=2)
    recorder.delay_s = 0.002
    long = request(prompt_of(4), max_tokens=400, seed=0)
    steady = request(prompt_of(5, start=90), max_tokens=80, temperature=0.8, seed=1)
    waiting = request(prompt_of(3, start=200), max_tokens=5, temperature=0.8, seed=2)
    finished: list[str] = []
    got: list[list[int]] = []

    async def sample(name: str, req: SampleRequest) -> SampleResult:
        result = await sampler.sample(req)
        finished.append(name)
        return result

    async def run() -> tuple[SampleResult, SampleResult]:
        stream = sampler.sample_stream(long)
        first = await anext(stream)
        got.append(first[0])
        steady_task = asyncio.create_task(sample("steady", steady))
        while (2, 1) not in recorder.shapes:
            await asyncio.sleep(0.001)
        waiting_task = asyncio.create_task(sample("waiting", waiting))
        await asyncio.sleep(0.01)
        for _ in range(2):
            got.append((await anext(stream))[0])
        await stream.aclose()
        return await steady_task, await waiting_task

    steady_result, waiting_result = asyncio.run(run())
    assert finished == ["waiting", "steady"]
    assert len(recorder.shapes) < 150
    assert_gate_free(gate)
    recorder.delay_s = 0.0
    streamed = [t for ids in got for t in ids]
    alone = sampler.sample_many([request(prompt_of(4), max_tokens=len(streamed), seed=0)])[0]
    assert streamed == alone.completion_token_ids
    for result, req in ((steady_result, steady), (waiting_result, waiting)):
        expected = sampler.sample_many([req])[0]
        assert result.completion_token_ids == expected.completion_token_ids
        assert result.logprobs == pytest.approx(expected.logprobs, abs=1e-5)


def test_a_stream_closed_while_queued_is_never_started(
    make_sampler, gate: WeightGate, recorder: ForwardRecorder
) -> None:
    sampler = make_sampler(max_batch_size=1)
    recorder.delay_s = 0.002
    queued_prompt = prompt_of(9, start=300)

    async def run() -> SampleResult:
        running = asyncio.create_task(sampler.sample(request(prompt_of(4), max_tokens=40, seed=0)))
        while not recorder.shapes:
            await asyncio.sleep(0.001)
        stream = sampler.sample_stream(request(queued_prompt, max_tokens=40, seed=1))
        reader = asyncio.create_task(anext(stream))
        await asyncio.sleep(0.01)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        await stream.aclose()
        return await running

    result = asyncio.run(run())
    assert len(result.completion_token_ids) == 40
    time.sleep(0.05)
    assert (1, len(queued_prompt)) not in recorder.shapes
    assert_gate_free(gate)


def test_an_error_mid_decode_is_raised_from_the_iterator_after_the_tokens_before_it(
    sampler: TorchSampler, recorder: ForwardRecorder
) -> None:
    recorder.delay_s = 0.002
    recorder.fail = lambda ids: len(recorder.shapes) > 6
    pieces: list[list[int]] = []

    async def run() -> None:
        async for item in sampler.sample_stream(request(prompt_of(4), max_tokens=50, seed=0)):
            assert not isinstance(item, SampleResult)
            pieces.append(item[0])

    with pytest.raises(RuntimeError, match=r"injected failure on a \(1, 1\) batch"):
        asyncio.run(run())
    # The prefill and five decode steps chose six tokens; the seventh forward failed.
    assert sum(len(ids) for ids in pieces) == 6
    recorder.fail = lambda ids: False
    _, result = asyncio.run(collect(sampler, request(prompt_of(4), max_tokens=8, seed=0)))
    assert len(result.completion_token_ids) == 8


def test_an_invalid_request_is_refused_before_anything_is_queued(
    sampler: TorchSampler, recorder: ForwardRecorder
) -> None:
    with pytest.raises(ValueError, match=f"token id {VOCAB} is outside the vocabulary"):
        asyncio.run(collect(sampler, request([1, VOCAB], max_tokens=3)))
    assert recorder.shapes == []
