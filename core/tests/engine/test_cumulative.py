"""Cumulative token mode: extension, replay, lineages, truncation and tool calls, on the toy
renderer (prefix stable, so a bridged prompt must also equal the full render)."""

from __future__ import annotations

import asyncio

from reference.toy_renderer import END_OF_TEXT, IM_END, IM_START, ToyTokenizer
from rllm_core.gateway.engine import ChatRequest, GatewayEngine
from rllm_core.testing.samplers import scripted_logprob
from rllm_core.types import Message, SamplingParams, ToolCall, ToolSpec

enc = ToyTokenizer().encode
GEN = [IM_START, *enc("assistant\n")]


def system(text: str) -> Message:
    return Message(role="system", content=text)


def user(text: str) -> Message:
    return Message(role="user", content=text)


def block(role: str, body: str) -> list[int]:
    """A closed toy message: ``<|im_start|>{role}\\n{body}<|im_end|>\\n``."""
    return [IM_START, *enc(f"{role}\n{body}"), IM_END, *enc("\n")]


def chat(engine: GatewayEngine, session: str, messages, **kwargs):
    return asyncio.run(engine.chat(session, ChatRequest(messages=tuple(messages), **kwargs)))


def test_multi_turn_extension_chains_every_prompt(toy, store, scripted, chain_checker) -> None:
    sampler = scripted(["Hello!", "Fine.", "Bye."], weight_version=3)
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)
    messages = [system("Be brief."), user("Hi")]
    results = []
    for follow_up in ("How are you?", "Goodbye"):
        result = chat(engine, "s1", messages)
        results.append(result)
        messages += [result.message, user(follow_up)]
    results.append(chat(engine, "s1", messages))

    assert [r.mode for r in results] == ["root", "extend", "extend"]
    assert [r.turn for r in results] == [0, 1, 2]
    assert {r.lineage_id for r in results} == {"main"}
    assert [r.message.content for r in results] == ["Hello!", "Fine.", "Bye."]
    assert [r.finish_reason for r in results] == ["stop"] * 3
    assert {r.weight_version for r in results} == {3}
    assert results[0].completion_token_ids == [*enc("Hello!"), IM_END]
    assert results[0].logprobs == [
        scripted_logprob(t, i) for i, t in enumerate([*enc("Hello!"), IM_END])
    ]

    root = block("system", "Be brief.") + block("user", "Hi") + GEN
    assert results[0].prompt_token_ids == root
    # The delta after a cleanly closed turn: the newline after <|im_end|>, the user turn, and
    # the generation prompt.
    delta1 = enc("\n") + block("user", "How are you?") + GEN
    assert results[1].prompt_token_ids == root + results[0].completion_token_ids + delta1
    for result, prefix in zip(results, (1, 3, 5), strict=True):
        rendered = toy.render(messages[: prefix + 1], add_generation_prompt=True).token_ids
        assert result.prompt_token_ids == rendered
    assert [r.prompt_token_ids for r in sampler.requests] == [r.prompt_token_ids for r in results]

    traces = store.session("s1")
    chain = chain_checker(traces, sampler.requests)
    assert [t.record.trace_id for t in chain] == [r.trace_id for r in results]
    assert chain[1].record.prompt_delta_token_ids == delta1
    assert chain[0].record.parent_trace_id is None
    assert chain[2].record.parent_trace_id == results[1].trace_id
    assert chain[0].record.messages_delta == (system("Be brief."), user("Hi"), results[0].message)
    assert chain[1].record.messages_delta == (user("How are you?"), results[1].message)
    assert chain[2].record.completion_token_ids == [*enc("Bye."), IM_END]
    assert {t.record.weight_version for t in chain} == {3}
    assert {t.record.model for t in chain} == {"policy"}
    assert all(t.record.reset_reason is None for t in chain)
    stats = engine.session_stats("s1")
    assert (stats.turns, stats.replays, stats.resets, stats.lineages) == (3, 0, {}, ("main",))


def test_sampler_params_carry_the_renderer_stop_tokens(toy, store, scripted) -> None:
    sampler = scripted(["ok"])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)
    params = SamplingParams(max_tokens=9, temperature=0.7, top_p=0.8, seed=5, stop_token_ids=(10,))
    chat(engine, "s", [user("x")], params=params)
    assert sampler.requests[0].params == SamplingParams(
        max_tokens=9, temperature=0.7, top_p=0.8, seed=5, stop_token_ids=(IM_END, END_OF_TEXT, 10)
    )


def test_replay_overwrites_the_same_trace(toy, store, scripted, chain_checker) -> None:
    sampler = scripted(["First.", "One.", "Two."])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)
    first = chat(engine, "s", [user("Start")])
    messages = [user("Start"), first.message, user("Go on")]
    original = chat(engine, "s", messages)
    retried = chat(engine, "s", messages)

    assert (original.mode, retried.mode) == ("extend", "replay")
    assert retried.trace_id == original.trace_id
    assert retried.turn == original.turn == 1
    assert retried.prompt_token_ids == original.prompt_token_ids
    assert sampler.requests[2].prompt_token_ids == sampler.requests[1].prompt_token_ids
    assert retried.message.content == "Two."
    records = store.chain("s")
    assert [r.turn for r in records] == [0, 1]
    replayed = records[1]
    assert replayed.trace_id == original.trace_id
    assert replayed.parent_trace_id == first.trace_id
    assert replayed.completion_token_ids == [*enc("Two."), IM_END]
    assert replayed.messages_delta == (user("Go on"), retried.message)
    chain_checker(store.session("s"), sampler.requests)
    stats = engine.session_stats("s")
    assert (stats.turns, stats.replays) == (2, 1)


def test_replay_of_a_root_and_continuing_from_the_replayed_reply(
    toy, store, scripted, chain_checker
) -> None:
    sampler = scripted(["A", "B", "C"])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)
    first = chat(engine, "s", [user("q")])
    again = chat(engine, "s", [user("q")])
    assert again.mode == "replay"
    assert again.trace_id == first.trace_id
    assert len(store.chain("s")) == 1
    nxt = chat(engine, "s", [user("q"), again.message, user("next")])
    assert nxt.mode == "extend"
    assert nxt.prompt_token_ids[: len(again.prompt_token_ids) + 2] == (
        [*again.prompt_token_ids, *enc("B"), IM_END]
    )
    chain_checker(store.session("s"), sampler.requests)


def test_two_lineages_keep_separate_chains(toy, store, scripted, chain_checker) -> None:
    sampler = scripted(["m0", "s0", "m1", "s1", "m2"])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)
    main = [system("You lead."), user("Plan the work.")]
    sub = [system("You are a helper."), user("Find the file.")]
    results = []
    for turn in range(5):
        conversation = main if turn % 2 == 0 else sub
        result = chat(engine, "s", conversation)
        results.append(result)
        conversation += [result.message, user(f"continue {turn}")]

    assert [(r.lineage_id, r.turn, r.mode) for r in results] == [
        ("main", 0, "root"),
        ("lineage-1", 0, "root"),
        ("main", 1, "extend"),
        ("lineage-1", 1, "extend"),
        ("main", 2, "extend"),
    ]
    traces = store.session("s")
    main_chain = chain_checker(traces, sampler.requests, "main")
    sub_chain = chain_checker(traces, sampler.requests, "lineage-1")
    assert [t.record.trace_id for t in main_chain] == [results[i].trace_id for i in (0, 2, 4)]
    assert [t.record.trace_id for t in sub_chain] == [results[i].trace_id for i in (1, 3)]
    assert sub_chain[1].record.parent_trace_id == results[1].trace_id
    root = toy.render(main[:2], add_generation_prompt=True).token_ids
    assert main_chain[0].prompt_token_ids == root
    stats = engine.session_stats("s")
    assert stats.lineages == ("main", "lineage-1")
    assert (stats.turns, stats.resets) == (5, {})


def test_truncated_completion_then_a_new_user_turn(toy, store, scripted, chain_checker) -> None:
    sampler = scripted(["Hello there", "Sure."])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)
    first = chat(engine, "s", [user("Hi")], params=SamplingParams(max_tokens=3))
    assert first.completion_token_ids == enc("Hel")
    assert first.finish_reason == "length"
    assert first.message.content == "Hel"

    second = chat(engine, "s", [user("Hi"), first.message, user("Finish it")])
    assert second.mode == "extend"
    # The close token the model never produced is synthesized at the start of the delta.
    delta = [IM_END, *enc("\n"), *block("user", "Finish it"), *GEN]
    assert second.prompt_token_ids == first.prompt_token_ids + enc("Hel") + delta
    records = store.chain("s")
    assert records[0].finish_reason == "length"
    assert records[1].prompt_delta_token_ids == delta
    chain_checker(store.session("s"), sampler.requests)


READ_FILE = ToolSpec(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)


def test_tool_call_turns(toy, store, scripted, chain_checker) -> None:
    calls = (
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>\n'
        "<tool_call>\n{not json}\n</tool_call>"
    )
    sampler = scripted([calls, "It says hi."])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)
    messages = [system("Use tools."), user("Read a.txt")]
    first = chat(engine, "s", messages, tools=(READ_FILE,))

    assert first.finish_reason == "tool_calls"
    call_id = f"call_{first.trace_id[:12]}_0"
    assert first.message.tool_calls == (
        ToolCall(id=call_id, name="read_file", arguments='{"path": "a.txt"}'),
    )
    assert [a.status for a in first.tool_call_attempts] == ["ok", "invalid_json"]
    assert first.tool_call_attempts[0].call == first.message.tool_calls[0]
    assert first.prompt_token_ids == toy.render(messages, [READ_FILE], True).token_ids

    # The client echoes the call back with its own JSON spacing and adds the tool result.
    echoed = Message(
        role="assistant",
        content=first.message.content,
        tool_calls=(ToolCall(id=call_id, name="read_file", arguments='{"path":"a.txt"}'),),
    )
    result = Message(role="tool", content="hi", tool_call_id=call_id)
    second = chat(engine, "s", [*messages, echoed, result], tools=(READ_FILE,))
    assert second.mode == "extend"
    assert second.finish_reason == "stop"
    assert second.message.content == "It says hi."
    delta = enc("\n") + block("tool", "hi") + GEN
    assert second.prompt_token_ids == first.prompt_token_ids + first.completion_token_ids + delta
    chain = chain_checker(store.session("s"), sampler.requests)
    assert chain[1].record.messages_delta == (result, second.message)


def test_concurrent_sessions(toy, store, scripted, chain_checker) -> None:
    in_flight = {"now": 0, "most": 0}

    async def answer(request):
        in_flight["now"] += 1
        in_flight["most"] = max(in_flight["most"], in_flight["now"])
        await asyncio.sleep(0.002)
        in_flight["now"] -= 1
        return f"seen {len(request.prompt_token_ids)}"

    sampler = scripted(answer)
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)

    async def converse(n: int) -> list[str]:
        messages = [system(f"Agent {n}."), user("start")]
        seen = []
        for turn in range(4):
            result = await engine.chat(f"s{n}", ChatRequest(messages=tuple(messages)))
            assert result.mode == ("root" if turn == 0 else "extend")
            seen.append(result.trace_id)
            messages += [result.message, user(f"turn {turn} of agent {n}")]
        return seen

    async def main() -> list[list[str]]:
        return await asyncio.gather(*(converse(n) for n in range(8)))

    trace_ids = asyncio.run(main())
    assert in_flight["most"] > 1
    assert engine.session_ids() == [f"s{n}" for n in range(8)]
    for n, ids in enumerate(trace_ids):
        chain = chain_checker(store.session(f"s{n}"), sampler.requests)
        assert [t.record.trace_id for t in chain] == ids
        assert chain[0].prompt_token_ids[: len(block("system", f"Agent {n}."))] == block(
            "system", f"Agent {n}."
        )


def test_requests_of_one_lineage_are_serialized(toy, store, scripted) -> None:
    in_flight = {"now": 0, "most": 0}

    async def answer(request):
        in_flight["now"] += 1
        in_flight["most"] = max(in_flight["most"], in_flight["now"])
        await asyncio.sleep(0.005)
        in_flight["now"] -= 1
        return "same"

    engine = GatewayEngine(renderer=toy, sampler=scripted(answer), trace_store=store)
    request = ChatRequest(messages=(user("once"),))

    async def main():
        return await asyncio.gather(*(engine.chat("s", request) for _ in range(3)))

    results = asyncio.run(main())
    assert in_flight["most"] == 1
    assert [r.mode for r in results] == ["root", "replay", "replay"]
    assert len({r.trace_id for r in results}) == 1
    assert len(store.chain("s")) == 1


def test_reasoning_the_client_drops_still_extends(toy, store, scripted) -> None:
    sampler = scripted(["<think>\nhm\n</think>\n\nYes.", "No.", "Maybe."])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)
    first = chat(engine, "s", [user("Q1")])
    assert (first.message.reasoning, first.message.content) == ("hm", "Yes.")
    dropped = Message(role="assistant", content="Yes.")
    assert chat(engine, "s", [user("Q1"), dropped, user("Q2")]).mode == "extend"

    edited = Message(role="assistant", content="Yes.", reasoning="something else")
    reset = chat(engine, "s", [user("Q1"), edited, user("Q2")])
    assert (reset.mode, reset.reset_reason, reset.divergent_message) == (
        "reset",
        "history_edited",
        1,
    )
