"""A real gateway on an ephemeral port, backed by a scripted sampler, the toy renderer and an
in-memory trace store, for the harness tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from reference.toy_renderer import ToyChatRenderer
from reference_stores import MemoryTraceStore
from rllm_core.gateway.server import Gateway
from rllm_core.testing.samplers import ScriptedSampler


@pytest.fixture
def toy() -> ToyChatRenderer:
    return ToyChatRenderer()


@pytest.fixture
def store() -> MemoryTraceStore:
    return MemoryTraceStore()


@pytest.fixture
def gateway(toy, store) -> Iterator[Callable[..., tuple[Gateway, ScriptedSampler]]]:
    """``gateway(script, **options)`` serves a gateway whose sampler answers from ``script``;
    returns it with the sampler. Every gateway is stopped after the test."""
    started: list[Gateway] = []

    def start(script: Any, **options: Any) -> tuple[Gateway, ScriptedSampler]:
        sampler = ScriptedSampler(script, renderer=toy)
        server = Gateway(renderer=toy, sampler=sampler, trace_store=store, **options)
        server.start()
        started.append(server)
        return server, sampler

    yield start
    for server in started:
        server.stop()
