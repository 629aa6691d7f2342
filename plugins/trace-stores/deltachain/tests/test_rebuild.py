"""Prompt rebuilding on hand-built chains, and the memory store's single-trace read."""

from __future__ import annotations

from rllm_core.testing.suites.storage import expected_prompts, make_trace_chain
from rllm_core.types import TraceRecord
from rllm_trace_store_deltachain.memory import MemoryTraceStore
from rllm_trace_store_deltachain.rebuild import order_key, rebuild_prompts


def _r(trace_id, parent, delta, completion, turn=0, lineage="main"):
    return TraceRecord(
        trace_id=trace_id,
        session_id="s",
        lineage_id=lineage,
        turn=turn,
        parent_trace_id=parent,
        prompt_delta_token_ids=delta,
        completion_token_ids=completion,
        logprobs=[-1.0] * len(completion),
    )


def test_forks_do_not_see_each_other():
    records = {
        r.trace_id: r
        for r in [
            _r("a", None, [1, 2], [3]),
            _r("b", "a", [4], [5, 6], turn=1),
            _r("c", "a", [7], [8], turn=1),
            _r("d", "b", [9], [], turn=2),
            _r("e", "c", [], [10], turn=2),
        ]
    }
    assert rebuild_prompts(records) == {
        "a": ([1, 2], True),
        "b": ([1, 2, 3, 4], True),
        "c": ([1, 2, 3, 7], True),
        "d": ([1, 2, 3, 4, 5, 6, 9], True),
        "e": ([1, 2, 3, 7, 8], True),
    }


def test_every_prompt_is_a_distinct_list():
    records = {r.trace_id: r for r in make_trace_chain("s", 4, seed=1)}
    prompts = rebuild_prompts(records)
    lists = [prompt for prompt, _ in prompts.values()]
    assert len({id(p) for p in lists}) == 4
    lists[0].append(-1)
    assert rebuild_prompts(records) == {
        t: (p, True) for t, p in expected_prompts(records.values()).items()
    }


def test_gap_and_loop_are_incomplete_and_keep_only_proven_tokens():
    records = {
        r.trace_id: r
        for r in [
            _r("child", "lost", [5], [6], turn=3),
            _r("grandchild", "child", [7], [8], turn=4),
            _r("x", "y", [1], [2]),
            _r("y", "x", [3], [4]),
            _r("self", "self", [9], [9]),
        ]
    }
    prompts = rebuild_prompts(records)
    assert prompts["child"] == ([5], False)
    assert prompts["grandchild"] == ([5, 6, 7], False)
    assert not prompts["x"][1] and not prompts["y"][1]
    assert prompts["self"] == ([9], False)


def test_a_snapshot_stands_in_for_the_ancestors():
    records = {
        r.trace_id: r
        for r in [_r("mid", "lost", [5], [6], turn=7), _r("leaf", "mid", [7], [], turn=8)]
    }
    prompts = rebuild_prompts(records, {"mid": [1, 2, 3, 4, 5]})
    assert prompts == {"mid": ([1, 2, 3, 4, 5], True), "leaf": ([1, 2, 3, 4, 5, 6, 7], True)}


def test_order_is_lineage_turn_then_trace_id():
    records = [
        _r("z", None, [], [], turn=1, lineage="b"),
        _r("y", None, [], [], turn=1, lineage="a"),
        _r("x", None, [], [], turn=1, lineage="a"),
        _r("w", None, [], [], turn=0, lineage="b"),
    ]
    assert [r.trace_id for r in sorted(records, key=order_key)] == ["x", "y", "w", "z"]


def test_memory_store_reads_one_trace():
    store = MemoryTraceStore()
    records = make_trace_chain("s", 5, seed=2)
    for record in records[:2] + records[3:]:
        store.append(record)
    truth = expected_prompts(records)
    first = store.trace("s", records[1].trace_id)
    assert first is not None and first.chain_complete
    assert first.prompt_token_ids == truth[records[1].trace_id]
    broken = store.trace("s", records[4].trace_id)
    assert broken is not None and not broken.chain_complete
    assert broken.prompt_token_ids == (
        records[3].prompt_delta_token_ids
        + records[3].completion_token_ids
        + records[4].prompt_delta_token_ids
    )
    assert store.trace("s", "nope") is None
    assert store.trace("other", records[0].trace_id) is None
