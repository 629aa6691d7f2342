"""The single-turn harness against the real gateway: the request it sends, the answer it
returns, and every way the call can end."""

from __future__ import annotations

import asyncio
import socket

import pydantic
import pytest
from rllm_core.types import LLMEndpoint, SamplingParams, Task, Termination
from rllm_harness_single_turn.harness import SingleTurnHarness
from rllm_harness_single_turn.plugin import SingleTurnConfig

TASK = Task(task_id="add-1", instruction="What is 2+2?")


def run(harness: SingleTurnHarness, endpoint: LLMEndpoint, task: Task = TASK):
    return asyncio.run(harness.run(task, endpoint, None))


def harness(**keys) -> SingleTurnHarness:
    keys.setdefault("max_retries", 0)
    keys.setdefault("request_timeout_s", 30.0)
    return SingleTurnHarness(SingleTurnConfig(**keys))


def test_the_reply_is_the_answer_and_one_trace_is_recorded(gateway, toy, store):
    server, sampler = gateway(["4"])
    outcome = run(harness(), server.endpoint("s1"))

    assert outcome.termination is Termination.DONE
    assert outcome.answer == "4"
    assert outcome.turns == 1
    assert outcome.metadata == {"finish_reason": "stop"}
    assert toy.decode(sampler.requests[0].prompt_token_ids) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    [trace] = store.session("s1")
    assert trace.record.completion_token_ids == [*toy.encode("4"), 257]


def test_system_prompt_and_user_template_shape_the_request(gateway, toy):
    server, sampler = gateway(["4"])
    single = harness(system_prompt="Be brief.", user_template="[{task_id}] Q: {instruction}")
    run(single, server.endpoint("s1"))

    assert toy.decode(sampler.requests[0].prompt_token_ids) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n[add-1] Q: What is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_max_tokens_is_sent_only_when_configured(gateway):
    server, sampler = gateway(["4", "4"])
    run(harness(max_tokens=7), server.endpoint("a"))
    run(harness(), server.endpoint("b"))

    assert sampler.requests[0].params.max_tokens == 7
    assert sampler.requests[1].params.max_tokens == SamplingParams().max_tokens


def test_a_truncated_reply_is_still_the_answer_with_its_finish_reason(gateway, toy):
    server, _ = gateway([toy.encode("12345")])
    outcome = run(harness(max_tokens=3), server.endpoint("s"))
    assert (outcome.termination, outcome.answer) == (Termination.DONE, "123")
    assert outcome.metadata == {"finish_reason": "length"}


@pytest.mark.parametrize("reply", ["", "  \n "])
def test_an_empty_reply_is_a_model_error(gateway, reply):
    server, _ = gateway([reply])
    outcome = run(harness(), server.endpoint("s"))
    assert outcome.termination is Termination.MODEL_ERROR
    assert (outcome.answer, outcome.turns) == ("", 1)
    assert outcome.metadata["error"] == "the model's reply is empty"


def test_a_prompt_over_the_gateway_limit_is_context_length(gateway):
    server, sampler = gateway(["never sent"], max_prompt_tokens=10)
    outcome = run(harness(), server.endpoint("s"))

    assert outcome.termination is Termination.CONTEXT_LENGTH
    assert outcome.turns == 0
    assert outcome.metadata["status"] == 400
    assert outcome.metadata["code"] == "prompt_too_long"
    assert sampler.calls == 0


def test_a_413_that_is_not_about_context_is_a_model_error(gateway):
    server, _ = gateway(["never sent"], max_body_bytes=64)
    outcome = run(harness(), server.endpoint("s"))

    assert outcome.termination is Termination.MODEL_ERROR
    assert (outcome.metadata["status"], outcome.metadata["code"]) == (413, "body_too_large")


def test_a_failing_model_server_is_a_model_error(gateway):
    server, _ = gateway([RuntimeError("engine crashed")])
    outcome = run(harness(), server.endpoint("s"))

    assert outcome.termination is Termination.MODEL_ERROR
    assert outcome.metadata["status"] == 500
    assert outcome.metadata["error_type"] == "InternalServerError"


def test_an_unreachable_endpoint_is_a_model_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = LLMEndpoint(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", model="policy")

    outcome = run(harness(), endpoint)

    assert outcome.termination is Termination.MODEL_ERROR
    assert outcome.metadata["error_type"] == "APIConnectionError"


def test_a_wrong_api_key_is_a_model_error_naming_the_status(gateway):
    server, _ = gateway(["4"])
    endpoint = LLMEndpoint(base_url=server.session_url("s"), api_key="wrong", model="policy")
    outcome = run(harness(), endpoint)
    assert outcome.termination is Termination.MODEL_ERROR
    assert (outcome.metadata["status"], outcome.metadata["code"]) == (401, "invalid_api_key")


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{question}", "user_template uses the placeholder {question}, which is not one of"),
        ("{instruction", "user_template is not a valid template"),
    ],
)
def test_a_bad_user_template_is_refused_with_the_key_named(template, message):
    with pytest.raises(pydantic.ValidationError, match=message.replace("{", r"\{")):
        SingleTurnConfig(user_template=template)


def test_literal_braces_in_the_template_are_kept(gateway, toy):
    server, sampler = gateway(["ok"])
    run(harness(user_template='{instruction} Answer as {{"answer": ...}}'), server.endpoint("s"))
    assert 'What is 2+2? Answer as {"answer": ...}' in toy.decode(
        sampler.requests[0].prompt_token_ids
    )
