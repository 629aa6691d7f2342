"""The checked bridge over simulated multi-turn sampling, and what makes it refuse."""

from __future__ import annotations

import pytest
from rllm_core.testing.conversations import corpus, simulate_rollout
from rllm_core.types import Message, ToolSpec
from rllm_renderer_hf.plugin import HFConfig
from rllm_renderer_hf.renderer import HFRenderer

QWEN = corpus(exclude=("reasoning", "raw_think", "parity_only"))
SMOL = corpus(exclude=("tools", "tool_calls", "reasoning", "raw_think", "parity_only"))


@pytest.fixture(scope="module")
def qwen(qwen25_tokenizer_dir) -> HFRenderer:
    return HFRenderer(HFConfig(tokenizer=str(qwen25_tokenizer_dir)))


@pytest.fixture(scope="module")
def smol(smollm2_tokenizer_dir) -> HFRenderer:
    return HFRenderer(HFConfig(tokenizer=str(smollm2_tokenizer_dir)))


def _turns(renderer, cases, cut):
    for case in cases:
        messages, tools = case.conversation
        truncate = {i: cut for i, m in enumerate(messages) if m.role == "assistant"}
        for turn in simulate_rollout(renderer, messages, tools, truncate=truncate):
            if turn.following:
                yield case, turn


@pytest.mark.parametrize("cut", [0, 1])
def test_prefix_stable_templates_always_bridge(qwen, smol, cut):
    count = 0
    for renderer, cases in ((qwen, QWEN), (smol, SMOL)):
        for case, turn in _turns(renderer, cases, cut):
            assert turn.bridged == turn.full, f"{case.id}: turn {turn.index}"
            count += 1
    assert count >= 100


def test_cut_inside_content_bridges_only_to_the_full_render(qwen, smol):
    outcomes = {"bridged": 0, "refused": 0}
    for renderer, cases in ((qwen, QWEN), (smol, SMOL)):
        for case, turn in _turns(renderer, cases, 3):
            if turn.bridged is None:
                outcomes["refused"] += 1
            else:
                assert turn.bridged == turn.full, f"{case.id}: turn {turn.index}"
                outcomes["bridged"] += 1
    assert outcomes["bridged"] >= 50 and outcomes["refused"] >= 1


def test_a_template_that_drops_reasoning(qwen3_tokenizer_dir):
    """Through Qwen3's template the checked bridge extends exactly where the qwen3 renderer's
    strip policy does: after a turn with reasoning, over tool results."""
    renderer = HFRenderer(HFConfig(tokenizer=str(qwen3_tokenizer_dir), tool_arguments="string"))
    bridged = set()
    for case, turn in _turns(renderer, corpus(exclude=("parity_only",)), 0):
        if turn.bridged is not None:
            assert turn.bridged == turn.full, f"{case.id}: turn {turn.index}"
            bridged.add((case.id, turn.index))
    assert bridged == {
        ("reasoning-with-tools", 1),
        ("reasoning-tools-then-query", 1),
        ("reasoning-multi-step-no-reasoning-middle", 1),
        ("reasoning-tool-response-as-user", 1),
    }


def _u(text: str) -> Message:
    return Message(role="user", content=text)


def test_what_makes_it_refuse(qwen25_tokenizer_dir):
    renderer = HFRenderer(HFConfig(tokenizer=str(qwen25_tokenizer_dir), history_size=2))
    prompt = renderer.render([_u("Hi")], add_generation_prompt=True).token_ids
    done = [*renderer.encode("Hello"), renderer.stop_token_ids()[0]]
    assert renderer.bridge_to_next_turn(prompt, done, [_u("again")]) is not None
    # a prompt it never returned
    assert renderer.bridge_to_next_turn(prompt[:-1], done, [_u("again")]) is None
    # other tools than the prompt was rendered with
    assert renderer.bridge_to_next_turn(prompt, done, [_u("again")], [ToolSpec(name="f")]) is None
    # stopped on <|endoftext|>: the template closes turns with <|im_end|>
    eot = [*renderer.encode("Hello"), 151643]
    assert renderer.bridge_to_next_turn(prompt, eot, [_u("again")]) is None
    # a malformed tool call cannot be rendered again
    bad = renderer.encode('<tool_call>\n{"name": "f", "arguments": {\n</tool_call>') + done[-1:]
    assert renderer.bridge_to_next_turn(prompt, bad, [_u("again")]) is None
    # forgotten once history_size newer prompts were remembered
    for text in ("a", "b"):
        renderer.render([_u(text)], add_generation_prompt=True)
    assert renderer.bridge_to_next_turn(prompt, done, [_u("again")]) is None


def test_bridged_prompts_chain(qwen):
    prompt = qwen.render([_u("1")], add_generation_prompt=True).token_ids
    for n in range(2, 5):
        completion = [*qwen.encode(f"ok {n}"), qwen.stop_token_ids()[0]]
        nxt = qwen.bridge_to_next_turn(prompt, completion, [_u(str(n))])
        assert nxt[: len(prompt) + len(completion)] == prompt + completion
        prompt = nxt
    history = []
    for n in range(1, 5):
        history.append(_u(str(n)))
        if n < 4:
            history.append(Message(role="assistant", content=f"ok {n + 1}"))
    assert prompt == qwen.render(history, add_generation_prompt=True).token_ids
