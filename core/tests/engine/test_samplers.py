"""The test samplers behave like a real sampler on stop tokens, max_tokens and logprobs."""

from __future__ import annotations

import asyncio

import pytest
from reference.toy_renderer import END_OF_TEXT, IM_END, ToyChatRenderer
from rllm_core.ports import Sampler
from rllm_core.testing.samplers import (
    EchoSampler,
    ScriptedSampler,
    ScriptExhaustedError,
    scripted_logprob,
)
from rllm_core.types import SampleRequest, SamplingParams


def request(
    prompt: list[int], *, max_tokens: int = 256, stops: tuple[int, ...] = ()
) -> SampleRequest:
    return SampleRequest(
        prompt_token_ids=prompt,
        params=SamplingParams(max_tokens=max_tokens, stop_token_ids=stops),
    )


def test_scripted_logprob_values() -> None:
    # (token * 7 + position * 13) % 50 + 1, negated, over 64
    assert scripted_logprob(72, 0) == -5 / 64
    assert scripted_logprob(105, 1) == -49 / 64
    assert scripted_logprob(257, 2) == -26 / 64
    assert scripted_logprob(0, 0) == -1 / 64


def test_text_reply_is_encoded_with_the_stop_token_appended() -> None:
    sampler = ScriptedSampler(["Hi"], renderer=ToyChatRenderer(), weight_version=4)
    assert isinstance(sampler, Sampler)
    result = asyncio.run(sampler.sample(request([1, 2, 3])))
    assert result.completion_token_ids == [72, 105, IM_END]
    assert result.logprobs == [-5 / 64, -49 / 64, -26 / 64]
    assert result.finish_reason == "stop"
    assert result.weight_version == 4
    assert [r.prompt_token_ids for r in sampler.requests] == [[1, 2, 3]]
    assert sampler.calls == 1
    assert sampler.remaining == 0


def test_replies_are_used_in_order_and_exhaustion_is_an_error() -> None:
    sampler = ScriptedSampler([[5, 6], "x"], renderer=ToyChatRenderer())
    first = asyncio.run(sampler.sample(request([1], stops=(6,))))
    second = asyncio.run(sampler.sample(request([2])))
    assert first.completion_token_ids == [5, 6]
    assert first.finish_reason == "stop"
    assert second.completion_token_ids == [ord("x"), IM_END]
    with pytest.raises(ScriptExhaustedError, match="holds 2 replies"):
        asyncio.run(sampler.sample(request([3])))
    assert sampler.calls == 3


def test_completion_ends_at_the_first_stop_token() -> None:
    sampler = ScriptedSampler([[10, 11, 12, 13, 12]])
    result = asyncio.run(sampler.sample(request([1], stops=(12,))))
    assert result.completion_token_ids == [10, 11, 12]
    assert result.finish_reason == "stop"
    assert result.logprobs == [scripted_logprob(t, i) for i, t in enumerate([10, 11, 12])]


def test_renderer_stop_tokens_end_a_completion_even_when_the_request_omits_them() -> None:
    sampler = ScriptedSampler([[65, END_OF_TEXT, 66]], renderer=ToyChatRenderer())
    result = asyncio.run(sampler.sample(request([1])))
    assert result.completion_token_ids == [65, END_OF_TEXT]
    assert result.finish_reason == "stop"


def test_max_tokens_cuts_the_completion() -> None:
    sampler = ScriptedSampler(["Hello"], renderer=ToyChatRenderer())
    result = asyncio.run(sampler.sample(request([1], max_tokens=3)))
    assert result.completion_token_ids == [72, 101, 108]
    assert result.finish_reason == "length"


def test_a_stop_token_at_the_max_tokens_boundary_still_stops() -> None:
    sampler = ScriptedSampler(["ab"], renderer=ToyChatRenderer())
    result = asyncio.run(sampler.sample(request([1], max_tokens=3)))
    assert result.completion_token_ids == [97, 98, IM_END]
    assert result.finish_reason == "stop"


def test_ids_without_a_stop_token_report_length() -> None:
    sampler = ScriptedSampler([[7, 8]])
    result = asyncio.run(sampler.sample(request([1], stops=(9,))))
    assert result.completion_token_ids == [7, 8]
    assert result.finish_reason == "length"


def test_exception_replies_are_raised_after_recording_the_request() -> None:
    sampler = ScriptedSampler([ConnectionError("upstream down"), [1]])
    with pytest.raises(ConnectionError, match="upstream down"):
        asyncio.run(sampler.sample(request([4, 4])))
    assert [r.prompt_token_ids for r in sampler.requests] == [[4, 4]]
    assert asyncio.run(sampler.sample(request([5]))).completion_token_ids == [1]


def test_callable_scripts_sync_and_async_see_the_request() -> None:
    def sync(req: SampleRequest) -> list[int]:
        return [len(req.prompt_token_ids), 0]

    async def later(req: SampleRequest) -> list[int]:
        await asyncio.sleep(0)
        return [req.prompt_token_ids[-1], 0]

    assert ScriptedSampler(sync).remaining is None
    one = asyncio.run(ScriptedSampler(sync).sample(request([3, 3, 3], stops=(0,))))
    two = asyncio.run(ScriptedSampler(later).sample(request([3, 9], stops=(0,))))
    assert one.completion_token_ids == [3, 0]
    assert two.completion_token_ids == [9, 0]


def test_weight_version_can_be_changed_between_calls() -> None:
    sampler = ScriptedSampler([[1], [1]])
    assert asyncio.run(sampler.sample(request([1]))).weight_version == 0
    sampler.weight_version = 7
    assert sampler.weight_version == 7
    assert asyncio.run(sampler.sample(request([1]))).weight_version == 7


def test_text_reply_without_renderer_and_bad_scripts_are_rejected() -> None:
    with pytest.raises(TypeError, match="no renderer"):
        asyncio.run(ScriptedSampler(["hello"]).sample(request([1])))
    with pytest.raises(TypeError, match="only int token ids"):
        asyncio.run(ScriptedSampler([[1, "2"]]).sample(request([1])))
    with pytest.raises(TypeError, match="wrap a single reply"):
        ScriptedSampler("hello")


def test_echo_sampler_repeats_the_prompt_tail_without_stop_tokens() -> None:
    sampler = EchoSampler(echo=3, weight_version=2)
    assert isinstance(sampler, Sampler)
    result = asyncio.run(sampler.sample(request([1, 2, 9, 3, 4, 9], stops=(9, 8))))
    assert result.completion_token_ids == [2, 3, 4, 9]
    assert result.finish_reason == "stop"
    assert result.weight_version == 2
    short = asyncio.run(sampler.sample(request([5], max_tokens=2, stops=(9,))))
    assert short.completion_token_ids == [5, 9]
    cut = asyncio.run(sampler.sample(request([1, 2, 3], max_tokens=2, stops=(9,))))
    assert cut.completion_token_ids == [1, 2]
    assert cut.finish_reason == "length"
    assert sampler.calls == 3
    with pytest.raises(ValueError, match="echo must be >= 0"):
        EchoSampler(echo=-1)
