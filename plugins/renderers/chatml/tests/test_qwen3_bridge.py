"""The bridge under both retention policies, over simulated multi-turn sampling."""

from __future__ import annotations

import pytest
from rllm_core.testing.conversations import corpus, simulate_rollout
from rllm_core.types import Message, ToolCall, ToolSpec
from rllm_renderer_chatml.plugin import Qwen3Config
from rllm_renderer_chatml.qwen3 import Qwen3Renderer

CASES = corpus(exclude=("parity_only",))
UNTHINKING = corpus(exclude=("parity_only", "reasoning", "raw_think"))
READ = ToolSpec(name="read_file", parameters={"type": "object"})
CALL_TEXT = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a"}}\n</tool_call>'


def _renderer(folder, **kwargs) -> Qwen3Renderer:
    return Qwen3Renderer.from_config(Qwen3Config(tokenizer=str(folder), **kwargs))


@pytest.fixture(scope="module")
def strip(qwen3_tokenizer_dir) -> Qwen3Renderer:
    return _renderer(qwen3_tokenizer_dir)


@pytest.fixture(scope="module")
def keep(qwen3_tokenizer_dir) -> Qwen3Renderer:
    return _renderer(qwen3_tokenizer_dir, keep_reasoning=True)


def _cuts(case, n):
    return {i: n for i, m in enumerate(case.messages) if m.role == "assistant"}


def _simulate(renderer, cases, cut=0):
    for case in cases:
        messages, tools = case.conversation
        for turn in simulate_rollout(renderer, messages, tools, truncate=_cuts(case, cut)):
            if turn.following:
                yield case, turn


# The turns whose reasoning is not empty and that tool results follow: the template keeps
# their think block, so these are the only places the strip policy can extend the prompt.
EXTENDS = {
    ("reasoning-with-tools", 1),
    ("reasoning-tools-then-query", 1),
    ("reasoning-multi-step-no-reasoning-middle", 1),
    ("reasoning-tool-response-as-user", 1),
}


@pytest.mark.parametrize("cut", [0, 1])
@pytest.mark.parametrize("thinking", [True, False])
def test_strip_policy_bridges_only_where_the_template_keeps_the_prefix(
    qwen3_tokenizer_dir, qwen25_tokenizer_dir, cut, thinking
):
    """Whatever the bridge returns is the template's own next prompt; it refuses otherwise."""
    for folder in (qwen3_tokenizer_dir, qwen25_tokenizer_dir):
        renderer = _renderer(folder, enable_thinking=thinking)
        bridged, refused = set(), 0
        for case, turn in _simulate(renderer, CASES if thinking else UNTHINKING, cut):
            if turn.bridged is None:
                refused += 1
            else:
                assert turn.bridged == turn.full, f"{case.id}: turn {turn.index}"
                bridged.add((case.id, turn.index))
        assert refused >= 50
        # With thinking off an empty think block closes every generation prompt and the
        # template drops it from every earlier turn: nothing can be bridged.
        assert bridged == (EXTENDS if thinking else set())


@pytest.mark.parametrize("cut", [0, 1])
def test_keep_policy_always_bridges_to_the_full_render(keep, cut):
    turns = 0
    for case, turn in _simulate(keep, CASES, cut):
        assert turn.bridged == turn.full, f"{case.id}: turn {turn.index}"
        turns += 1
    assert turns >= 100


# ---------------------------------------------------------------- the cases by hand


def _u(text: str) -> Message:
    return Message(role="user", content=text)


CALL = ToolCall(id="call_0", name="read_file", arguments='{"path": "a"}')
RESULT = [Message(role="tool", content="A", tool_call_id="call_0")]


def _turn(renderer: Qwen3Renderer, history: list[Message], sampled: str):
    prompt = renderer.render(history, [READ], add_generation_prompt=True).token_ids
    return prompt, [*renderer.encode(sampled), renderer.im_end]


def _full(renderer, history, sampled_message, new):
    return renderer.render([*history, sampled_message, *new], [READ], True).token_ids


def test_over_tool_results_after_reasoning_the_bridge_extends(strip):
    history = [_u("Read a.")]
    text = "<think>\nI need a.\n</think>\n\n" + CALL_TEXT
    prompt, completion = _turn(strip, history, text)
    bridged = strip.bridge_to_next_turn(prompt, completion, RESULT, [READ])
    said = Message(role="assistant", reasoning="I need a.", tool_calls=(CALL,))
    assert bridged == _full(strip, history, said, RESULT)
    assert strip.decode(bridged[len(prompt) + len(completion) :]) == (
        "\n<|im_start|>user\n<tool_response>\nA\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_over_tool_results_after_empty_reasoning_the_bridge_refuses(strip):
    """The template drops an empty think block from any turn that is not the last."""
    text = "<think>\n\n</think>\n\n" + CALL_TEXT
    prompt, completion = _turn(strip, [_u("Read a.")], text)
    assert strip.bridge_to_next_turn(prompt, completion, RESULT, [READ]) is None


def test_at_a_new_query_after_reasoning_the_bridge_refuses(strip, keep):
    prompt, completion = _turn(strip, [_u("2+2?")], "<think>\nadd\n</think>\n\n4")
    assert strip.bridge_to_next_turn(prompt, completion, [_u("3+3?")]) is None
    bridged = keep.bridge_to_next_turn(prompt, completion, [_u("3+3?")])
    assert bridged[: len(prompt) + len(completion)] == prompt + completion
    said = Message(role="assistant", content="4", reasoning="add")
    assert bridged == _full(keep, [_u("2+2?")], said, [_u("3+3?")])


def test_at_a_new_query_without_any_think_block_the_bridge_extends(strip):
    prompt, completion = _turn(strip, [_u("2+2?")], "4")
    bridged = strip.bridge_to_next_turn(prompt, completion, [_u("3+3?")])
    said = Message(role="assistant", content="4")
    assert bridged == _full(strip, [_u("2+2?")], said, [_u("3+3?")])


def test_a_think_block_since_the_last_query_makes_the_bridge_refuse(strip):
    """Turn 1 reasoned and called a tool (bridged), turn 2 answered without thinking: a new
    query drops turn 1's reasoning, so the prefix changes."""
    history = [_u("Read a.")]
    text = "<think>\nread it\n</think>\n\n" + CALL_TEXT
    prompt, completion = _turn(strip, history, text)
    second = strip.bridge_to_next_turn(prompt, completion, RESULT, [READ])
    answer = [*strip.encode("It says A."), strip.im_end]
    assert strip.bridge_to_next_turn(second, answer, [_u("Thanks")], [READ]) is None
    # a tool-response block sent as a user message is not a query: the bridge extends
    wrapped = [_u("<tool_response>\nB\n</tool_response>")]
    assert strip.bridge_to_next_turn(second, answer, wrapped, [READ]) is not None


def test_cut_inside_the_thinking(strip, keep):
    prompt, _ = _turn(strip, [_u("Read a.")], "")
    cut = strip.encode("<think>\nI need")
    assert strip.bridge_to_next_turn(prompt, cut, RESULT, [READ]) is None
    bridged = keep.bridge_to_next_turn(prompt, cut, RESULT, [READ])
    assert bridged[len(prompt) + len(cut)] == keep.im_end


def test_malformed_call_makes_the_strip_bridge_refuse(strip):
    bad_call = CALL_TEXT.replace("}}", "}")
    text = "<think>\nx\n</think>\n\n" + bad_call
    prompt, completion = _turn(strip, [_u("Read a.")], text)
    assert strip.parse_response(completion).tool_calls[0].status == "invalid_json"
    assert strip.bridge_to_next_turn(prompt, completion, RESULT, [READ]) is None
