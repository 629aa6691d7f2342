"""TorchSampler on SmolLM2-135M-Instruct: logprobs against a forward pass, greedy vs generate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from rllm_core.types import SampleRequest, SamplingParams
from rllm_trainer_backend_torch.gate import WeightGate
from rllm_trainer_backend_torch.sampler import TorchSampler
from transformers import AutoModelForCausalLM, AutoTokenizer

QUESTIONS = [
    "What is the capital of France?",
    "Write one sentence about the sea, then explain in two more sentences why tides happen.",
    "Hi",
]


@pytest.fixture(scope="module")
def smollm2(smollm2_model_dir: Path) -> Iterator[tuple[torch.nn.Module, object, TorchSampler]]:
    model = AutoModelForCausalLM.from_pretrained(smollm2_model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(smollm2_model_dir)
    sampler = TorchSampler(model, gate=WeightGate())
    yield model, tokenizer, sampler
    sampler.close()


def chat_prompt(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(text, add_special_tokens=False)


def test_logprobs_equal_a_fresh_forward_pass(smollm2) -> None:
    model, tokenizer, sampler = smollm2
    prompts = [chat_prompt(tokenizer, q) for q in QUESTIONS]
    assert len({len(p) for p in prompts}) == 3
    params = SamplingParams(max_tokens=24, temperature=0.7, top_p=0.9, seed=11)
    results = sampler.sample_many(
        [SampleRequest(prompt_token_ids=p, params=params) for p in prompts]
    )
    for prompt, result in zip(prompts, results, strict=True):
        completion = result.completion_token_ids
        assert len(completion) == 24 and result.finish_reason == "length"
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0]
        predicting = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]
        expected = torch.log_softmax(predicting / 0.7, -1).gather(
            1, torch.tensor(completion)[:, None]
        )
        assert result.logprobs == pytest.approx(expected.squeeze(1).tolist(), abs=1e-4)


def test_greedy_with_the_end_of_turn_stop_matches_generate(smollm2) -> None:
    model, tokenizer, sampler = smollm2
    prompt = chat_prompt(tokenizer, QUESTIONS[0])
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    params = SamplingParams(max_tokens=48, temperature=0.0, stop_token_ids=(end_of_turn,))
    result = sampler.sample_many([SampleRequest(prompt_token_ids=prompt, params=params)])[0]
    with torch.no_grad():
        generated = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=48,
            eos_token_id=end_of_turn,
            pad_token_id=end_of_turn,
        )[0, len(prompt) :].tolist()
    assert result.completion_token_ids == generated
    assert result.finish_reason == "stop"
    assert result.completion_token_ids[-1] == end_of_turn
    assert "Paris" in tokenizer.decode(result.completion_token_ids)
