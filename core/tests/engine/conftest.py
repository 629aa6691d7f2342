"""Fixtures for the gateway engine tests: the toy renderer, a memory trace store, and a
checker of the delta-chain contract."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from reference.toy_renderer import ToyChatRenderer
from reference_stores import MemoryTraceStore
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import SampleRequest, Trace


@pytest.fixture
def toy() -> ToyChatRenderer:
    return ToyChatRenderer()


@pytest.fixture
def store() -> MemoryTraceStore:
    return MemoryTraceStore()


def check_chain(
    traces: Sequence[Trace], requests: Sequence[SampleRequest], lineage_id: str = "main"
) -> list[Trace]:
    """Assert the delta-chain contract on one lineage's traces and return them in turn order.

    Every trace is complete; a child's prompt is its parent's prompt + completion + its own
    delta; a root stores its full prompt; and every rebuilt prompt is exactly the prompt the
    sampler received for that trace (matched by ``request_id``, the trace id).
    """
    received = {r.request_id: r.prompt_token_ids for r in requests}
    chain = [t for t in traces if t.record.lineage_id == lineage_id]
    assert chain, f"no traces in lineage {lineage_id!r}"
    by_id = {t.record.trace_id: t for t in chain}
    for trace in chain:
        record = trace.record
        assert trace.chain_complete, f"turn {record.turn} has a broken chain"
        if record.parent_trace_id is None:
            assert trace.prompt_token_ids == record.prompt_delta_token_ids
        else:
            parent = by_id[record.parent_trace_id]
            assert parent.record.turn < record.turn
            assert trace.prompt_token_ids == (
                parent.prompt_token_ids
                + parent.record.completion_token_ids
                + record.prompt_delta_token_ids
            )
        assert trace.prompt_token_ids == received[record.trace_id], (
            f"turn {record.turn}: the rebuilt prompt differs from what the sampler received"
        )
    return chain


@pytest.fixture
def chain_checker() -> Callable[..., list[Trace]]:
    return check_chain


@pytest.fixture
def scripted(toy: ToyChatRenderer) -> Callable[..., ScriptedSampler]:
    def make(script, **kwargs) -> ScriptedSampler:
        return ScriptedSampler(script, renderer=toy, **kwargs)

    return make
