"""The delta-chain store beyond the conformance suite: tombstones and replays across reopen,
snapshots, single-trace reads, compression against the context (after reopening, across a
replay of the parent, out of order), the round trip through any history with reopens in
between, and 1,000-turn chains without recursion."""

from __future__ import annotations

import inspect
import random
import struct
import sys
import uuid

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rllm_core.errors import StorageError
from rllm_core.storage.framing import FrameReader, encode_frame
from rllm_core.testing.suites.storage import (
    expected_prompts,
    make_long_trace_chain,
    make_trace_chain,
)
from rllm_core.types import TraceRecord
from rllm_trace_store_deltachain.codec import EntryCodec, SegmentTable
from rllm_trace_store_deltachain.context import MIN_CONTEXT_TOKENS
from rllm_trace_store_deltachain.memory import MemoryTraceStore
from rllm_trace_store_deltachain.segments import MAGIC
from rllm_trace_store_deltachain.store import DeltaChainTraceStore

_replace = msgspec.structs.replace


def _frames(path) -> list[tuple[bytes, object]]:
    """Every frame's payload on disk with its decoded head, in write order."""
    codec = EntryCodec()
    frames = []
    for segment in sorted(path.glob("segment-*.log")):
        table = SegmentTable()
        with open(segment, "rb") as handle:
            reader = FrameReader(handle, segment.stat().st_size, len(MAGIC), name=segment.name)
            for _, payload in reader:
                frames.append((payload, codec.decode_head(payload, table)))
    return frames


def _heads(path) -> list[tuple[str, int, bool]]:
    """``(trace_id, turn, has_snapshot)`` of every record frame on disk, in write order."""
    return [
        (head.trace_id, head.turn, head.has_snapshot)
        for _, head in _frames(path)
        if hasattr(head, "trace_id")
    ]


def _count_decodes(store: DeltaChainTraceStore, monkeypatch) -> list[str]:
    decoded: list[str] = []
    original = store._decode

    def counting(frame, context):
        result = original(frame, context)
        decoded.append(result.record.trace_id)
        return result

    monkeypatch.setattr(store, "_decode", counting)
    return decoded


# --------------------------------------------------------------------------------------------
# Deletion and replay survive reopening
# --------------------------------------------------------------------------------------------


def test_delete_survives_reopen_and_the_session_can_start_again(tmp_path):
    path = tmp_path / "t"
    old = make_trace_chain("s", 3, seed=1)
    keep = make_trace_chain("k", 2, seed=2)
    with DeltaChainTraceStore(path) as store:
        for record in old + keep:
            store.append(record)
        store.delete_session("s")
        store.delete_session("never-written")
    with DeltaChainTraceStore(path) as store:
        assert store.sessions() == ["k"]
        assert store.chain("s") == []
        assert store.session("s") == []
        assert store.chain("k") == keep
        new = make_trace_chain("s", 2, seed=3)
        for record in new:
            store.append(record)
    with DeltaChainTraceStore(path) as store:
        assert store.sessions() == ["k", "s"]
        assert store.chain("s") == new
    heads = _heads(path)
    assert len(heads) == 3 + 2 + 2  # the tombstone is not a record; no frame was rewritten


def test_deleting_an_absent_session_writes_nothing(tmp_path):
    with DeltaChainTraceStore(tmp_path / "t") as store:
        before = store.size_on_disk()
        store.delete_session("nobody")
        assert store.size_on_disk() == before == len(MAGIC)


def test_replay_wins_after_reopen(tmp_path):
    path = tmp_path / "t"
    records = make_trace_chain("s", 3, seed=4)
    replayed = _replace(records[1], completion_token_ids=[9, 9], logprobs=[-1.0, -2.0])
    with DeltaChainTraceStore(path) as store:
        for record in [*records, replayed]:
            store.append(record)
    with DeltaChainTraceStore(path) as store:
        assert store.chain("s") == [records[0], replayed, records[2]]
        traces = store.session("s")
        assert (
            traces[2].prompt_token_ids
            == expected_prompts([records[0], replayed, records[2]])[records[2].trace_id]
        )
    assert [trace_id for trace_id, _, _ in _heads(path)] == [
        records[0].trace_id,
        records[1].trace_id,
        records[2].trace_id,
        records[1].trace_id,
    ]


def test_same_trace_id_in_two_sessions_are_two_traces(tmp_path):
    a = make_trace_chain("a", 1, seed=5, id_prefix="same")[0]
    b = make_trace_chain("b", 1, seed=6, id_prefix="same")[0]
    with DeltaChainTraceStore(tmp_path / "t") as store:
        store.append(a)
        store.append(b)
        assert store.chain("a") == [a]
        assert store.chain("b") == [b]


def test_a_closed_store_refuses_calls(tmp_path):
    store = DeltaChainTraceStore(tmp_path / "t")
    store.close()
    store.close()
    for call in (
        lambda: store.append(make_trace_chain("s", 1)[0]),
        lambda: store.session("s"),
        lambda: store.chain("s"),
        lambda: store.sessions(),
        lambda: store.delete_session("s"),
        lambda: store.trace("s", "x"),
    ):
        with pytest.raises(StorageError, match="closed"):
            call()
    memory = MemoryTraceStore()
    memory.close()
    with pytest.raises(StorageError, match="closed"):
        memory.sessions()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"snapshot_every": -1}, "snapshot_every must be 0"),
        ({"segment_bytes": 100}, "segment_bytes must be at least 4096, got 100"),
        ({"compression_level": 0}, "compression_level must be 1 to 22"),
    ],
)
def test_bad_options_name_the_value(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        DeltaChainTraceStore(tmp_path / "t", **options)


def test_a_token_id_over_int32_is_refused_and_nothing_is_written(tmp_path):
    record = _replace(make_trace_chain("s", 1)[0], completion_token_ids=[1, 2**40])
    with DeltaChainTraceStore(tmp_path / "t") as store:
        with pytest.raises(ValueError, match=str(2**40)):
            store.append(record)
        assert store.sessions() == []
        assert store.size_on_disk() == len(MAGIC)


# --------------------------------------------------------------------------------------------
# Snapshots
# --------------------------------------------------------------------------------------------


def test_snapshot_every_k_records_down_a_chain(tmp_path):
    path = tmp_path / "t"
    records = make_trace_chain("s", 10, seed=7)
    fork = make_trace_chain("s", 3, parent=records[5], seed=8)
    with DeltaChainTraceStore(path, snapshot_every=4) as store:
        for record in records + fork:
            store.append(record)
    # depth from the root: the record at depth 4 gets a snapshot, then every 4th below it;
    # the fork counts from the snapshot at turn 4 (turn 6 is two below it, 8 four below it)
    assert [(turn, snap) for _, turn, snap in _heads(path)] == [
        (0, False),
        (1, False),
        (2, False),
        (3, False),
        (4, True),
        (5, False),
        (6, False),
        (7, False),
        (8, True),
        (9, False),
        (6, False),
        (7, False),
        (8, True),
    ]
    with DeltaChainTraceStore(path, snapshot_every=0) as store:
        truth = expected_prompts(records + fork)
        assert [t.prompt_token_ids for t in store.session("s")] == [
            truth[r.trace_id] for r in store.chain("s")
        ]


def test_single_trace_read_decodes_at_most_k_records(tmp_path, monkeypatch):
    records = make_trace_chain("s", 23, seed=9)
    truth = expected_prompts(records)
    with DeltaChainTraceStore(tmp_path / "t", snapshot_every=5) as store:
        for record in records:
            store.append(record)
        decoded = _count_decodes(store, monkeypatch)
        for record in records:
            decoded.clear()
            trace = store.trace("s", record.trace_id)
            assert trace is not None
            assert trace.record == record
            assert trace.chain_complete
            assert trace.prompt_token_ids == truth[record.trace_id]
            # turn t decodes itself and its ancestors down to the snapshot at 5 * (t // 5), or
            # down to the root before the first snapshot
            expected = record.turn % 5 + 1 if record.turn >= 5 else record.turn + 1
            assert len(decoded) == expected, f"turn {record.turn} decoded {decoded}"
        assert store.trace("s", "missing") is None
        assert store.trace("other", records[0].trace_id) is None


def test_without_snapshots_a_read_walks_to_the_root(tmp_path, monkeypatch):
    records = make_trace_chain("s", 12, seed=10)
    with DeltaChainTraceStore(tmp_path / "t") as store:
        for record in records:
            store.append(record)
        decoded = _count_decodes(store, monkeypatch)
        trace = store.trace("s", records[-1].trace_id)
        assert trace is not None
        assert trace.prompt_token_ids == expected_prompts(records)[records[-1].trace_id]
        # root first: a frame's context comes from the frames before it
        assert decoded == [r.trace_id for r in records]
    assert not any(snap for _, _, snap in _heads(tmp_path / "t"))


def test_a_replay_makes_older_snapshots_fall_back_to_their_chain(tmp_path, monkeypatch):
    path = tmp_path / "t"
    records = make_trace_chain("s", 6, seed=11)
    replayed = _replace(records[1], completion_token_ids=[4, 4, 4], logprobs=[-0.5] * 3)
    current = [records[0], replayed, *records[2:]]
    truth = expected_prompts(current)
    with DeltaChainTraceStore(path, snapshot_every=2) as store:
        for record in records:
            store.append(record)
        store.append(replayed)
        decoded = _count_decodes(store, monkeypatch)
        trace = store.trace("s", records[5].trace_id)
        assert trace is not None and trace.prompt_token_ids == truth[records[5].trace_id]
        # the snapshot at turn 4 predates the replay: the read walks to the root instead
        assert len(decoded) == 6
        assert [t.prompt_token_ids for t in store.session("s")] == [
            truth[r.trace_id] for r in current
        ]
        later = make_trace_chain("s", 1, parent=records[5], seed=12)[0]
        store.append(later)
        truth = expected_prompts([*current, later])
        decoded.clear()
        trace = store.trace("s", later.trace_id)
        assert trace is not None and trace.prompt_token_ids == truth[later.trace_id]
        assert decoded == [later.trace_id]  # a fresh snapshot, written after the replay
    with DeltaChainTraceStore(path, snapshot_every=2) as store:
        assert [t.prompt_token_ids for t in store.session("s")] == [
            truth[r.trace_id] for r in [*current, later]
        ]


def test_a_snapshot_completes_what_a_lost_ancestor_would_break(tmp_path):
    path = tmp_path / "t"
    records = make_trace_chain("s", 7, seed=13)
    with DeltaChainTraceStore(path, snapshot_every=3) as store:
        for record in records:
            store.append(record)
    # Write the segment again without the frame of turn 1, as if it had been lost. Heads are
    # coded against the frames before them, so the others are encoded afresh, snapshots kept.
    (segment,) = sorted(path.glob("segment-*.log"))
    codec, table = EntryCodec(), SegmentTable()
    kept = []
    for payload, head in _frames(path):
        if head.trace_id == records[1].trace_id:
            continue
        snapshot = codec.decode_record(payload, head).snapshot if head.has_snapshot else None
        record = next(r for r in records if r.trace_id == head.trace_id)
        kept.append(encode_frame(codec.encode_record(record, table, snapshot=snapshot).entry))
        table.note(head.session_id, head.lineage_id, head.trace_id)
    segment.write_bytes(MAGIC + b"".join(kept))
    truth = expected_prompts(records)
    with DeltaChainTraceStore(path, snapshot_every=3) as store:
        traces = {t.record.turn: t for t in store.session("s")}
        assert sorted(traces) == [0, 2, 3, 4, 5, 6]
        assert traces[0].chain_complete
        assert not traces[2].chain_complete
        assert traces[2].prompt_token_ids == records[2].prompt_delta_token_ids
        for turn in (3, 4, 5, 6):  # the snapshot at turn 3 holds its full prompt
            assert traces[turn].chain_complete
            assert traces[turn].prompt_token_ids == truth[records[turn].trace_id]
        single = store.trace("s", records[2].trace_id)
        assert single is not None and not single.chain_complete


def test_no_snapshot_for_an_incomplete_chain(tmp_path):
    path = tmp_path / "t"
    records = make_trace_chain("s", 6, seed=14)
    with DeltaChainTraceStore(path, snapshot_every=2) as store:
        for record in records[:1] + records[2:]:
            store.append(record)
        assert [t.chain_complete for t in store.session("s")] == [True] + [False] * 4
        store.append(records[1])
        truth = expected_prompts(records)
        assert [t.prompt_token_ids for t in store.session("s")] == [
            truth[r.trace_id] for r in records
        ]
    assert [(turn, snap) for _, turn, snap in _heads(path)] == [
        (0, False),
        (2, False),
        (3, False),
        (4, False),
        (5, False),
        (1, False),
    ]


# --------------------------------------------------------------------------------------------
# Compression against the context
# --------------------------------------------------------------------------------------------


def _text_chain(session_id: str, turns: int, seed: int, parent: TraceRecord | None = None):
    """A chain whose ids repeat like text: turns draw phrases from one small set (the same
    for every seed)."""
    vocabulary = random.Random(0)
    phrases = [
        [vocabulary.randrange(49_152) for _ in range(vocabulary.randint(2, 8))] for _ in range(30)
    ]
    rng = random.Random(seed)

    def take(count: int) -> list[int]:
        ids: list[int] = []
        while len(ids) < count:
            ids.extend(rng.choice(phrases))
        return ids[:count]

    records = []
    for _ in range(turns):
        completion = take(40)
        record = TraceRecord(
            trace_id=uuid.UUID(int=rng.getrandbits(128)).hex,
            session_id=session_id,
            turn=parent.turn + 1 if parent else 0,
            parent_trace_id=parent.trace_id if parent else None,
            prompt_delta_token_ids=take(120),
            completion_token_ids=completion,
            logprobs=[-rng.random() for _ in completion],
            created_at=rng.random(),
        )
        records.append(record)
        parent = record
    return records


def _with_context(path) -> list[bool]:
    return [head.has_context for _, head in _frames(path) if hasattr(head, "trace_id")]


def test_text_is_compressed_against_its_context_also_after_reopening(tmp_path):
    path = tmp_path / "t"
    records = _text_chain("s", 12, seed=1)
    with DeltaChainTraceStore(path, segment_bytes=4096) as store:
        for record in records[:8]:
            store.append(record)
    # after reopening, the first append finds its parent's tail by decoding the chain
    with DeltaChainTraceStore(path, segment_bytes=4096) as store:
        for record in records[8:]:
            store.append(record)
    assert len(list(path.glob("segment-*.log"))) > 1
    assert _with_context(path) == [False] + [True] * 11
    truth = expected_prompts(records)
    with DeltaChainTraceStore(path) as store:
        assert store.chain("s") == records
        assert [t.prompt_token_ids for t in store.session("s")] == [
            truth[r.trace_id] for r in records
        ]
        assert (
            store.trace("s", records[-1].trace_id).prompt_token_ids == truth[records[-1].trace_id]
        )


def test_context_saves_space_on_text(tmp_path):
    records = _text_chain("s", 12, seed=2)
    # the same ids as roots: no context, each frame is compressed alone
    roots = [_replace(record, parent_trace_id=None) for record in records]
    sizes = {}
    for name, batch in (("chain", records), ("roots", roots)):
        with DeltaChainTraceStore(tmp_path / name) as store:
            for record in batch:
                store.append(record)
            sizes[name] = store.size_on_disk()
    assert sizes["chain"] < 0.8 * sizes["roots"]


def test_children_decode_against_the_parent_frame_they_were_written_with(tmp_path):
    path = tmp_path / "t"
    records = _text_chain("s", 5, seed=3)
    replayed = _replace(records[1], completion_token_ids=[7] * 40, logprobs=[-1.0] * 40)
    later = _text_chain("s", 1, seed=4, parent=records[4])
    current = [records[0], replayed, *records[2:], *later]
    truth = expected_prompts(current)
    with DeltaChainTraceStore(path) as store:
        for record in [*records, replayed, *later]:
            store.append(record)
        # records[2] was compressed against the first frame of records[1], which the replay
        # replaced: reading it decodes that frame too
        assert store.chain("s") == current
        assert [t.prompt_token_ids for t in store.session("s")] == [
            truth[r.trace_id] for r in current
        ]
    assert _with_context(path) == [False, True, True, True, True, True, True]
    with DeltaChainTraceStore(path) as store:
        assert store.chain("s") == current
        assert [t.prompt_token_ids for t in store.session("s")] == [
            truth[r.trace_id] for r in current
        ]
        single = store.trace("s", records[3].trace_id)
        assert single is not None and single.prompt_token_ids == truth[records[3].trace_id]


def test_the_index_says_what_the_files_say(tmp_path):
    # text-like ids (compressed against their context) and random ones (compressed alone,
    # though a context was offered), forks, a replay and a snapshot
    path = tmp_path / "t"
    text = _text_chain("s", 6, seed=6)
    noise = make_trace_chain("s", 4, parent=text[2], seed=7)
    replayed = _replace(text[4], completion_token_ids=text[5].completion_token_ids)
    with DeltaChainTraceStore(path, snapshot_every=4) as store:
        for record in [*text, *noise, replayed]:
            store.append(record)
        index = {frame.head.trace_id: frame.head for frame in store._sessions["s"].entries.values()}
    on_disk = {head.trace_id: head for _, head in _frames(path)}  # the last frame of each id wins
    assert index == on_disk
    flags = {(head.has_context, head.has_snapshot) for head in on_disk.values()}
    assert {(True, False), (False, False), (False, True)} <= flags


def test_a_context_shorter_than_the_minimum_is_not_used(tmp_path):
    rng = random.Random(8)
    short = [rng.randrange(49_152) for _ in range(MIN_CONTEXT_TOKENS - 1)]
    ids = [rng.randrange(49_152) for _ in range(40)]
    root = TraceRecord(
        trace_id="r",
        session_id="s",
        prompt_delta_token_ids=short,
        completion_token_ids=[],
        logprobs=[],
    )
    # the child repeats what is before it: with that context it would compress smaller
    child = _replace(
        root, trace_id="c", turn=1, parent_trace_id="r", prompt_delta_token_ids=short + ids
    )
    grandchild = _replace(
        child, trace_id="g", turn=2, parent_trace_id="c", prompt_delta_token_ids=short + ids
    )
    with DeltaChainTraceStore(tmp_path / "t") as store:
        for record in (root, child, grandchild):
            store.append(record)
        assert store.chain("s") == [root, child, grandchild]
    assert _with_context(tmp_path / "t") == [False, False, True]


def test_a_child_appended_before_its_parent_is_compressed_alone(tmp_path):
    path = tmp_path / "t"
    records = _text_chain("s", 4, seed=5)
    order = [records[0], records[2], records[3], records[1]]
    with DeltaChainTraceStore(path) as store:
        for record in order:
            store.append(record)
        truth = expected_prompts(records)
        assert [t.prompt_token_ids for t in store.session("s")] == [
            truth[r.trace_id] for r in records
        ]
    # records[2] had no parent when written, so neither it nor its child have a context
    assert _with_context(path) == [False, False, False, True]


# --------------------------------------------------------------------------------------------
# Long chains
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("snapshot_every", [0, 64])
def test_thousand_turns_rebuild_with_a_small_recursion_limit(tmp_path, snapshot_every):
    records = make_long_trace_chain(1000, negated=True)
    path = tmp_path / "t"
    with DeltaChainTraceStore(path, snapshot_every=snapshot_every) as store:
        for record in reversed(records):
            store.append(record)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 60)
    try:
        with DeltaChainTraceStore(path, snapshot_every=snapshot_every) as store:
            traces = store.session("long")
            single = store.trace("long", "t999")
    finally:
        sys.setrecursionlimit(limit)
    assert len(traces) == 1000
    assert all(t.chain_complete for t in traces)
    last = traces[-1].prompt_token_ids
    assert len(last) == 2 + 3 * 999
    assert last[:5] == [0, 1, 100_000, 1, -1]
    assert last[-3:] == [100_998, 999, -999]
    assert single is not None and single.prompt_token_ids == last


# --------------------------------------------------------------------------------------------
# Round trip through any history, with reopens
# --------------------------------------------------------------------------------------------

_floats = st.floats(allow_nan=False, width=64) | st.floats(allow_nan=False, width=32)
_PHRASES = [[(7919 * i + 13 * j) % 49_152 for j in range(3 + i % 5)] for i in range(8)]
_phrases = st.lists(st.integers(0, len(_PHRASES) - 1), min_size=2, max_size=10).map(
    lambda picks: [token for pick in picks for token in _PHRASES[pick]]
)


@st.composite
def _histories(draw):
    """Appends (continuations, resets, forks, replays across lineages and two sessions) with
    reopens between them; logprobs and timings are any finite floats, float32 or not. Ids are
    any int32 values, or phrases that repeat like text, so that records are also compressed
    against their context (and replays change the frames later children were written
    against)."""
    ids = st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), max_size=8) | _phrases
    steps: list[object] = []
    chains: dict[tuple[str, str], list[TraceRecord]] = {}
    for index in range(draw(st.integers(min_value=1, max_value=25))):
        if draw(st.integers(0, 9)) == 0:
            steps.append("reopen")
            continue
        session = draw(st.sampled_from(["s1", "s2"]))
        lineage = draw(st.sampled_from(["main", "sub"]))
        chain = chains.setdefault((session, lineage), [])
        action = draw(st.sampled_from(["next", "next", "reset", "fork", "replay"]))
        completion = draw(ids)
        logprobs = draw(st.lists(_floats, min_size=len(completion), max_size=len(completion)))
        if action == "replay" and chain:
            original = draw(st.sampled_from(chain))
            steps.append(_replace(original, completion_token_ids=completion, logprobs=logprobs))
            continue
        parent = None
        if chain and action == "next":
            parent = chain[-1]
        elif chain and action == "fork":
            parent = draw(st.sampled_from(chain))
        record = TraceRecord(
            trace_id=f"{session}-{index}",
            session_id=session,
            lineage_id=lineage,
            turn=parent.turn + 1 if parent else (chain[-1].turn + 1 if chain else 0),
            parent_trace_id=parent.trace_id if parent else None,
            prompt_delta_token_ids=draw(ids),
            completion_token_ids=completion,
            logprobs=logprobs,
            finish_reason=draw(st.sampled_from(["stop", "length"])),
            weight_version=draw(st.integers(0, 2**40)),
            reset_reason="prefix_changed" if parent is None and chain else None,
            created_at=draw(_floats),
            latency_s=draw(_floats),
        )
        chain.append(record)
        steps.append(record)
    return steps


def _bits(record: TraceRecord) -> list[bytes]:
    return [struct.pack("<d", v) for v in (*record.logprobs, record.created_at, record.latency_s)]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=_histories(), snapshot_every=st.sampled_from([0, 1, 3]))
def test_any_history_with_reopens_reads_back_byte_exactly(tmp_path_factory, steps, snapshot_every):
    path = tmp_path_factory.mktemp("history")
    final: dict[tuple[str, str], TraceRecord] = {}
    store = DeltaChainTraceStore(path, snapshot_every=snapshot_every, segment_bytes=4096)
    try:
        for step in steps:
            if step == "reopen":
                store.close()
                # reopening with another segment size is allowed: it only affects new segments
                store = DeltaChainTraceStore(path, snapshot_every=snapshot_every)
                continue
            assert isinstance(step, TraceRecord)
            store.append(step)
            final[(step.session_id, step.trace_id)] = step
        store.close()
        store = DeltaChainTraceStore(path, snapshot_every=snapshot_every)
        for session_id in sorted({s for s, _ in final}):
            expected = {t: r for (s, t), r in final.items() if s == session_id}
            truth = expected_prompts(expected.values())
            chain = store.chain(session_id)
            assert {r.trace_id: r for r in chain} == expected
            for record in chain:
                assert _bits(record) == _bits(expected[record.trace_id])
            traces = store.session(session_id)
            assert [t.record for t in traces] == chain
            for trace in traces:
                assert trace.chain_complete
                assert trace.prompt_token_ids == truth[trace.record.trace_id]
                single = store.trace(session_id, trace.record.trace_id)
                assert single == trace
        assert store.sessions() == sorted({s for s, _ in final})
    finally:
        store.close()


def test_concurrent_appends_from_threads_all_land(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    chains = [make_trace_chain(f"s{i}", 40, seed=i) for i in range(6)]
    path = tmp_path / "t"
    with DeltaChainTraceStore(path, segment_bytes=8192, snapshot_every=7) as store:
        with ThreadPoolExecutor(max_workers=6) as pool:
            list(pool.map(lambda chain: [store.append(r) for r in chain], chains))
        for chain in chains:
            assert store.chain(chain[0].session_id) == chain
    with DeltaChainTraceStore(path) as store:
        for chain in chains:
            truth = expected_prompts(chain)
            traces = store.session(chain[0].session_id)
            assert [t.prompt_token_ids for t in traces] == [truth[r.trace_id] for r in chain]
