"""``bridge_to_next_turn`` over simulated multi-turn sampling, and its refusals."""

from __future__ import annotations

import pytest
from rllm_core.testing.conversations import corpus, simulate_rollout
from rllm_core.types import Message
from rllm_renderer_chatml.plugin import ChatMLConfig
from rllm_renderer_chatml.renderer import ChatMLRenderer

QWEN_CASES = corpus(exclude=("reasoning", "raw_think", "parity_only"))
SMOL_CASES = corpus(exclude=("tools", "tool_calls", "reasoning", "raw_think", "parity_only"))


@pytest.fixture(scope="module")
def qwen(qwen25_tokenizer_dir) -> ChatMLRenderer:
    return ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(qwen25_tokenizer_dir)))


@pytest.fixture(scope="module")
def smol(smollm2_tokenizer_dir) -> ChatMLRenderer:
    return ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(smollm2_tokenizer_dir)))


def _renderers(qwen, smol):
    return [(qwen, QWEN_CASES), (smol, SMOL_CASES)]


def test_bridged_prompts_equal_full_renders(qwen, smol):
    bridged = 0
    for renderer, cases in _renderers(qwen, smol):
        for case in cases:
            messages, tools = case.conversation
            for turn in simulate_rollout(renderer, messages, tools):
                if not turn.following:
                    continue
                assert turn.bridged == turn.full, f"{case.id}: turn {turn.index}"
                bridged += 1
    assert bridged >= 100


def test_bridge_after_a_completion_cut_before_its_close(qwen, smol):
    checked = 0
    for renderer, cases in _renderers(qwen, smol):
        for case in cases:
            messages, tools = case.conversation
            cut = {i: 1 for i, m in enumerate(messages) if m.role == "assistant"}
            for turn in simulate_rollout(renderer, messages, tools, truncate=cut):
                if not turn.following:
                    continue
                assert turn.truncated
                assert turn.bridged == turn.full, f"{case.id}: turn {turn.index}"
                assert turn.bridged[len(turn.prompt) + len(turn.completion)] == renderer.im_end
                checked += 1
    assert checked >= 100


def test_bridge_after_a_completion_cut_inside_its_content(qwen, smol):
    """Cut one turn three tokens before its close: the bridge keeps exactly the sampled tokens.
    The full render re-tokenizes the parsed text, so the two agree exactly when the cut text
    re-tokenizes to the same ids; they always share the prompt and the appended delta."""
    same = differ = 0
    for renderer, cases in _renderers(qwen, smol):
        for case in cases:
            messages, tools = case.conversation
            for k, m in enumerate(messages):
                if m.role != "assistant":
                    continue
                turns = simulate_rollout(renderer, messages, tools, truncate={k: 3})
                (turn,) = [t for t in turns if t.index == k]
                if not turn.following:
                    continue
                prefix = len(turn.prompt) + len(turn.completion)
                delta = turn.bridged[prefix:]
                assert delta[0] == renderer.im_end
                assert turn.full[: len(turn.prompt)] == turn.prompt
                assert turn.full[len(turn.full) - len(delta) :] == delta, case.id
                rerendered = turn.full[len(turn.prompt) : len(turn.full) - len(delta)]
                assert (turn.bridged == turn.full) == (rerendered == turn.completion)
                if rerendered == turn.completion:
                    same += 1
                else:
                    differ += 1
    assert same >= 50 and differ >= 1


def _prompt(renderer: ChatMLRenderer, text: str) -> list[int]:
    return renderer.render(
        [Message(role="user", content=text)], add_generation_prompt=True
    ).token_ids


def test_exact_deltas(qwen):
    prompt = _prompt(qwen, "Read a and b.")
    completion = [*qwen.encode("Reading."), qwen.im_end]
    tools = [
        Message(role="tool", content="A", tool_call_id="1"),
        Message(role="tool", content="B", tool_call_id="2"),
    ]
    bridged = qwen.bridge_to_next_turn(prompt, completion, tools)
    assert bridged[: len(prompt) + len(completion)] == prompt + completion
    assert qwen.decode(bridged[len(prompt) + len(completion) :]) == (
        "\n<|im_start|>user\n<tool_response>\nA\n</tool_response>\n<tool_response>\nB\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    cut = qwen.encode("Readi")
    bridged = qwen.bridge_to_next_turn(prompt, cut, [Message(role="system", content="Hurry.")])
    assert qwen.decode(bridged[len(prompt) + len(cut) :]) == (
        "<|im_end|>\n<|im_start|>system\nHurry.<|im_end|>\n<|im_start|>assistant\n"
    )
    trailing = completion + qwen.encode("more")
    bridged = qwen.bridge_to_next_turn(prompt, trailing, [Message(role="user", content="ok")])
    assert bridged[: len(prompt) + len(trailing)] == prompt + trailing
    assert qwen.decode(bridged[len(prompt) + len(trailing) :]) == (
        "\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n"
    )


def test_refusals(qwen):
    prompt = _prompt(qwen, "Hi")
    user = [Message(role="user", content="again")]
    done = [*qwen.encode("Hello"), qwen.im_end]
    assert qwen.bridge_to_next_turn(prompt, done, user) is not None
    # stopped on <|endoftext|> without closing the turn: no template writes that
    assert qwen.bridge_to_next_turn(prompt, [*qwen.encode("Hello"), qwen.end_of_text], user) is None
    # the prompt did not open an assistant turn
    assert qwen.bridge_to_next_turn(prompt[:-1], done, user) is None
    assert qwen.bridge_to_next_turn([], done, user) is None
    assert (
        qwen.bridge_to_next_turn(prompt, done, [*user, Message(role="assistant", content="x")])
        is None
    )
