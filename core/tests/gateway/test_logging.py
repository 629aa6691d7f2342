"""What ``rllm-core gateway serve`` writes to stderr: each gateway event once."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterator

import pytest
from reference.toy_renderer import ToyChatRenderer
from reference_stores import MemoryTraceStore
from rllm_core.gateway.engine import ChatRequest, GatewayEngine
from rllm_core.gateway.server import log_events
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import Message


@pytest.fixture
def streams() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """A root handler as the command line installs one, and the stream given to
    :func:`log_events`; the loggers are put back afterwards."""
    root, package = logging.getLogger(), logging.getLogger("rllm_core")
    saved = (package.level, package.propagate, list(package.handlers))
    root_stream, events_stream = io.StringIO(), io.StringIO()
    root_handler = logging.StreamHandler(root_stream)
    root.addHandler(root_handler)
    try:
        log_events("debug", events_stream)
        log_events("info", events_stream)
        yield root_stream, events_stream
    finally:
        root.removeHandler(root_handler)
        package.setLevel(saved[0])
        package.propagate = saved[1]
        package.handlers[:] = saved[2]


def test_a_cumulative_reset_is_written_once_and_nothing_else_is(streams) -> None:
    root_stream, events_stream = streams
    toy = ToyChatRenderer()
    engine = GatewayEngine(
        renderer=toy,
        sampler=ScriptedSampler(["a", "b", "c"], renderer=toy),
        trace_store=MemoryTraceStore(),
    )

    def chat(*messages: Message) -> Message:
        result = asyncio.run(engine.chat("s", ChatRequest(messages=messages)))
        return result.message

    q, r = Message(role="user", content="q"), Message(role="user", content="r")
    first = chat(q)
    chat(q, first, r)
    chat(q, Message(role="assistant", content="edited"), r)
    logging.getLogger("rllm_core.gateway").debug("below the level")

    lines = events_stream.getvalue().splitlines()
    assert len(lines) == 1
    assert " INFO rllm_core.gateway: token reset session=s lineage=main" in lines[0]
    assert root_stream.getvalue() == ""
