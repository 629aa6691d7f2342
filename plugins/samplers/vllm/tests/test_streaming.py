"""Streaming through the vLLM sampler: ``HttpWorkerPool.sample_stream`` reads the worker's event
stream, and the gateway forwards its tokens to the ``openai`` client while the worker is still
sampling. Failures before the first token fall back to a retried plain request."""

from __future__ import annotations

import asyncio
import time

import pytest
from reference.toy_renderer import IM_END
from rllm_core.errors import UpstreamError
from rllm_core.ports import StreamingSampler
from rllm_core.testing.fakeworker import fake_logprob, fixed_reply
from rllm_core.types import SampleRequest, SampleResult, SamplingParams
from rllm_sampler_vllm.pool import HttpWorkerPool

HI = [{"role": "user", "content": "hi"}]
REQUEST = SampleRequest(
    prompt_token_ids=[101, 7, 8], params=SamplingParams(max_tokens=32, stop_token_ids=(2,))
)


async def collect(pool: HttpWorkerPool, request: SampleRequest = REQUEST):
    pieces, result = [], None
    try:
        async for item in pool.sample_stream(request):
            if isinstance(item, SampleResult):
                result = item
            else:
                pieces.append(item)
    finally:
        await pool.aclose()
    return pieces, result


@pytest.mark.parametrize("legacy", [False, True])
def test_sample_stream_hands_out_the_tokens_the_worker_streams(workers, legacy):
    worker = workers(reply=fixed_reply([5, 6, 7]), legacy=legacy)
    pool = HttpWorkerPool([worker.url], health_interval_s=0)
    assert isinstance(pool, StreamingSampler)

    pieces, result = asyncio.run(collect(pool))

    assert worker.requests[0]["stream"] is True
    assert pieces == [([t], [fake_logprob(t, i)]) for i, t in enumerate([5, 6, 7, 2])]
    assert result.completion_token_ids == [5, 6, 7, 2]
    assert result.logprobs == [fake_logprob(t, i) for i, t in enumerate([5, 6, 7, 2])]
    assert result.finish_reason == "stop"
    assert pool.status()[0].served == 1
    assert pool.status()[0].in_flight == 0


def test_an_error_status_before_the_stream_falls_back_to_a_retried_request(workers):
    worker = workers(reply=fixed_reply([5, 6]))
    worker.fail_next(503, count=2, retry_after=0)
    pool = HttpWorkerPool([worker.url], health_interval_s=0)

    pieces, result = asyncio.run(collect(pool))

    assert [r["stream"] for r in worker.requests] == [True, False, False]
    assert pieces == [([5, 6, 2], [fake_logprob(t, i) for i, t in enumerate([5, 6, 2])])]
    assert result.completion_token_ids == [5, 6, 2]


def test_a_stream_without_a_finish_reason_is_an_upstream_error(workers):
    worker = workers(reply=lambda prompt, max_tokens, stops: [])
    pool = HttpWorkerPool([worker.url], health_interval_s=0)
    with pytest.raises(UpstreamError, match="finish reason None"):
        asyncio.run(collect(pool))


def test_the_gateway_streams_worker_tokens_as_they_arrive(serve, client, workers, toy, store):
    text = "Tokens arrive one by one."
    worker = workers(reply=fixed_reply(toy.encode(text)), token_delay_s=0.03)
    gateway = serve(HttpWorkerPool([worker.url], health_interval_s=0))
    api = client(gateway, "stream")
    started = time.perf_counter()
    arrivals = [
        (time.perf_counter(), chunk)
        for chunk in api.chat.completions.create(
            model="policy", messages=HI, stream=True, stream_options={"include_usage": True}
        )
    ]
    ended = arrivals[-1][0]
    content = [(at, c.choices[0].delta.content) for at, c in arrivals if c.choices]
    first = next(at for at, piece in content if piece)
    assert first - started < 0.4 * (ended - started)
    assert "".join(piece or "" for _, piece in content) == text
    assert arrivals[-1][1].usage.completion_tokens == len(toy.encode(text)) + 1

    whole = client(gateway, "whole").chat.completions.create(model="policy", messages=HI)
    assert whole.choices[0].message.content == text
    [streamed] = store.session("stream")
    [served] = store.session("whole")
    assert streamed.prompt_token_ids == served.prompt_token_ids
    assert streamed.record.completion_token_ids == [*toy.encode(text), IM_END]
    assert streamed.record.completion_token_ids == served.record.completion_token_ids
    assert streamed.record.logprobs == served.record.logprobs
