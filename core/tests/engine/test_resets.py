"""Reset classification: every reason, the divergent message, the one log line per reset."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest
from reference.toy_renderer import END_OF_TEXT, ToyChatRenderer, ToyTokenizer
from rllm_core.gateway.accumulator import renderer_keeps_reasoning
from rllm_core.gateway.engine import ChatRequest, GatewayEngine
from rllm_core.gateway.history import HistoryBreak
from rllm_core.types import Message, SamplingParams, ToolSpec

enc = ToyTokenizer().encode


def user(text: str) -> Message:
    return Message(role="user", content=text)


def assistant(text: str) -> Message:
    return Message(role="assistant", content=text)


def chat(engine: GatewayEngine, session: str, messages, **kwargs):
    return asyncio.run(engine.chat(session, ChatRequest(messages=tuple(messages), **kwargs)))


def reset_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "rllm_core.gateway" and "token reset" in r.getMessage()
    ]


@pytest.fixture
def two_turns(toy, store, scripted):
    """An engine after two extending turns: [sys, u1, a1, u2] answered with a2."""
    sampler = scripted(["a1", "a2", "a3", "a4"])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)
    messages = [Message(role="system", content="S"), user("u1")]
    first = chat(engine, "s", messages)
    messages += [first.message, user("u2")]
    second = chat(engine, "s", messages)
    messages.append(second.message)
    return engine, sampler, messages, second


def test_an_edit_reports_the_first_divergent_message_and_what_was_kept(
    two_turns, toy, store, caplog, chain_checker
) -> None:
    engine, sampler, messages, second = two_turns
    edited = [*messages[:3], user("u2 edited"), messages[4], user("u3")]
    with caplog.at_level(logging.INFO, logger="rllm_core.gateway"):
        reset = chat(engine, "s", edited)

    assert reset.mode == "reset"
    assert (reset.reset_reason, reset.divergent_message) == ("history_edited", 3)
    assert reset.history_break == HistoryBreak(
        reason="history_edited", at=3, kept=4, dropped=1, inserted=1
    )
    assert (reset.lineage_id, reset.turn) == ("main", 2)
    full = toy.render(edited, add_generation_prompt=True).token_ids
    assert reset.prompt_token_ids == full
    record = store.chain("s")[-1]
    assert record.parent_trace_id is None
    assert record.prompt_delta_token_ids == full
    assert record.reset_reason == "history_edited"
    assert record.flags == (
        "history_at=3",
        "history_kept=4",
        "history_dropped=1",
        "history_inserted=1",
    )
    assert HistoryBreak.from_record(record.reset_reason, record.flags) == reset.history_break
    assert record.messages_delta == (*edited, reset.message)
    assert reset_lines(caplog) == [
        "token reset session=s lineage=main reason=history_edited divergent_message=3 kept=4"
        " dropped=1 inserted=1 turn=2"
        f" prev_prompt_tokens={len(second.prompt_token_ids)} new_prompt_tokens={len(full)}"
        " session_resets=1"
    ]
    chain_checker(store.session("s"), sampler.requests)
    assert engine.session_stats("s").resets == {"history_edited": 1}


def test_compacted_history_is_summarized(two_turns, store) -> None:
    engine, _, messages, _ = two_turns
    compacted = [messages[0], user("summary of u1 and u2"), user("u3")]
    reset = chat(engine, "s", compacted)
    assert (reset.mode, reset.reset_reason, reset.divergent_message) == (
        "reset",
        "history_summarized",
        1,
    )
    assert (reset.history_break.kept, reset.history_break.dropped) == (1, 4)


def test_dropped_reply_is_an_edit_at_its_index(two_turns) -> None:
    engine, _, messages, _ = two_turns
    # The last request again, but with other sampling parameters: not a retry, and the
    # recorded reply at index 4 is missing.
    reset = chat(engine, "s", messages[:4], params=SamplingParams(temperature=0.2))
    assert (reset.mode, reset.reset_reason, reset.divergent_message) == (
        "reset",
        "history_edited",
        4,
    )
    assert (reset.history_break.kept, reset.history_break.dropped) == (4, 1)


def test_changed_tools_alone_are_tools_changed(two_turns) -> None:
    engine, _, messages, _ = two_turns
    tool = ToolSpec(name="look", description="Look around.")
    reset = chat(engine, "s", [*messages, user("u3")], tools=(tool,))
    assert (reset.reset_reason, reset.divergent_message, reset.history_break) == (
        "tools_changed",
        None,
        None,
    )


def test_empty_delta(two_turns, toy, store, caplog) -> None:
    engine, _, messages, second = two_turns
    with caplog.at_level(logging.INFO, logger="rllm_core.gateway"):
        nothing_new = chat(engine, "s", messages)
        only_assistant = chat(engine, "s", [*messages, nothing_new.message, assistant("more")])

    assert (nothing_new.mode, nothing_new.reset_reason) == ("reset", "empty_delta")
    assert nothing_new.divergent_message is None
    full = toy.render(messages, add_generation_prompt=True).token_ids
    assert nothing_new.prompt_token_ids == full
    assert (only_assistant.mode, only_assistant.reset_reason) == ("reset", "empty_delta")
    assert [r.reset_reason for r in store.chain("s")] == [None, None, "empty_delta", "empty_delta"]
    lines = reset_lines(caplog)
    assert len(lines) == 2
    assert "reason=empty_delta turn=2" in lines[0]
    assert f"prev_prompt_tokens={len(second.prompt_token_ids)}" in lines[0]
    assert lines[1].endswith("session_resets=2")
    assert "divergent_message" not in lines[0]
    assert engine.session_stats("s").resets == {"empty_delta": 2}


def test_renderer_no_bridge_when_the_turn_ended_without_its_close(
    toy, store, scripted, caplog, chain_checker
) -> None:
    # The toy renderer cannot bridge a completion that stopped on <|endoftext|>.
    sampler = scripted([[*enc("Done"), END_OF_TEXT], "Next."])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)
    first = chat(engine, "s", [user("Do it")])
    assert first.finish_reason == "stop"
    messages = [user("Do it"), first.message, user("Again")]
    with caplog.at_level(logging.INFO, logger="rllm_core.gateway"):
        reset = chat(engine, "s", messages)
    assert (reset.mode, reset.reset_reason) == ("reset", "renderer_no_bridge")
    assert reset.prompt_token_ids == toy.render(messages, add_generation_prompt=True).token_ids
    assert store.chain("s")[1].parent_trace_id is None
    [line] = reset_lines(caplog)
    assert "reason=renderer_no_bridge turn=1" in line
    chain_checker(store.session("s"), sampler.requests)


def test_an_assistant_message_among_new_messages_cannot_be_bridged(toy, store, scripted) -> None:
    engine = GatewayEngine(renderer=toy, sampler=scripted(["a", "b"]), trace_store=store)
    first = chat(engine, "s", [user("x")])
    injected = [user("x"), first.message, user("y"), assistant("prefilled"), user("z")]
    reset = chat(engine, "s", injected)
    assert (reset.mode, reset.reset_reason) == ("reset", "renderer_no_bridge")


class PrefixBreakingRenderer(ToyChatRenderer):
    """A renderer whose bridge breaks its contract: the engine must not trust it."""

    def bridge_to_next_turn(self, prev_prompt_ids, prev_completion_ids, new_messages, tools=None):
        bridged = super().bridge_to_next_turn(
            prev_prompt_ids, prev_completion_ids, new_messages, tools
        )
        return None if bridged is None else [0, *bridged[1:]]


def test_a_bridge_that_breaks_the_prefix_is_treated_as_no_bridge(store, scripted) -> None:
    renderer = PrefixBreakingRenderer()
    engine = GatewayEngine(renderer=renderer, sampler=scripted(["a", "b"]), trace_store=store)
    first = chat(engine, "s", [user("x")])
    reset = chat(engine, "s", [user("x"), first.message, user("y")])
    assert (reset.mode, reset.reset_reason) == ("reset", "renderer_no_bridge")
    assert reset.prompt_token_ids[0] != 0


def test_resets_keep_extending_afterwards(two_turns, toy, store, chain_checker) -> None:
    engine, sampler, messages, _ = two_turns
    edited = [messages[0], user("other u1"), user("u3")]
    reset = chat(engine, "s", edited)
    after = chat(engine, "s", [*edited, reset.message, user("u4")])
    assert (after.mode, after.turn, after.reset_reason) == ("extend", 3, None)
    records = store.chain("s")
    assert records[3].parent_trace_id == reset.trace_id
    chain = chain_checker(store.session("s"), sampler.requests)
    assert [t.record.turn for t in chain] == [0, 1, 2, 3]
    assert engine.session_stats("s").turns == 4


class ReasoningStrippingRenderer(ToyChatRenderer):
    """Drops the reasoning of every assistant turn that is not the last message."""

    def render(self, messages: Sequence[Message], tools=None, add_generation_prompt=False):
        kept = [
            Message(role=m.role, content=m.content, tool_calls=m.tool_calls)
            if m.role == "assistant" and n < len(messages) - 1
            else m
            for n, m in enumerate(messages)
        ]
        return super().render(kept, tools, add_generation_prompt)


def test_reasoning_is_compared_only_when_the_renderer_renders_it(store, scripted) -> None:
    assert renderer_keeps_reasoning(ToyChatRenderer()) is True
    stripping = ReasoningStrippingRenderer()
    assert renderer_keeps_reasoning(stripping) is False
    edited = Message(role="assistant", content="A.", reasoning="rewritten")
    modes = []
    for cumulative in (True, False):
        engine = GatewayEngine(
            renderer=stripping,
            sampler=scripted(["<think>\nr\n</think>\n\nA.", "B."]),
            trace_store=store,
            cumulative=cumulative,
        )
        first = chat(engine, f"s{cumulative}", [user("q")])
        assert first.message.reasoning == "r"
        nxt = chat(engine, f"s{cumulative}", [user("q"), edited, user("q2")])
        modes.append((nxt.mode, nxt.reset_reason, nxt.divergent_message))
    # Cumulative mode bridges from the sampled tokens; plain mode renders without the old
    # reasoning, which then no longer extends the sampled tokens.
    assert modes == [("extend", None, None), ("reset", "renderer_no_bridge", None)]


def test_sub_agent_does_not_reset_the_parent(toy, store, scripted) -> None:
    engine = GatewayEngine(renderer=toy, sampler=scripted(["p", "c", "p2"]), trace_store=store)
    parent = [Message(role="system", content="parent"), user("go")]
    first = chat(engine, "s", parent)
    child = chat(engine, "s", [Message(role="system", content="child"), user("sub-task")])
    resumed = chat(engine, "s", [*parent, first.message, user("child said c")])
    assert (child.lineage_id, child.mode) == ("lineage-1", "root")
    assert (resumed.lineage_id, resumed.mode) == ("main", "extend")
    assert engine.session_stats("s").resets == {}
    assert resumed.prompt_token_ids[: len(first.prompt_token_ids)] == first.prompt_token_ids


def test_plain_mode_logs_no_reset_and_cumulative_mode_logs_each_reset_once(
    toy, store, scripted, caplog
) -> None:
    # Every reply stops on <|endoftext|>, which renders back as <|im_end|>: in plain mode no
    # turn after the first chains, yet nothing is reset.
    plain = GatewayEngine(
        renderer=toy,
        sampler=scripted([[*enc(f"x{n}"), END_OF_TEXT] for n in range(4)]),
        trace_store=store,
        cumulative=False,
    )
    messages = [user("q0")]
    with caplog.at_level(logging.DEBUG, logger="rllm_core"):
        for n in range(4):
            result = chat(plain, "plain", messages)
            messages += [result.message, user(f"q{n + 1}")]
    assert plain.session_stats("plain").resets == {"renderer_no_bridge": 3}
    assert reset_lines(caplog) == []

    cumulative = GatewayEngine(
        renderer=toy, sampler=scripted(["a", "b", "c"]), trace_store=store, cumulative=True
    )
    first = chat(cumulative, "cumulative", [user("q")])
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="rllm_core"):
        chat(cumulative, "cumulative", [user("q"), first.message, user("r")])
        chat(cumulative, "cumulative", [user("q"), assistant("edited"), user("r")])
    (line,) = reset_lines(caplog)
    assert line.startswith(
        "token reset session=cumulative lineage=main reason=history_edited divergent_message=1"
    )
    assert [r.levelno for r in caplog.records] == [logging.INFO]
