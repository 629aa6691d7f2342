"""Gateway fixtures several test folders share: the toy renderer and an in-memory trace store
(``toy``, ``store``); a real gateway on an ephemeral port backed by a scripted sampler
(``gateway``, for harness tests) or by any sampler (``serve``); the official ``openai``
client on one session (``client``); fake vLLM workers (``workers``). A ``conftest.py``
imports the ones it needs::

    from reference.gateway_fixtures import gateway, store, toy  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from reference.toy_renderer import ToyChatRenderer
from reference_stores import MemoryTraceStore
from rllm_core.gateway.server import Gateway
from rllm_core.testing.fakeworker import FakeWorker
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


@pytest.fixture
def serve(toy, store) -> Iterator[Callable[..., Gateway]]:
    """``serve(sampler, **options)`` starts a :class:`Gateway` (the toy renderer and the test's
    memory store unless given) in a background thread; every one is stopped after the test."""
    started: list[Gateway] = []

    def start(sampler: Any, **options: Any) -> Gateway:
        options.setdefault("renderer", toy)
        options.setdefault("trace_store", store)
        server = Gateway(sampler=sampler, **options)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def client() -> Callable[..., openai.OpenAI]:
    """``client(gateway, session_id)``: the official client on one session, without retries
    unless asked (so a test sees every failure)."""

    def make(gateway: Gateway, session_id: str, **options: Any) -> openai.OpenAI:
        options.setdefault("max_retries", 0)
        options.setdefault("timeout", 30.0)
        options.setdefault("api_key", gateway.token or "unused")
        return openai.OpenAI(base_url=gateway.session_url(session_id), **options)

    return make


@pytest.fixture
def workers() -> Iterator[Callable[..., FakeWorker]]:
    """``workers(**options)`` starts a :class:`FakeWorker`; all are stopped after the test."""
    started: list[FakeWorker] = []

    def start(**options: Any) -> FakeWorker:
        worker = FakeWorker(**options)
        worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
