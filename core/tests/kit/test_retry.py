"""Retries with jittered exponential backoff, bounded, and pacing, on a fake clock."""

from __future__ import annotations

import asyncio
import random

import pytest
from rllm_core.kit.retry import Pacer, RetrySettings, retry_async, retry_sync


class Flaky:
    """Fails ``failures`` times with ``error``, then returns ``"ok"``."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def transient(error: BaseException) -> bool:
    return isinstance(error, ConnectionError)


def test_transient_errors_are_retried_with_jittered_growing_waits():
    random.seed(0)
    waits: list[float] = []
    seen: list[tuple[int, str, float]] = []
    call = Flaky(3, ConnectionError("reset"))
    settings = RetrySettings(retries=5, retry_backoff_s=1.0, retry_backoff_max_s=3.0)
    result = retry_sync(
        call,
        settings,
        transient=transient,
        what="the call",
        on_retry=lambda n, e, d: seen.append((n, str(e), d)),
        sleep=waits.append,
    )
    assert result == "ok" and call.calls == 4
    assert [n for n, _, _ in seen] == [1, 2, 3] and [d for *_, d in seen] == waits
    caps = [1.0, 2.0, 3.0]
    assert all(0.0 <= wait <= cap for wait, cap in zip(waits, caps, strict=True))
    assert len(set(waits)) == 3, "jitter draws a different wait each time"


def test_the_last_error_is_raised_after_the_bound():
    call = Flaky(10, ConnectionError("down"))
    with pytest.raises(ConnectionError, match="down"):
        retry_sync(
            call,
            RetrySettings(retries=2),
            transient=transient,
            what="x",
            sleep=lambda s: None,
        )
    assert call.calls == 3


def test_other_errors_are_raised_at_once():
    call = Flaky(1, ValueError("bad request"))
    with pytest.raises(ValueError):
        retry_sync(call, RetrySettings(), transient=transient, what="x", sleep=lambda s: None)
    assert call.calls == 1


def test_a_hint_replaces_the_drawn_wait():
    waits: list[float] = []
    retry_sync(
        Flaky(2, ConnectionError("429")),
        RetrySettings(retries=3, retry_backoff_s=100.0),
        transient=transient,
        what="x",
        hint=lambda e: 0.25,
        sleep=waits.append,
    )
    assert waits == [0.25, 0.25]


def test_async_retries_await_the_given_sleep():
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    flaky = Flaky(1, ConnectionError("reset"))

    async def call() -> str:
        return flaky()

    result = asyncio.run(
        retry_async(call, RetrySettings(retries=1), transient=transient, what="x", sleep=sleep)
    )
    assert result == "ok" and len(waits) == 1


def test_async_retries_await_what_a_lambda_returns():
    flaky = Flaky(1, ConnectionError("reset"))

    async def call(tag: str) -> str:
        return tag + flaky()

    async def no_sleep(seconds: float) -> None:
        pass

    result = asyncio.run(
        retry_async(
            lambda: call("got "), RetrySettings(), transient=transient, what="x", sleep=no_sleep
        )
    )
    assert result == "got ok" and flaky.calls == 2


def test_async_first_failure_counts_as_the_first_attempt():
    seen: list[int] = []
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    def run(failures: int, error: BaseException, retries: int) -> Flaky:
        flaky = Flaky(failures, error)

        async def call() -> str:
            return flaky()

        asyncio.run(
            retry_async(
                call,
                RetrySettings(retries=retries),
                transient=transient,
                what="x",
                on_retry=lambda n, e, d: seen.append(n),
                sleep=sleep,
            )
        )
        return flaky

    assert run(2, ConnectionError("reset"), 2).calls == 3 and seen == [1, 2] and len(waits) == 2
    with pytest.raises(ConnectionError):
        run(1, ConnectionError("reset"), 0)
    with pytest.raises(ConnectionError):
        run(5, ConnectionError("reset"), 1)
    with pytest.raises(ValueError):
        run(1, ValueError("bad"), 3)
    assert seen == [1, 2, 1] and len(waits) == 3


def test_pacer_spaces_concurrent_callers_in_order():
    now = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    pacer = Pacer(2.0, clock=lambda: now[0], sleep=sleep)

    async def three() -> None:
        await asyncio.gather(pacer.wait(), pacer.wait(), pacer.wait())

    asyncio.run(three())
    assert slept == [2.0, 4.0]
