"""Fixtures for the vLLM sampler tests: fake vLLM workers on ephemeral ports, and gateways
(toy renderer, in-memory trace store) serving a pool with the official ``openai`` client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from reference.gateway_fixtures import store, toy  # noqa: F401
from rllm_core.gateway.server import Gateway
from rllm_core.testing.fakeworker import FakeWorker


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


@pytest.fixture
def serve(toy, store) -> Iterator[Callable[..., Gateway]]:  # noqa: F811
    """``serve(sampler, **options)`` starts a :class:`Gateway` on the toy renderer and the
    test's memory store in a background thread; every one is stopped after the test."""
    started: list[Gateway] = []

    def start(sampler: Any, **options: Any) -> Gateway:
        gateway = Gateway(renderer=toy, sampler=sampler, trace_store=store, **options)
        gateway.start()
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


@pytest.fixture
def client() -> Callable[..., openai.OpenAI]:
    """``client(gateway, session_id)``: the official client on one session, without retries
    unless asked (so a test sees every failure)."""

    def make(gateway: Gateway, session_id: str, **options: Any) -> openai.OpenAI:
        options.setdefault("max_retries", 0)
        options.setdefault("timeout", 30.0)
        return openai.OpenAI(
            base_url=gateway.session_url(session_id), api_key=gateway.token, **options
        )

    return make
