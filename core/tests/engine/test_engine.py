"""The engine around the accumulator: plain mode, enforced parameters, prompt limits,
completions, session listing, stats and deletion, and sampler failures."""

from __future__ import annotations

import asyncio

import pytest
from reference.toy_renderer import END_OF_TEXT, IM_END, IM_START, ToyTokenizer
from rllm_core.gateway.engine import (
    ChatRequest,
    GatewayEngine,
    GatewayError,
    InvalidChatRequestError,
    PromptTooLongError,
    UnknownSessionError,
)
from rllm_core.testing.samplers import scripted_logprob
from rllm_core.types import Message, SamplingParams, TraceRecord

enc = ToyTokenizer().encode
GEN = [IM_START, *enc("assistant\n")]


def user(text: str) -> Message:
    return Message(role="user", content=text)


def chat(engine: GatewayEngine, session: str, messages, **kwargs):
    return asyncio.run(engine.chat(session, ChatRequest(messages=tuple(messages), **kwargs)))


# ------------------------------------------------------------------------------ plain mode


def test_plain_mode_renders_in_full_and_still_chains(toy, store, scripted, chain_checker) -> None:
    sampler = scripted(["One.", "Hello there", "Three."])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store, cumulative=False)
    messages = [user("a")]
    results = []
    for n, max_tokens in enumerate((256, 3, 256)):
        result = chat(engine, "s", messages, params=SamplingParams(max_tokens=max_tokens))
        results.append(result)
        messages += [result.message, user(f"b{n}")]

    assert [r.mode for r in results] == ["root", "extend", "extend"]
    assert results[1].finish_reason == "length"
    for n in range(3):
        rendered = toy.render(messages[: 2 * n + 1], add_generation_prompt=True).token_ids
        assert sampler.requests[n].prompt_token_ids == rendered
    records = store.chain("s")
    closed = [*enc("\n"), IM_START, *enc("user\nb0"), IM_END, *enc("\n"), *GEN]
    assert records[1].prompt_delta_token_ids == closed
    # The truncated completion "Hel" is rendered back with the close the model never wrote.
    assert records[2].prompt_delta_token_ids[0] == IM_END
    chain = chain_checker(store.session("s"), sampler.requests)
    parents = [t.record.parent_trace_id for t in chain]
    assert parents == [None, results[0].trace_id, results[1].trace_id]


def test_plain_mode_starts_a_root_when_the_render_does_not_extend_the_tokens(
    toy, store, scripted, chain_checker
) -> None:
    # A turn that stopped on <|endoftext|> renders back with <|im_end|>: the tokens differ.
    sampler = scripted([[*enc("x"), END_OF_TEXT], "y"])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store, cumulative=False)
    first = chat(engine, "s", [user("q")])
    second = chat(engine, "s", [user("q"), first.message, user("r")])
    assert (second.mode, second.reset_reason) == ("reset", "renderer_no_bridge")
    assert store.chain("s")[1].parent_trace_id is None
    chain_checker(store.session("s"), sampler.requests)


def test_plain_mode_replay_and_history_edited(toy, store, scripted) -> None:
    engine = GatewayEngine(
        renderer=toy, sampler=scripted(["a", "b", "c"]), trace_store=store, cumulative=False
    )
    first = chat(engine, "s", [user("q")])
    again = chat(engine, "s", [user("q")])
    assert (again.mode, again.trace_id) == ("replay", first.trace_id)
    edited = chat(engine, "s", [user("q"), Message(role="assistant", content="zzz"), user("r")])
    assert (edited.mode, edited.reset_reason, edited.divergent_message) == (
        "reset",
        "history_edited",
        1,
    )


# ------------------------------------------------------------------------------ sampling


def test_session_enforced_params_replace_the_requested_ones(toy, store, scripted) -> None:
    sampler = scripted(["a", "b", "c"])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)
    engine.configure_session("s", enforced=SamplingParams(max_tokens=5, temperature=0.5, top_p=0.9))
    asked = SamplingParams(max_tokens=900, temperature=1.4, top_p=0.3, seed=11)
    first = chat(engine, "s", [user("q")], params=asked)
    assert sampler.requests[0].params == SamplingParams(
        max_tokens=5, temperature=0.5, top_p=0.9, seed=None, stop_token_ids=(IM_END, END_OF_TEXT)
    )
    other = chat(engine, "t", [user("q")], params=asked)
    assert sampler.requests[1].params == SamplingParams(
        max_tokens=900, temperature=1.4, top_p=0.3, seed=11, stop_token_ids=(IM_END, END_OF_TEXT)
    )
    engine.configure_session("s", enforced=None)
    chat(engine, "s", [user("q"), first.message, user("r")], params=asked)
    assert sampler.requests[2].params.temperature == 1.4
    assert other.mode == "root"


def test_sampler_failure_records_nothing_and_the_retry_is_served(
    toy, store, scripted, chain_checker
) -> None:
    sampler = scripted([ConnectionError("worker gone"), "fine"])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)
    with pytest.raises(ConnectionError, match="worker gone"):
        chat(engine, "s", [user("q")])
    assert store.chain("s") == []
    retried = chat(engine, "s", [user("q")])
    assert (retried.mode, retried.turn) == ("root", 0)
    assert engine.session_stats("s").turns == 1
    chain_checker(store.session("s"), sampler.requests)


def test_weight_version_is_recorded_per_call(toy, store, scripted) -> None:
    sampler = scripted(["a", "b"], weight_version=1)
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store, model="m-7")
    first = chat(engine, "s", [user("q")])
    sampler.weight_version = 2
    second = chat(engine, "s", [user("q"), first.message, user("r")])
    assert (first.weight_version, second.weight_version) == (1, 2)
    assert [(r.weight_version, r.model) for r in store.chain("s")] == [(1, "m-7"), (2, "m-7")]
    assert all(r.latency_s >= 0 and r.created_at > 0 for r in store.chain("s"))


# ------------------------------------------------------------------------------ limits


def test_over_long_prompts_are_refused_before_sampling(toy, store, scripted) -> None:
    sampler = scripted(["ok", "fine"])
    first_len = len(toy.render([user("short")], add_generation_prompt=True).token_ids)
    engine = GatewayEngine(
        renderer=toy, sampler=sampler, trace_store=store, max_prompt_tokens=first_len + 30
    )
    first = chat(engine, "s", [user("short")])
    long_turn = [user("short"), first.message, user("x" * 40)]
    # "\n", <|im_start|>, "user\n" (5), 40 x, <|im_end|>, "\n", then the 11-id generation prompt
    expected = len(first.prompt_token_ids) + len(first.completion_token_ids) + 60
    with pytest.raises(PromptTooLongError) as caught:
        chat(engine, "s", long_turn)
    error = caught.value
    assert (error.prompt_tokens, error.max_prompt_tokens) == (expected, first_len + 30)
    assert f"has {expected} tokens, over the gateway's limit of {first_len + 30}" in str(error)
    assert isinstance(error, GatewayError)
    assert sampler.calls == 1
    assert len(store.chain("s")) == 1
    # Nothing changed: a shorter next turn still extends the first.
    after = chat(engine, "s", [user("short"), first.message, user("ok")])
    assert (after.mode, after.turn) == ("extend", 1)
    with pytest.raises(ValueError, match="max_prompt_tokens must be at least 1"):
        GatewayEngine(renderer=toy, sampler=sampler, trace_store=store, max_prompt_tokens=0)


def test_a_request_without_messages_is_invalid(toy, store, scripted) -> None:
    engine = GatewayEngine(renderer=toy, sampler=scripted([]), trace_store=store)
    with pytest.raises(InvalidChatRequestError, match="has no messages"):
        chat(engine, "s", [])


# ------------------------------------------------------------------------------ completions


def test_completions_are_roots_in_their_own_lineage(toy, store, scripted) -> None:
    sampler = scripted(["world", [7, 8, 9]])
    engine = GatewayEngine(renderer=toy, sampler=sampler, trace_store=store)
    text = asyncio.run(engine.complete("s", "Hello ", SamplingParams(max_tokens=20)))
    ids = asyncio.run(engine.complete("s", [1, 2, 3], SamplingParams(max_tokens=2)))

    assert text.prompt_token_ids == enc("Hello ")
    assert text.completion_token_ids == [*enc("world"), IM_END]
    assert text.text == "world"
    assert text.finish_reason == "stop"
    assert text.logprobs == [scripted_logprob(t, i) for i, t in enumerate([*enc("world"), IM_END])]
    assert ids.prompt_token_ids == [1, 2, 3]
    assert ids.completion_token_ids == [7, 8]
    assert (ids.finish_reason, ids.text) == ("length", "\x07\x08")
    assert sampler.requests[1].params.stop_token_ids == (IM_END, END_OF_TEXT)
    records = store.chain("s")
    assert [(r.lineage_id, r.turn, r.parent_trace_id) for r in records] == [
        ("completions", 0, None),
        ("completions", 1, None),
    ]
    assert [r.trace_id for r in records] == [text.trace_id, ids.trace_id]
    assert records[0].prompt_delta_token_ids == enc("Hello ")
    stats = engine.session_stats("s")
    assert (stats.completions, stats.turns, stats.lineages) == (2, 0, ())
    with pytest.raises(InvalidChatRequestError, match="empty prompt"):
        asyncio.run(engine.complete("s", "", SamplingParams()))


# ------------------------------------------------------------------------------ sessions


def test_listing_stats_and_deleting_sessions(toy, store, scripted) -> None:
    store.append(
        TraceRecord(
            trace_id="old-1",
            session_id="earlier",
            prompt_delta_token_ids=[1],
            completion_token_ids=[2],
            logprobs=[-0.5],
        )
    )
    store.append(
        TraceRecord(
            trace_id="old-2",
            session_id="earlier",
            turn=1,
            prompt_delta_token_ids=[3],
            completion_token_ids=[4],
            logprobs=[-0.5],
            reset_reason="prefix_changed",
        )
    )
    engine = GatewayEngine(renderer=toy, sampler=scripted(["a", "b", "c"]), trace_store=store)
    chat(engine, "s2", [user("q")])
    chat(engine, "s1", [user("q")])
    engine.configure_session("s3")
    assert engine.session_ids() == ["earlier", "s1", "s2", "s3"]

    stored = engine.session_stats("earlier")
    assert (stored.live, stored.turns, stored.resets, stored.lineages) == (
        False,
        2,
        {"prefix_changed": 1},
        ("main",),
    )
    live = engine.session_stats("s1")
    assert (live.live, live.turns, live.replays, live.completions) == (True, 1, 0, 0)

    engine.delete_session("s1")
    engine.delete_session("earlier")
    assert store.session("s1") == [] and store.session("earlier") == []
    assert engine.session_ids() == ["s2", "s3"]
    for missing in ("s1", "nope"):
        with pytest.raises(UnknownSessionError, match=f"no session '{missing}'"):
            engine.session_stats(missing)
        with pytest.raises(UnknownSessionError):
            engine.delete_session(missing)
    again = chat(engine, "s1", [user("q")])
    assert (again.mode, again.turn, again.lineage_id) == ("root", 0, "main")


def test_a_session_deleted_during_a_call_is_not_recreated_in_the_store(
    toy, store, scripted
) -> None:
    async def scenario():
        started = asyncio.Event()
        release = asyncio.Event()

        async def slow(request):
            started.set()
            await release.wait()
            return "late"

        engine = GatewayEngine(renderer=toy, sampler=scripted(slow), trace_store=store)
        call = asyncio.create_task(engine.chat("s", ChatRequest(messages=(user("q"),))))
        await started.wait()
        engine.delete_session("s")
        release.set()
        return engine, await call

    engine, result = asyncio.run(scenario())
    assert result.message.content == "late"
    assert store.chain("s") == []
    assert engine.session_ids() == []


def test_a_released_session_keeps_its_traces_and_restarts_fresh(toy, store, scripted) -> None:
    engine = GatewayEngine(renderer=toy, sampler=scripted(["One.", "Two."]), trace_store=store)
    first = chat(engine, "s", [user("a")])
    engine.release_session("s")
    engine.release_session("never-seen")
    assert [r.trace_id for r in store.chain("s")] == [first.trace_id]
    assert engine.session_ids() == ["s"]
    second = chat(engine, "s", [user("a"), first.message, user("b")])
    assert (second.mode, second.turn) == ("root", 0)
