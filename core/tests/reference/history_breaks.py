"""A conversation an agent summarizes mid-episode, served by a gateway engine over the toy
renderer: calls 1-3 extend, call 4 replaces the first two exchanges by a summary and keeps the
third, calls 5-6 extend again."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from reference.toy_renderer import ToyChatRenderer
from rllm_core.gateway.engine import ChatRequest, ChatResult, GatewayEngine
from rllm_core.ports import TraceStore
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import Message

SYSTEM = Message(role="system", content="You fix failing tests in a repository.")
SUMMARY = Message(
    role="user",
    content="Summary so far: the failing test is test_parse; parse() drops the last field.",
)
REPLIES = [
    "Let me run the tests.",
    "test_parse fails; I will read parse().",
    "parse() splits on commas and drops the last field.",
    "I will fix the slice in parse().",
    "The slice is fixed; running the tests again.",
    "All tests pass.",
]


def user(text: str) -> Message:
    return Message(role="user", content=text)


@dataclass
class Summarized:
    """What :func:`summarized_conversation` sent and got back."""

    requests: list[list[Message]]
    results: list[ChatResult]
    sampler: ScriptedSampler


def summarized_conversation(
    store: TraceStore, *, session: str = "s", cumulative: bool = True
) -> Summarized:
    """Serve the six calls of session ``session`` into ``store``."""
    renderer = ToyChatRenderer()
    sampler = ScriptedSampler(REPLIES, renderer=renderer)
    engine = GatewayEngine(
        renderer=renderer, sampler=sampler, trace_store=store, cumulative=cumulative
    )
    requests: list[list[Message]] = []
    results: list[ChatResult] = []

    def call(messages: list[Message]) -> list[Message]:
        requests.append(list(messages))
        result = asyncio.run(engine.chat(session, ChatRequest(messages=tuple(messages))))
        results.append(result)
        return [*messages, result.message]

    history = call([SYSTEM, user("Fix the failing test.")])
    history = call([*history, user("FAILED test_parse")])
    history = call([*history, user("def parse(line): return line.split(',')[:-1]")])
    # The first two exchanges (four messages) become one summary; the third is kept.
    history = call([SYSTEM, SUMMARY, *history[5:], user("Go ahead.")])
    history = call([*history, user("patched parse.py")])
    call([*history, user("5 passed")])
    return Summarized(requests=requests, results=results, sampler=sampler)
