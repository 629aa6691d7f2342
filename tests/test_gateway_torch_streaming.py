"""The gateway over the torch backend's in-process sampler streams chat completions token by
token: a tiny random Llama over SmolLM2's tokenizer and chat template, the ChatML renderer, and
the official ``openai`` client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from reference_stores import MemoryTraceStore
from rllm_core.gateway.server import Gateway

openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def served(tiny_smol_model_dir: Path) -> Iterator[tuple[Gateway, MemoryTraceStore, list[int]]]:
    """A gateway over a TorchSampler, the trace store, and the count of the model's forwards
    (each one slowed a little, so that decoding takes visibly longer than delivering)."""
    from rllm_renderer_chatml.plugin import ChatMLConfig
    from rllm_renderer_chatml.renderer import ChatMLRenderer
    from rllm_trainer_backend_torch.gate import WeightGate
    from rllm_trainer_backend_torch.sampler import TorchSampler
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_smol_model_dir).eval()
    forwards: list[int] = []

    def slow(module, args, kwargs):
        forwards.append(kwargs["input_ids"].shape[1])
        time.sleep(0.01)

    model.register_forward_pre_hook(slow, with_kwargs=True)
    renderer = ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(tiny_smol_model_dir)))
    sampler = TorchSampler(model, gate=WeightGate())
    store = MemoryTraceStore()
    try:
        with Gateway(renderer=renderer, sampler=sampler, trace_store=store) as gateway:
            yield gateway, store, forwards
    finally:
        sampler.close()


def test_a_chat_completion_streams_token_by_token_and_equals_the_whole_one(served) -> None:
    gateway, store, forwards = served
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    params = {"model": "policy", "messages": messages, "max_tokens": MAX_TOKENS, "seed": 5}
    streaming, plain = (
        openai.OpenAI(base_url=gateway.session_url(s), api_key=gateway.token, max_retries=0)
        for s in ("streamed", "whole")
    )
    forwards.clear()
    content: list[str] = []
    decoded_by_then: list[int] = []
    finish = None
    for chunk in streaming.chat.completions.create(**params, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        if choice.delta.content:
            content.append(choice.delta.content)
            decoded_by_then.append(len(forwards))
    whole = plain.chat.completions.create(**params)
    [streamed_trace] = store.session("streamed")
    [whole_trace] = store.session("whole")

    assert "".join(content) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert streamed_trace.record.completion_token_ids == whole_trace.record.completion_token_ids
    assert streamed_trace.record.logprobs == whole_trace.record.logprobs
    completion = len(whole_trace.record.completion_token_ids)
    assert completion > 4
    # Text reached the client while the model was still decoding, in several pieces.
    assert len(content) > 2
    assert decoded_by_then[0] < completion // 2
