"""``HttpWorkerPool`` against real local HTTP workers (fake vLLM servers): the exchange, retries
honouring ``Retry-After`` within the retry budget, dead workers, health checks, stickiness and
least-loaded routing."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
from rllm_core.errors import UpstreamError, UpstreamRejectedError, UpstreamUnavailableError
from rllm_core.kit.retry import RetrySettings
from rllm_core.ports import Sampler, WorkerPool
from rllm_core.routing import routed
from rllm_core.testing.fakeworker import FakeWorker, fake_logprob
from rllm_core.types import SampleRequest, SampleResult, SamplingParams
from rllm_sampler_vllm.pool import HttpWorkerPool, parse_retry_after

PROMPT = [101, 7, 8, 9, 10]
PARAMS = SamplingParams(max_tokens=32, temperature=0.6, top_p=0.9, stop_token_ids=(2,), seed=11)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(coro):
    return asyncio.run(coro)


async def sample_with(pool: HttpWorkerPool, key: str | None = None, prompt=PROMPT, params=PARAMS):
    request = SampleRequest(prompt_token_ids=list(prompt), params=params, request_id="r-1")
    if key is None:
        return await pool.sample(request)
    with routed(key):
        return await pool.sample(request)


def test_the_request_is_the_vllm_token_id_completion_and_the_answer_is_read_back(workers):
    worker = workers(reply=lambda prompt, max_tokens, stops: [5, 6, 2])

    async def main():
        pool = HttpWorkerPool([worker.url], model="served-name", api_key="k", weight_version=4)
        try:
            return await sample_with(pool)
        finally:
            await pool.aclose()

    result = run(main())
    assert worker.requests == [
        {
            "prompt": PROMPT,
            "max_tokens": 32,
            "temperature": 0.6,
            "top_p": 0.9,
            "top_k": -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "stop_token_ids": [2],
            "n": 1,
            "stream": False,
            "logprobs": 0,
            "return_token_ids": False,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "seed": 11,
            "model": "served-name",
        }
    ]
    assert result.completion_token_ids == [5, 6, 2]
    assert result.logprobs == [fake_logprob(5, 0), fake_logprob(6, 1), fake_logprob(2, 2)]
    assert result.finish_reason == "stop"
    assert result.weight_version == 4


def test_ids_are_read_from_token_id_strings_when_token_ids_are_absent(workers):
    worker = workers(legacy=True, reply=lambda prompt, max_tokens, stops: [40, 41, 42])

    async def main():
        pool = HttpWorkerPool([worker.url])
        try:
            return await sample_with(pool)
        finally:
            await pool.aclose()

    result = run(main())
    assert result.completion_token_ids == [40, 41, 42]
    assert result.finish_reason == "length"


def test_a_429_with_retry_after_is_retried_after_that_delay(workers):
    worker = workers()
    worker.fail_next(429, retry_after=0.4, message="queue full")

    async def main():
        pool = HttpWorkerPool([worker.url], health_interval_s=0)
        started = time.perf_counter()
        try:
            result = await sample_with(pool)
        finally:
            await pool.aclose()
        return result, time.perf_counter() - started

    result, elapsed = run(main())
    assert result.finish_reason == "stop"
    assert len(worker.requests) == 2
    assert 0.4 <= elapsed < 2.0


def test_5xx_answers_are_retried_with_backoff_until_retries_run_out(workers):
    worker = workers()
    worker.fail_next(503, count=3, message="engine restarting")

    async def main():
        retry = RetrySettings(retries=2, retry_backoff_s=0.01)
        pool = HttpWorkerPool([worker.url], retry=retry, health_interval_s=0)
        try:
            with pytest.raises(UpstreamError) as failure:
                await sample_with(pool)
        finally:
            await pool.aclose()
        return str(failure.value)

    message = run(main())
    assert len(worker.requests) == 3
    assert message.startswith("gave up after 3 attempt(s)")
    assert "(retries=2, retry_budget_s=60.0)" in message
    assert f"{worker.url}: HTTP 503: engine restarting" in message


def test_the_retry_budget_bounds_retries_that_would_go_on(workers):
    worker = workers()
    worker.fail_next(503, count=1000, message="overloaded")

    async def main():
        retry = RetrySettings(retries=1000, retry_backoff_s=0.05, retry_backoff_max_s=0.05)
        pool = HttpWorkerPool([worker.url], retry=retry, retry_budget_s=0.4, health_interval_s=0)
        started = time.perf_counter()
        try:
            with pytest.raises(UpstreamError, match=r"^gave up after \d+ attempt\(s\)") as failure:
                await sample_with(pool)
        finally:
            await pool.aclose()
        return str(failure.value), time.perf_counter() - started

    message, elapsed = run(main())
    assert elapsed < 1.5
    assert 2 <= len(worker.requests) < 1000
    assert "retry_budget_s=0.4, next wait" in message


def test_the_retry_budget_counts_from_the_first_failure_not_the_request_start(workers):
    # The generation runs 0.6 s before failing, past the 0.3 s budget: it is still retried.
    worker = workers()
    worker.fail_next(503, after_s=0.6, message="engine crashed mid-generation")

    async def main():
        retry = RetrySettings(retries=3, retry_backoff_s=0.01, retry_backoff_max_s=0.01)
        pool = HttpWorkerPool([worker.url], retry=retry, retry_budget_s=0.3, health_interval_s=0)
        try:
            return await sample_with(pool)
        finally:
            await pool.aclose()

    assert run(main()).finish_reason == "stop"
    assert len(worker.requests) == 2


def test_a_retry_after_beyond_the_budget_gives_up_at_once(workers):
    worker = workers()
    worker.fail_next(429, retry_after=30, message="come back later")

    async def main():
        pool = HttpWorkerPool([worker.url], retry_budget_s=2.0, health_interval_s=0)
        started = time.perf_counter()
        try:
            with pytest.raises(UpstreamError, match=r"next wait 30\.0s"):
                await sample_with(pool)
        finally:
            await pool.aclose()
        return time.perf_counter() - started

    assert run(main()) < 1.0
    assert len(worker.requests) == 1


def test_a_4xx_is_not_retried(workers):
    worker = workers()
    worker.fail_next(400, message="This model's maximum context length is 2048 tokens")

    async def main():
        pool = HttpWorkerPool([worker.url])
        try:
            with pytest.raises(UpstreamRejectedError) as rejected:
                await sample_with(pool)
        finally:
            await pool.aclose()
        return rejected.value

    rejected = run(main())
    assert rejected.status == 400
    assert rejected.detail == "This model's maximum context length is 2048 tokens"
    assert len(worker.requests) == 1


def test_a_dead_worker_is_skipped_and_its_sessions_move(workers):
    live = workers()
    dead_url = f"http://127.0.0.1:{free_port()}"

    async def main():
        pool = HttpWorkerPool([dead_url, live.url], health_interval_s=0)
        try:
            results = [await sample_with(pool, key=f"s{n}") for n in range(4)]
            return results, pool.status()
        finally:
            await pool.aclose()

    results, status = run(main())
    assert [r.finish_reason for r in results] == ["stop"] * 4
    assert live.served == 4
    assert status[0].healthy is False
    assert "could not connect" in status[0].last_error
    assert (status[1].healthy, status[1].sessions, status[1].served) == (True, 4, 4)


def test_every_worker_down_is_a_clear_error_within_the_budget():
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]

    async def main():
        pool = HttpWorkerPool(
            urls,
            retry=RetrySettings(retry_backoff_s=0.05),
            retry_budget_s=0.5,
            health_interval_s=0.1,
        )
        started = time.perf_counter()
        try:
            with pytest.raises(UpstreamUnavailableError) as down:
                await sample_with(pool)
        finally:
            await pool.aclose()
        return str(down.value), time.perf_counter() - started

    message, elapsed = run(main())
    assert message.startswith("no upstream worker is reachable after")
    for url in urls:
        assert f"{url} (could not connect to {url}" in message
    assert message.endswith("fix the sampler's urls (--upstream of gateway serve)")
    assert elapsed < 2.0


def test_a_worker_that_comes_back_is_used_again(workers):
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    async def main():
        pool = HttpWorkerPool([url], retry_budget_s=10.0, health_interval_s=0.1)
        try:
            await pool.start()
            assert [w.healthy for w in pool.status()] == [False]
            asyncio.get_running_loop().call_later(0.3, lambda: workers(port=port))
            result = await sample_with(pool)
            return result, pool.status()
        finally:
            await pool.aclose()

    result, status = run(main())
    assert result.finish_reason == "stop"
    assert status[0].healthy is True


def test_health_checks_mark_an_unhealthy_worker_down_and_back_up(workers):
    worker = workers()

    async def main():
        pool = HttpWorkerPool([worker.url], health_interval_s=0)
        try:
            worker.healthy = False
            await pool.check_health()
            down = pool.status()[0]
            worker.healthy = True
            await pool.check_health()
            return down, pool.status()[0]
        finally:
            await pool.aclose()

    down, up = run(main())
    assert (down.healthy, down.last_error) == (False, "health check answered HTTP 503")
    assert up.healthy is True


def test_sessions_stick_to_their_worker_and_spread_evenly(workers):
    first, second = workers(), workers()

    async def main():
        pool = HttpWorkerPool([first.url, second.url], health_interval_s=0)
        try:
            for _ in range(3):
                for n in range(8):
                    await sample_with(pool, key=f"session-{n}", prompt=[n, 100])
            return pool.status()
        finally:
            await pool.aclose()

    status = run(main())
    assert [w.sessions for w in status] == [4, 4]
    by_session: dict[int, set[str]] = {}
    for worker in (first, second):
        for request in worker.requests:
            by_session.setdefault(request["prompt"][0], set()).add(worker.url)
    assert all(len(urls) == 1 for urls in by_session.values())
    assert len(by_session) == 8


def test_new_sessions_go_to_the_least_loaded_worker(workers):
    slow, fast = workers(delay_s=0.3), workers()

    async def main():
        pool = HttpWorkerPool([slow.url, fast.url], health_interval_s=0)
        try:
            busy = asyncio.create_task(sample_with(pool, key="long"))
            await asyncio.sleep(0.05)
            # "long" is in flight on the first worker, so new sessions pick the second.
            for n in range(3):
                await sample_with(pool, key=f"short-{n}")
            await busy
            return pool.status()
        finally:
            await pool.aclose()

    status = run(main())
    assert slow.served == 1
    assert fast.served == 3
    assert [w.sessions for w in status] == [1, 3]


def test_weight_version_follows_the_workers_when_they_report_it(workers):
    worker = workers()
    original = worker.answer

    def with_version(ids, body, prompt_tokens):
        payload = original(ids, body, prompt_tokens)
        return payload[:-1] + b',"weight_version":9}'

    worker.answer = with_version

    async def main():
        pool = HttpWorkerPool([worker.url], weight_version=3)
        try:
            result = await sample_with(pool)
            return result.weight_version, pool.weight_version
        finally:
            await pool.aclose()

    assert run(main()) == (9, 9)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("2", 2.0),
        ("0.5", 0.5),
        ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0),
        ("soon", None),
        (None, None),
    ],
)
def test_retry_after_accepts_seconds_and_http_dates(header, seconds):
    now = 1445412480.0  # 2015-10-21 07:28:00 UTC
    assert parse_retry_after(header, now=now) == seconds


def test_bad_worker_urls_are_refused_up_front():
    with pytest.raises(ValueError, match="worker URL 'localhost:8000' is invalid"):
        HttpWorkerPool(["localhost:8000"])
    with pytest.raises(ValueError, match="at least one worker"):
        HttpWorkerPool([])


def test_the_pool_is_a_sampler_and_a_worker_pool():
    pool = HttpWorkerPool(["http://127.0.0.1:1"])
    assert isinstance(pool, Sampler)
    assert isinstance(pool, WorkerPool)


def test_fake_worker_is_usable_as_a_context_manager():
    with FakeWorker() as worker:
        url = worker.url

    async def main():
        retry = RetrySettings(retry_backoff_s=0.05)
        pool = HttpWorkerPool([url], retry=retry, retry_budget_s=0.2, health_interval_s=0)
        try:
            with pytest.raises(UpstreamUnavailableError):
                await sample_with(pool)
        finally:
            await pool.aclose()

    run(main())


class _FailsMidStream(FakeWorker):
    """Streams one token, then the ``{"error": ...}`` event and ``[DONE]`` vLLM sends when a
    stream fails after it started."""

    async def _stream(self, ids, body, send):
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        token = ids[0]
        choice = {
            "index": 0,
            "text": "",
            "logprobs": {
                "token_logprobs": [fake_logprob(token, 0)],
                "tokens": [f"token_id:{token}"],
            },
            "finish_reason": None,
            "token_ids": [token],
        }
        error = {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}
        for event in ({"id": "cmpl-fake", "choices": [choice]}, {"error": error}):
            data = b"data: " + json.dumps(event).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def test_an_error_event_mid_stream_is_an_upstream_error_carrying_its_message():
    request = SampleRequest(prompt_token_ids=list(PROMPT), params=PARAMS)

    async def main(url):
        pool = HttpWorkerPool([url], health_interval_s=0)
        pieces = []
        try:
            with pytest.raises(UpstreamError) as caught:
                async for item in pool.sample_stream(request):
                    assert not isinstance(item, SampleResult)
                    pieces.append(item)
        finally:
            await pool.aclose()
        return pieces, str(caught.value)

    with _FailsMidStream(reply=lambda prompt, max_tokens, stops: [5, 6, 2]) as worker:
        pieces, message = run(main(worker.url))
    assert pieces == [([5], [fake_logprob(5, 0)])]
    assert message == f"worker {worker.url} reported an error mid-stream: boom"
    assert len(worker.requests) == 1, "a stream that handed out tokens is not sent again"
    neutral = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
    neutral |= {"presence_penalty": 0.0, "frequency_penalty": 0.0, "stream": True}
    assert neutral.items() <= worker.requests[0].items()
