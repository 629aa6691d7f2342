"""One session through the engine (extensions, a replay, a reset, a sub-agent lineage, a
truncation) read back from every available trace store: the reference memory store here, and
the ``deltachain`` plugin's ``memory`` and on-disk stores when that plugin is installed. The
rebuilt prompts must equal what the sampler received, and the completions and logprobs what
it returned."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path

import pytest
from reference.toy_renderer import ToyChatRenderer
from reference_stores import MemoryTraceStore
from rllm_core.gateway.engine import ChatRequest, GatewayEngine
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import Message, SamplingParams


def _store(kind: str, folder: Path):
    if kind == "reference":
        return MemoryTraceStore()
    try:
        if kind == "deltachain-memory":
            return importlib.import_module("rllm_trace_store_deltachain.memory").MemoryTraceStore()
        config = importlib.import_module("rllm_trace_store_deltachain.plugin").DeltaChainConfig
        store = importlib.import_module("rllm_trace_store_deltachain.store").DeltaChainTraceStore
    except ImportError as exc:
        pytest.skip(f"rllm-trace-store-deltachain is not installed: {exc}")
    return store.from_config(config(path=folder))


@pytest.mark.parametrize("kind", ["reference", "deltachain-memory", "deltachain"])
def test_a_session_reads_back_exactly(kind, tmp_path, chain_checker) -> None:
    renderer = ToyChatRenderer()
    store = _store(kind, tmp_path / "traces")
    sampler = ScriptedSampler(
        ["m0", "sub0", "m1 is long", "m1 again", "m2", "m3"], renderer=renderer
    )
    engine = GatewayEngine(renderer=renderer, sampler=sampler, trace_store=store)

    def chat(messages, **kwargs):
        request = ChatRequest(messages=tuple(messages), **kwargs)
        return asyncio.run(engine.chat("s", request))

    main = [Message(role="system", content="lead"), Message(role="user", content="go")]
    r0 = chat(main)
    sub = chat([Message(role="system", content="helper"), Message(role="user", content="find")])
    main += [r0.message, Message(role="user", content="more")]
    chat(main, params=SamplingParams(max_tokens=2))
    r1 = chat(main, params=SamplingParams(max_tokens=2))
    main += [r1.message, Message(role="user", content="next")]
    chat(main)
    edited = [main[0], Message(role="user", content="start over")]
    reset = chat(edited)

    assert r1.mode == "replay"
    assert reset.reset_reason == "history_edited"
    results = {r.trace_id: r for r in (r0, sub, r1, reset)}
    traces = store.session("s")
    assert len(traces) == 5
    chain_checker(traces, sampler.requests, "main")
    chain_checker(traces, sampler.requests, "lineage-1")
    for trace in traces:
        if trace.record.trace_id in results:
            result = results[trace.record.trace_id]
            assert trace.record.completion_token_ids == result.completion_token_ids
            assert trace.record.logprobs == result.logprobs
    assert [(t.record.lineage_id, t.record.turn) for t in traces] == [
        ("lineage-1", 0),
        ("main", 0),
        ("main", 1),
        ("main", 2),
        ("main", 3),
    ]
    assert [t.record.finish_reason for t in traces if t.record.lineage_id == "main"] == [
        "stop",
        "length",
        "stop",
        "stop",
    ]
    engine.delete_session("s")
    assert store.session("s") == []
    store.close()
