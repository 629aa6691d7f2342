"""The renderer conformance suite passes a correct renderer and catches broken ones."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from rllm_core.testing.suites.renderers import (
    Conversation,
    RendererConformance,
    check_bridge_contract,
    default_conversations,
    sampled_span,
)
from rllm_core.types import Message, ParsedResponse, RenderedTokens, ToolCall, ToolSpec

sys.path.insert(0, str(Path(__file__).parent))

from reference.toy_renderer import (
    END_OF_TEXT,
    IM_END,
    IM_START,
    TOOL_CALL,
    ToyChatRenderer,
    reference_chat_template,
)


class TestToyRenderer(RendererConformance):
    @pytest.fixture
    def renderer(self) -> ToyChatRenderer:
        return ToyChatRenderer()

    @pytest.fixture
    def reference_render(self) -> Callable[..., list[int]]:
        return reference_chat_template


class TestToyRendererWithReasoning(TestToyRenderer):
    """The suite also round-trips reasoning when a plugin's cases carry it."""

    @pytest.fixture
    def conversations(self) -> list[Conversation]:
        call = ToolCall(id="c1", name="read_file", arguments='{"path": "x"}')
        return [
            (
                [
                    Message(role="user", content="Think, then answer."),
                    Message(role="assistant", content="Yes.", reasoning="It is easy."),
                    Message(role="user", content="Now a tool."),
                    Message(
                        role="assistant",
                        content="Reading.",
                        reasoning="Need x.",
                        tool_calls=(call,),
                    ),
                    Message(role="tool", content="x = 1", tool_call_id="c1"),
                ],
                None,
            )
        ]


# -------------------------------------------------------------------- the toy itself


def b(text: str) -> list[int]:
    return list(text.encode())


def test_toy_render_is_exact_chatml() -> None:
    messages = [Message(role="user", content="hi"), Message(role="assistant", content="yo")]
    r = ToyChatRenderer().render(messages)
    user = [IM_START, *b("user\nhi"), IM_END, *b("\n")]
    assistant = [IM_START, *b("assistant\nyo"), IM_END, *b("\n")]
    assert r.token_ids == user + assistant
    assert r.message_indices == [0] * 10 + [1] * 15
    # Only "yo" and the close token were sampled.
    assert r.sampled_mask == [False] * 10 + [False] * 11 + [True] * 3 + [False]
    assert sampled_span(r, 1) == [*b("yo"), IM_END]


def test_toy_bridge_synthesizes_close_token() -> None:
    renderer = ToyChatRenderer()
    prompt = renderer.render([Message(role="user", content="a")], add_generation_prompt=True)
    new = [Message(role="user", content="b")]
    bridged = check_bridge_contract(renderer, prompt.token_ids, b("x"), new)
    tail = [IM_END, *b("\n"), IM_START, *b("user\nb"), IM_END, *b("\n"), IM_START]
    assert bridged == prompt.token_ids + b("x") + tail + b("assistant\n")
    # A completion that stopped on <|endoftext|> without closing its turn cannot be proven.
    assert renderer.bridge_to_next_turn(prompt.token_ids, [*b("x"), END_OF_TEXT], new) is None


def test_toy_parse_reports_unterminated_tool_call() -> None:
    renderer = ToyChatRenderer()
    parsed = renderer.parse_response([TOOL_CALL, *b('\n{"name": "f"')])
    assert parsed.stopped is False
    assert [c.status for c in parsed.tool_calls] == ["unterminated"]
    parsed = renderer.parse_response([TOOL_CALL, *b('\n{"arguments": {}}\n'), 260, IM_END])
    assert [c.status for c in parsed.tool_calls] == ["missing_name"]


# -------------------------------------------------------------------- helpers


def test_sampled_span_rejects_a_split_span() -> None:
    r = RenderedTokens(
        token_ids=[1, 2, 3], message_indices=[0, 0, 0], sampled_mask=[True, False, True]
    )
    with pytest.raises(AssertionError, match="not contiguous"):
        sampled_span(r, 0)


def test_default_conversations_without_tools_have_no_tool_messages() -> None:
    for messages, tools in default_conversations(with_tools=False):
        assert tools is None
        assert all(m.role != "tool" and not m.tool_calls for m in messages)
    assert any(tools for _, tools in default_conversations())


# -------------------------------------------------------------------- broken renderers


class TrimsTrailingTokens(ToyChatRenderer):
    """Drops tokens sampled after the close token: the prompt no longer extends the prefix."""

    def bridge_to_next_turn(self, prev_prompt_ids, prev_completion_ids, new_messages, tools=None):
        completion = list(prev_completion_ids)
        if IM_END in completion:
            completion = completion[: completion.index(IM_END) + 1]
        return super().bridge_to_next_turn(prev_prompt_ids, completion, new_messages, tools)


class NeverClosesTruncatedTurn(ToyChatRenderer):
    """Forgets to synthesize the close token after a truncated completion."""

    def bridge_to_next_turn(self, prev_prompt_ids, prev_completion_ids, new_messages, tools=None):
        bridged = super().bridge_to_next_turn(
            prev_prompt_ids, prev_completion_ids, new_messages, tools
        )
        if bridged is None or IM_END in prev_completion_ids:
            return bridged
        at = len(prev_prompt_ids) + len(prev_completion_ids)
        return bridged[:at] + bridged[at + 1 :]


class AcceptsAssistantMessages(ToyChatRenderer):
    """Bridges over assistant messages it never sampled."""

    def bridge_to_next_turn(self, prev_prompt_ids, prev_completion_ids, new_messages, tools=None):
        plain = [
            m if m.role != "assistant" else Message(role="user", content=m.content)
            for m in new_messages
        ]
        return super().bridge_to_next_turn(prev_prompt_ids, prev_completion_ids, plain, tools)


class GivesUpOnBridging(ToyChatRenderer):
    def bridge_to_next_turn(self, prev_prompt_ids, prev_completion_ids, new_messages, tools=None):
        return None


class SamplesUserTokens(ToyChatRenderer):
    def render(self, messages, tools=None, add_generation_prompt=False):
        r = super().render(messages, tools, add_generation_prompt)
        mask = [
            s or (i >= 0 and messages[i].role == "user")
            for i, s in zip(r.message_indices, r.sampled_mask, strict=True)
        ]
        return RenderedTokens(
            token_ids=r.token_ids, message_indices=r.message_indices, sampled_mask=mask
        )


class MisattributesGenerationPrompt(ToyChatRenderer):
    """Attributes the generation prompt to the last message instead of scaffold."""

    def render(self, messages, tools=None, add_generation_prompt=False):
        r = super().render(messages, tools, add_generation_prompt)
        last = len(messages) - 1
        indices = [last if i == -1 and n > 0 else i for n, i in enumerate(r.message_indices)]
        return RenderedTokens(
            token_ids=r.token_ids, message_indices=indices, sampled_mask=r.sampled_mask
        )


class ShortMask(ToyChatRenderer):
    def render(self, messages, tools=None, add_generation_prompt=False):
        r = super().render(messages, tools, add_generation_prompt)
        return RenderedTokens(
            token_ids=r.token_ids,
            message_indices=r.message_indices,
            sampled_mask=r.sampled_mask[:-1],
        )


class NondeterministicRender(ToyChatRenderer):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def render(self, messages, tools=None, add_generation_prompt=False):
        self.calls += 1
        r = super().render(messages, tools, add_generation_prompt)
        ids = [r.token_ids[0] + self.calls % 2, *r.token_ids[1:]]
        return RenderedTokens(
            token_ids=ids, message_indices=r.message_indices, sampled_mask=r.sampled_mask
        )


class OffByOneIndices(ToyChatRenderer):
    def render(self, messages, tools=None, add_generation_prompt=False):
        r = super().render(messages, tools, add_generation_prompt)
        indices = [i if i == -1 else i + 1 for i in r.message_indices]
        return RenderedTokens(
            token_ids=r.token_ids, message_indices=indices, sampled_mask=r.sampled_mask
        )


class DropsMalformedToolCalls(ToyChatRenderer):
    def parse_response(self, token_ids: Sequence[int], tools=None) -> ParsedResponse:
        parsed = super().parse_response(token_ids, tools)
        ok = tuple(c for c in parsed.tool_calls if c.status == "ok")
        return ParsedResponse(
            content=parsed.content,
            reasoning=parsed.reasoning,
            tool_calls=ok,
            stopped=parsed.stopped,
        )


class AlwaysStopped(ToyChatRenderer):
    def parse_response(self, token_ids: Sequence[int], tools=None) -> ParsedResponse:
        parsed = super().parse_response(token_ids, tools)
        return ParsedResponse(content=parsed.content, tool_calls=parsed.tool_calls, stopped=True)


class StripsContent(ToyChatRenderer):
    def parse_response(self, token_ids: Sequence[int], tools=None) -> ParsedResponse:
        parsed = super().parse_response(token_ids, tools)
        return ParsedResponse(
            content=parsed.content.replace("\n", " "),
            stopped=parsed.stopped,
            tool_calls=parsed.tool_calls,
        )


class NoStopTokens(ToyChatRenderer):
    def stop_token_ids(self) -> list[int]:
        return []


class WrongStopToken(ToyChatRenderer):
    def stop_token_ids(self) -> list[int]:
        return [END_OF_TEXT]


class CrLfTemplate(ToyChatRenderer):
    """Renders a different template than the reference one."""

    def render(self, messages, tools=None, add_generation_prompt=False):
        r = super().render(messages, tools, add_generation_prompt)
        ids = [13 if t == 10 else t for t in r.token_ids]
        return RenderedTokens(
            token_ids=ids, message_indices=r.message_indices, sampled_mask=r.sampled_mask
        )


BROKEN = [
    (TrimsTrailingTokens, "test_bridge_after_trailing_tokens"),
    (NeverClosesTruncatedTurn, "test_bridge_after_truncated_turn"),
    (AcceptsAssistantMessages, "test_bridge_refuses_assistant_messages"),
    (GivesUpOnBridging, "test_bridge_after_closed_turn"),
    (SamplesUserTokens, "test_sampled_tokens_belong_to_assistant_messages"),
    (MisattributesGenerationPrompt, "test_generation_prompt_extends_render"),
    (OffByOneIndices, "test_message_indices_are_in_range_and_ordered"),
    (ShortMask, "test_per_token_lists_have_equal_length"),
    (NondeterministicRender, "test_render_is_deterministic"),
    (DropsMalformedToolCalls, "test_parse_response_keeps_malformed_tool_calls"),
    (AlwaysStopped, "test_parse_response_of_truncated_turn"),
    (StripsContent, "test_parse_response_round_trips_assistant_messages"),
    (NoStopTokens, "test_stop_token_ids"),
    (WrongStopToken, "test_assistant_turn_ends_with_stop_token"),
]


@pytest.mark.parametrize(("broken", "method"), BROKEN, ids=lambda x: getattr(x, "__name__", x))
def test_suite_catches_broken_renderer(broken: type[ToyChatRenderer], method: str) -> None:
    suite = RendererConformance()
    test = getattr(suite, method)
    kwargs: dict[str, object] = {"renderer": broken()}
    if "conversations" in inspect.signature(test).parameters:
        kwargs["conversations"] = default_conversations()
    with pytest.raises(AssertionError):
        test(**kwargs)
    # The same method passes on the correct renderer, so the failure is the broken behaviour.
    test(**{**kwargs, "renderer": ToyChatRenderer()})


def test_suite_catches_a_template_that_differs_from_the_reference() -> None:
    suite = RendererConformance()
    cases = default_conversations()
    with pytest.raises(AssertionError, match="differs from the reference template"):
        suite.test_render_matches_reference_template(CrLfTemplate(), cases, reference_chat_template)
    suite.test_render_matches_reference_template(ToyChatRenderer(), cases, reference_chat_template)


def test_check_bridge_contract_names_the_broken_position() -> None:
    renderer = TrimsTrailingTokens()
    prompt = renderer.render([Message(role="user", content="a")], add_generation_prompt=True)
    completion = [*b("ok"), IM_END, *b("zz")]
    n = len(prompt.token_ids)
    with pytest.raises(AssertionError, match=f"at position {n + 3} of {n + 5}"):
        check_bridge_contract(
            renderer, prompt.token_ids, completion, [Message(role="user", content="b")]
        )


def test_check_bridge_contract_requires_refusal_of_assistant_messages() -> None:
    prompt = ToyChatRenderer().render(
        [Message(role="user", content="a")], add_generation_prompt=True
    )
    new = [Message(role="assistant", content="b")]
    assert check_bridge_contract(ToyChatRenderer(), prompt.token_ids, b("x"), new) is None
    with pytest.raises(AssertionError, match="must refuse"):
        check_bridge_contract(AcceptsAssistantMessages(), prompt.token_ids, b("x"), new)


def test_check_bridge_contract_detects_mutated_arguments() -> None:
    class Mutates(ToyChatRenderer):
        def bridge_to_next_turn(
            self, prev_prompt_ids, prev_completion_ids, new_messages, tools=None
        ):
            result = super().bridge_to_next_turn(
                prev_prompt_ids, prev_completion_ids, new_messages, tools
            )
            prev_completion_ids.append(IM_END)
            return result

    prompt = ToyChatRenderer().render(
        [Message(role="user", content="a")], add_generation_prompt=True
    )
    with pytest.raises(AssertionError, match="modified its arguments"):
        check_bridge_contract(
            Mutates(), prompt.token_ids, b("x"), [Message(role="user", content="b")]
        )


def test_prefix_unstable_renderer_may_differ_from_full_render() -> None:
    """With prefix_stable = False only the prefix contract is checked."""

    class DropsOldReasoning(ToyChatRenderer):
        def render(self, messages, tools=None, add_generation_prompt=False):
            last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
            kept = [
                Message(
                    role=m.role,
                    content=m.content,
                    tool_calls=m.tool_calls,
                    tool_call_id=m.tool_call_id,
                )
                if m.role == "assistant" and i != last
                else m
                for i, m in enumerate(messages)
            ]
            return super().render(kept, tools, add_generation_prompt)

    class Suite(RendererConformance):
        prefix_stable = False

    cases: list[Conversation] = [
        (
            [
                Message(role="user", content="q1"),
                Message(role="assistant", content="a1", reasoning="r1"),
                Message(role="user", content="q2"),
                Message(role="assistant", content="a2", reasoning="r2"),
                Message(role="user", content="q3"),
            ],
            [ToolSpec(name="noop")],
        )
    ]
    with pytest.raises(AssertionError, match="set prefix_stable = False"):
        RendererConformance().test_bridge_after_closed_turn(DropsOldReasoning(), cases)
    Suite().test_bridge_after_closed_turn(DropsOldReasoning(), cases)
    Suite().test_bridge_after_truncated_turn(DropsOldReasoning(), cases)
