"""Any sequence of client behaviours (extend, retry, edit, assistant-only, truncation, history
dropped or summarized, several lineages) is classified as a simple model predicts, and the
stored chain stays exact."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings
from reference.toy_renderer import ToyChatRenderer
from reference_stores import MemoryTraceStore
from rllm_core.gateway.engine import ChatRequest, GatewayEngine
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import Message, SamplingParams

ACTIONS = ("extend", "retry", "edit", "assistant_only", "truncated", "drop_oldest", "summarize")


@dataclass
class Client:
    """One agent's view of its conversation."""

    system: str
    sent: list[Message] = field(default_factory=list)
    params: SamplingParams = field(default_factory=SamplingParams)
    reply: Message | None = None


step = st.tuples(st.integers(0, 2), st.sampled_from(ACTIONS), st.integers(0, 50))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(step, min_size=1, max_size=14), cumulative=st.booleans())
def test_random_client_behaviour(steps, cumulative, chain_checker) -> None:
    # chain_checker is a stateless function, safe to share across examples.
    renderer = ToyChatRenderer()
    counter = iter(range(10_000))
    sampler = ScriptedSampler(lambda _request: f"reply {next(counter)}", renderer=renderer)
    store = MemoryTraceStore()
    engine = GatewayEngine(
        renderer=renderer, sampler=sampler, trace_store=store, cumulative=cumulative
    )
    clients = [Client(system=f"agent {n}") for n in range(3)]
    lineage_of: dict[int, str] = {}
    expected_resets: dict[str, int] = {}

    for n, (which, action, pick) in enumerate(steps):
        client = clients[which]
        if client.reply is None:
            messages = [
                Message(role="system", content=client.system),
                Message(role="user", content="go"),
            ]
            params, expect = SamplingParams(), ("root", None, None)
        else:
            recorded = [*client.sent, client.reply]
            params = SamplingParams()
            if action == "retry":
                messages, params = client.sent, client.params
                expect = ("replay", None, None)
            elif action == "edit":
                at = 1 + pick % (len(recorded) - 1)
                edited = recorded[at]
                recorded[at] = Message(
                    role=edited.role,
                    content=edited.content + " (edited)",
                    tool_calls=edited.tool_calls,
                )
                messages = [*recorded, Message(role="user", content=f"after edit {n}")]
                expect = ("reset", "history_edited", at)
            elif action in ("drop_oldest", "summarize") and len(recorded) >= 5:
                # The messages after the system prompt up to the first reply leave; a summary
                # may take their place.
                cut = 1 + next(i for i, m in enumerate(recorded) if m.role == "assistant")
                summary = [Message(role="user", content=f"summary {n}")]
                kept = recorded[cut:]
                if action == "drop_oldest":
                    summary, reason = [], "history_truncated"
                elif cut - 1 > len(summary):
                    reason = "history_summarized"
                else:
                    # One message replaced by one: a summary replaces more messages than it
                    # holds, so this one reads as an edit of the message it replaced.
                    reason = "history_edited"
                messages = [recorded[0], *summary, *kept, Message(role="user", content=f"s{n}")]
                expect = ("reset", reason, 1)
            elif action == "assistant_only":
                messages = recorded
                expect = ("reset", "empty_delta", None)
            else:
                messages = [*recorded, Message(role="user", content=f"step {n}")]
                expect = ("extend", None, None)
                if action == "truncated":
                    params = SamplingParams(max_tokens=3 + pick % 4)

        result = asyncio.run(engine.chat("s", ChatRequest(messages=tuple(messages), params=params)))
        assert (result.mode, result.reset_reason, result.divergent_message) == expect
        if expect[1] is not None:
            expected_resets[expect[1]] = expected_resets.get(expect[1], 0) + 1
        lineage_of.setdefault(which, result.lineage_id)
        assert result.lineage_id == lineage_of[which]
        # The toy template is prefix stable, so the exact prompt is always the full render.
        full = renderer.render(messages, add_generation_prompt=True).token_ids
        assert result.prompt_token_ids == full
        client.sent, client.params, client.reply = list(messages), params, result.message

    traces = store.session("s")
    for lineage in set(lineage_of.values()):
        chain = chain_checker(traces, sampler.requests, lineage)
        turns = [t.record.turn for t in chain]
        assert turns == list(range(len(turns)))
    stats = engine.session_stats("s")
    assert stats.resets == expected_resets
    assert stats.turns == len(traces)
    assert stats.turns + stats.replays == len(steps)
