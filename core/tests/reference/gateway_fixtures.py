"""Fixtures for harness tests: a real gateway on an ephemeral port, backed by a scripted sampler,
the toy renderer and an in-memory trace store. A harness's ``conftest.py`` imports them::

    from reference.gateway_fixtures import gateway, store, toy  # noqa: F401
"""

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
    """``gateway(script, delay_s=0.0, **options)`` serves a gateway whose sampler answers from
    ``script`` (after ``delay_s`` per call); returns it with the sampler. Every gateway is
    stopped after the test."""
    started: list[Gateway] = []

    def start(script: Any, *, delay_s: float = 0.0, **options: Any):
        sampler = ScriptedSampler(script, renderer=toy, delay_s=delay_s)
        server = Gateway(renderer=toy, sampler=sampler, trace_store=store, **options)
        server.start()
        started.append(server)
        return server, sampler

    yield start
    for server in started:
        server.stop()
