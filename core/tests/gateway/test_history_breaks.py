"""History breaks: an agent that truncates, summarizes or edits its history mid-episode gets a
reset recorded with its reason and where it happened, the record keeps it through a trace store,
and the datums train each side of the break as its own sequence."""

from __future__ import annotations

import asyncio

import pytest
from reference.history_breaks import SUMMARY, SYSTEM, summarized_conversation, user
from reference.toy_renderer import ToyChatRenderer
from reference_stores import MemoryTraceStore
from rllm_core.algorithms.datums import merge_trajectory, trajectories_from_traces
from rllm_core.gateway.engine import ChatRequest, GatewayEngine
from rllm_core.gateway.history import HistoryBreak
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import Message, TraceRecord


def assistant(text: str) -> Message:
    return Message(role="assistant", content=text)


def serve(store=None, replies=None) -> tuple[GatewayEngine, ScriptedSampler]:
    renderer = ToyChatRenderer()
    sampler = ScriptedSampler(replies or [f"reply {n}" for n in range(20)], renderer=renderer)
    engine = GatewayEngine(
        renderer=renderer, sampler=sampler, trace_store=store or MemoryTraceStore()
    )
    return engine, sampler


def chat(engine: GatewayEngine, messages: list[Message], session: str = "s"):
    return asyncio.run(engine.chat(session, ChatRequest(messages=tuple(messages))))


def three_exchanges(engine: GatewayEngine) -> list[Message]:
    """[system, u1, r0, u2, r1, u3, r2]: the recorded conversation after three calls."""
    history = [SYSTEM]
    for n in range(3):
        history.append(user(f"u{n + 1}"))
        history.append(chat(engine, history).message)
    return history


# ------------------------------------------------------------------------------ classification


def test_dropping_the_oldest_exchange_is_a_truncation_after_the_kept_prefix() -> None:
    engine, _ = serve()
    history = three_exchanges(engine)
    reset = chat(engine, [SYSTEM, *history[3:], user("u4")])
    assert (reset.mode, reset.lineage_id, reset.turn) == ("reset", "main", 3)
    assert reset.history_break == HistoryBreak(
        reason="history_truncated", at=1, kept=5, dropped=2, inserted=0
    )
    assert reset.history_break.describe() == (
        "history_truncated (2 messages dropped after message 1, 5 kept)"
    )
    assert engine.session_stats("s").resets == {"history_truncated": 1}


def test_a_summary_in_place_of_earlier_turns_is_summarized_with_what_it_kept() -> None:
    engine, _ = serve()
    history = three_exchanges(engine)
    reset = chat(engine, [SYSTEM, SUMMARY, *history[5:], user("u4")])
    assert reset.history_break == HistoryBreak(
        reason="history_summarized", at=1, kept=3, dropped=4, inserted=1
    )
    assert reset.divergent_message == 1
    assert reset.history_break.describe() == (
        "history_summarized (4 messages replaced by a 1-message summary, 3 kept)"
    )


def test_a_summary_exchange_replacing_all_turns_is_summarized() -> None:
    engine, _ = serve()
    history = three_exchanges(engine)
    # The agent asked for a summary elsewhere and hands it over as a question and its answer.
    handoff = [user("What did you do so far?"), assistant("Ran the tests; parse() is wrong.")]
    reset = chat(engine, [history[0], *handoff, user("Continue.")])
    assert reset.history_break == HistoryBreak(
        reason="history_summarized", at=1, kept=1, dropped=6, inserted=2
    )


@pytest.mark.parametrize(
    ("rewrite", "expected"),
    [
        # u2 rewritten in place, everything after it kept
        (
            lambda h: [*h[:3], user("u2, rephrased"), *h[4:], user("u4")],
            HistoryBreak(reason="history_edited", at=3, kept=6, dropped=1, inserted=1),
        ),
        # rewound to the second call with r0 edited: what followed u2 is gone
        (
            lambda h: [*h[:2], assistant("r0, edited"), h[3]],
            HistoryBreak(reason="history_edited", at=2, kept=3, dropped=4, inserted=1),
        ),
        # the same request as the second call, under other parameters: a rewind, nothing new
        (
            lambda h: h[:4],
            HistoryBreak(reason="history_edited", at=4, kept=4, dropped=3, inserted=0),
        ),
        # the whole history after the system prompt replaced by one new question
        (
            lambda h: [h[0], user("Start over.")],
            HistoryBreak(reason="history_edited", at=1, kept=1, dropped=6, inserted=1),
        ),
    ],
)
def test_other_rewrites_are_edits(rewrite, expected) -> None:
    engine, _ = serve()
    history = three_exchanges(engine)
    reset = chat(engine, rewrite(history))
    assert (reset.mode, reset.reset_reason, reset.history_break) == (
        "reset",
        "history_edited",
        expected,
    )


def test_a_truncation_that_drops_the_first_message_starts_a_new_lineage_naming_its_source():
    engine, _ = serve()
    history = three_exchanges(engine)
    cut = chat(engine, [*history[3:], user("u4")])
    assert (cut.mode, cut.lineage_id, cut.turn) == ("reset", "lineage-1", 0)
    assert cut.history_break == HistoryBreak(
        reason="history_truncated", at=0, kept=4, dropped=3, inserted=0, source="main"
    )
    assert cut.history_break.describe().endswith("4 kept, continuing lineage main)")
    after = chat(engine, [*history[3:], user("u4"), cut.message, user("u5")])
    assert (after.mode, after.lineage_id, after.turn) == ("extend", "lineage-1", 1)
    assert engine.session_stats("s").resets == {"history_truncated": 1}


def test_a_sub_agent_sharing_the_task_but_no_reply_is_a_plain_new_lineage() -> None:
    engine, _ = serve()
    history = three_exchanges(engine)
    helper = chat(engine, [Message(role="system", content="You search."), history[1]])
    assert (helper.mode, helper.lineage_id, helper.history_break) == ("root", "lineage-1", None)
    assert engine.session_stats("s").resets == {}


def test_a_retry_of_a_break_keeps_the_break_on_its_record() -> None:
    engine, sampler = serve()
    history = three_exchanges(engine)
    summarized = [SYSTEM, SUMMARY, *history[5:], user("u4")]
    first = chat(engine, summarized)
    again = chat(engine, summarized)
    assert (again.mode, again.trace_id) == ("replay", first.trace_id)
    (record,) = [r for r in engine.trace_store.chain("s") if r.trace_id == first.trace_id]
    assert HistoryBreak.from_record(record.reset_reason, record.flags) == first.history_break
    assert len(sampler.requests) == 5


# ------------------------------------------------------------------------------ records


def test_the_break_is_stored_on_the_record_and_reads_back_from_a_trace_store(tmp_path) -> None:
    deltachain = pytest.importorskip("rllm_trace_store_deltachain.store")
    with deltachain.DeltaChainTraceStore(tmp_path / "traces") as store:
        summarized_conversation(store)
    with deltachain.DeltaChainTraceStore(tmp_path / "traces") as reopened:
        records = sorted(reopened.chain("s"), key=lambda r: r.turn)
    assert [r.reset_reason for r in records] == [None] * 3 + ["history_summarized"] + [None] * 2
    reset = records[3]
    assert reset.parent_trace_id is None
    assert reset.flags == (
        "history_at=1",
        "history_kept=3",
        "history_dropped=4",
        "history_inserted=1",
    )
    assert HistoryBreak.from_record(reset.reset_reason, reset.flags) == HistoryBreak(
        reason="history_summarized", at=1, kept=3, dropped=4, inserted=1
    )
    assert [HistoryBreak.from_record(r.reset_reason, r.flags) for r in records[4:]] == [None] * 2


def test_records_without_the_break_flags_read_as_no_break() -> None:
    older = TraceRecord(
        trace_id="t",
        session_id="s",
        prompt_delta_token_ids=[1],
        completion_token_ids=[2],
        logprobs=[-0.1],
        reset_reason="prefix_changed",
    )
    assert HistoryBreak.from_record(older.reset_reason, older.flags) is None
    assert HistoryBreak.from_record("history_edited", ("tool_choice_unmet",)) is None
    assert HistoryBreak.from_record("tools_changed", ("history_at=1",)) is None


# ------------------------------------------------------------------------------ datums


@pytest.mark.parametrize("cumulative", [True, False])
def test_a_summarized_conversation_trains_as_two_sequences(cumulative) -> None:
    store = MemoryTraceStore()
    run = summarized_conversation(store, cumulative=cumulative)
    modes = [r.mode for r in run.results]
    assert modes == ["root", "extend", "extend", "reset", "extend", "extend"]
    prompts = [r.prompt_token_ids for r in run.results]
    completions = [r.completion_token_ids for r in run.results]
    renderer = ToyChatRenderer()
    summarized = renderer.render(run.requests[3], add_generation_prompt=True).token_ids
    assert prompts[3] == summarized

    (trajectory,) = trajectories_from_traces(store.session("s"))
    datums = merge_trajectory(trajectory, 0.5)

    assert len(datums) == 2
    for datum, calls in zip(datums, ([0, 1, 2], [3, 4, 5]), strict=True):
        last = calls[-1]
        assert datum.token_ids == prompts[last] + completions[last]
        action, observation = [], []
        for n, call in enumerate(calls):
            before = len(prompts[calls[n - 1]]) + len(completions[calls[n - 1]]) if n else 0
            # the first prompt is in neither mask, each later prompt delta is an observation
            action += [False] * (len(prompts[call]) - before)
            observation += [n > 0] * (len(prompts[call]) - before)
            action += [True] * len(completions[call])
            observation += [False] * len(completions[call])
        assert datum.action_mask == action
        assert datum.observation_mask == observation
        assert [a for a, m in zip(datum.advantages, action, strict=True) if m] == [0.5] * sum(
            action
        )
        assert datum.metadata["trace_ids"] == [run.results[c].trace_id for c in calls]
    assert datums[1].token_ids[: len(summarized)] == summarized
    assert [d.metadata["segment"] for d in datums] == [0, 1]
    # The summary's prompt is not a continuation of the first sequence.
    first = datums[0].token_ids
    assert datums[1].token_ids[: len(first)] != first
