"""Conformance suites for trace stores, sample buffers and object stores.

Subclass the suite for your kind in a test module and provide its fixtures::

    class TestMyBuffer(SampleBufferConformance):
        @pytest.fixture
        def opened(self):
            buffers = []
            yield buffers
            for buffer in buffers:
                buffer.close()

        @pytest.fixture
        def sample_buffer(self, tmp_path, opened):
            opened.append(MyBuffer(tmp_path / "buffer"))
            return opened[-1]

        @pytest.fixture
        def reopen(self, opened):
            def _reopen(buffer):
                buffer.close()
                opened.append(MyBuffer(buffer.path))
                return opened[-1]
            return _reopen

Fixtures:

- ``trace_store`` / ``sample_buffer`` / ``object_store``: a fresh, empty instance.
- ``reopen`` (trace stores and sample buffers): a callable that closes the store it is given and
  returns a new instance opened on the same location; an in-memory store may return the same
  object. The fixtures own every instance they hand out and close them all on teardown, as
  above, so ``close`` may be called on an instance that ``reopen`` already closed.
- ``subprocess_factory_source`` (optional, sample buffers and object stores): Python source that
  defines ``open_store(location: str)``, returning a new store on the directory or URL
  ``location``. When provided, the crash test runs appends in a child interpreter, kills it with
  SIGKILL right after an acknowledgment and checks that everything acknowledged is readable.
  Without it the crash test is skipped. A killed process is not a power loss: the test proves
  that an acknowledged write reached the operating system, not the disk.

Trace order: ``session`` and ``chain`` must return records sorted by ``lineage_id`` (as
strings), then ``turn``; records that share both (forks) may come in any order, but the same in
both calls.

Every test method takes its fixtures as arguments, so a test of the kit itself can also call a
method directly with a hand-built store.

The helpers :func:`make_trace_chain`, :func:`expected_prompts`, :func:`make_samples` and
:func:`run_until_killed` are public for plugin-specific tests, and so is the strategy
:func:`buffer_programs`, for a buffer whose every call is a network round trip to run the
model test with fewer examples (call the suite's test as
``SampleBufferConformance.test_any_program_matches_a_model.hypothesis.inner_test`` under your
own ``@given(program=buffer_programs())``). The suites need pytest and hypothesis
(``pip install rllm-core[test]``).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllm_core.errors import ObjectNotFoundError
from rllm_core.types import BacklogStats, Datum, Message, Sample, Trace, TraceRecord

if TYPE_CHECKING:
    from rllm_core.ports import SampleBuffer

__all__ = [
    "INVALID_OBJECT_KEYS",
    "ObjectStoreConformance",
    "SampleBufferConformance",
    "TraceStoreConformance",
    "append_crash_records",
    "buffer_programs",
    "crash_record",
    "crash_record_starts",
    "expected_prompts",
    "make_long_trace_chain",
    "make_samples",
    "make_trace_chain",
    "run_until_killed",
]

INVALID_OBJECT_KEYS: tuple[str, ...] = ("", "/abs", "a/../b", "a//b", "..", "a/b/..", "a/")
"""Keys every object store must reject with ``ValueError``."""

_SUITE_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.differing_executors,
    ],
)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def make_long_trace_chain(turns: int, *, negated: bool = False) -> list[TraceRecord]:
    """``turns`` small records of session ``"long"`` (trace ids ``t0``, ``t1``, ...), each the
    child of the one before, whose rebuilt prompts are easy to check: the root's delta is
    ``[0, 1]``, turn ``n``'s ``[n]`` (``[n, -n]`` with ``negated``), and turn ``n`` completes
    with the one token ``100_000 + n`` at logprob ``-0.5``."""
    records: list[TraceRecord] = []
    parent = None
    for turn in range(turns):
        record = TraceRecord(
            trace_id=f"t{turn}",
            session_id="long",
            turn=turn,
            parent_trace_id=parent,
            prompt_delta_token_ids=(
                [turn, turn + 1] if parent is None else [turn, -turn] if negated else [turn]
            ),
            completion_token_ids=[100_000 + turn],
            logprobs=[-0.5],
        )
        records.append(record)
        parent = record.trace_id
    return records


def make_trace_chain(
    session_id: str,
    turns: int,
    *,
    lineage_id: str | None = None,
    parent: TraceRecord | None = None,
    first_turn: int = 0,
    reset_reason: str | None = None,
    seed: int = 0,
    id_prefix: str | None = None,
) -> list[TraceRecord]:
    """Build ``turns`` consistent delta-chain records, each the child of the one before.

    Without ``parent`` the first record is a root (its delta is its full prompt) at
    ``first_turn``, carrying ``reset_reason``; with ``parent`` the first record continues from
    it (a fork when ``parent`` already has a child) in the parent's lineage. Token ids, logprobs
    and timings are drawn from ``random.Random(seed)`` with full double precision, so a store
    that narrows a value fails equality. Trace ids are ``f"{id_prefix}-{i}"``; the default
    prefix is unique per ``(session_id, lineage, seed, first turn)``.
    """
    if turns < 0:
        raise ValueError(f"turns must be zero or more, got {turns}")
    rng = random.Random(seed)
    lineage = lineage_id or (parent.lineage_id if parent else "main")
    turn = parent.turn + 1 if parent else first_turn
    prefix = id_prefix or f"{session_id}.{lineage}.s{seed}.t{turn}"
    records: list[TraceRecord] = []
    previous = parent
    for i in range(turns):
        is_root = previous is None
        delta = [
            rng.randrange(1, 150_000)
            for _ in range(rng.randint(3, 8) if is_root else rng.randint(1, 4))
        ]
        completion = [rng.randrange(1, 150_000) for _ in range(rng.randint(1, 5))]
        messages: tuple[Message, ...] = (Message(role="user", content=f"turn {turn} of {lineage}"),)
        if is_root:
            messages = (Message(role="system", content="You are terse."), *messages)
        record = TraceRecord(
            trace_id=f"{prefix}-{i}",
            session_id=session_id,
            lineage_id=lineage,
            turn=turn,
            parent_trace_id=None if previous is None else previous.trace_id,
            prompt_delta_token_ids=delta,
            completion_token_ids=completion,
            logprobs=[-rng.random() * 4.0 for _ in completion],
            finish_reason=rng.choice(["stop", "length"]),
            weight_version=rng.randrange(0, 5),
            model="policy",
            messages_delta=messages,
            reset_reason=reset_reason if is_root else None,
            created_at=1.7e9 + rng.random() * 1e6,
            latency_s=rng.random(),
        )
        records.append(record)
        previous = record
        turn += 1
    return records


def expected_prompts(records: Iterable[TraceRecord]) -> dict[str, list[int] | None]:
    """The full prompt of every record by ``trace_id``, or ``None`` when an ancestor is missing.

    Built iteratively from the delta-chain contract, so chains of any length work.
    """
    by_id = {record.trace_id: record for record in records}
    prompts: dict[str, list[int] | None] = {}
    for trace_id in by_id:
        path: list[TraceRecord] = []
        cursor: str | None = trace_id
        base: list[int] | None = []
        seen: set[str] = set()
        while cursor is not None and cursor not in prompts:
            record = by_id.get(cursor)
            if record is None or cursor in seen:
                base = None
                break
            seen.add(cursor)
            path.append(record)
            cursor = record.parent_trace_id
        else:
            if cursor is not None:
                parent = by_id[cursor]
                known = prompts[cursor]
                base = None if known is None else known + parent.completion_token_ids
        for record in reversed(path):
            if base is None:
                prompts[record.trace_id] = None
                continue
            prompt = base + record.prompt_delta_token_ids
            prompts[record.trace_id] = prompt
            base = prompt + record.completion_token_ids
    return prompts


def make_samples(
    count: int,
    *,
    weight_version: int | Sequence[int] = 0,
    seed: int = 0,
    group_id: str = "g",
) -> list[Sample]:
    """Build ``count`` samples with varied, full-precision payloads (sequence unset).

    ``weight_version`` is one version for all, or one per sample. The same arguments always
    build equal samples, which lets a crash test rebuild what a child process appended.
    """
    versions = [weight_version] * count if isinstance(weight_version, int) else list(weight_version)
    if len(versions) != count:
        raise ValueError(f"weight_version has {len(versions)} entries for {count} samples")
    rng = random.Random(seed)
    samples = []
    for i, version in enumerate(versions):
        n = rng.randint(1, 12)
        datum = Datum(
            token_ids=[rng.randrange(0, 200_000) for _ in range(n)],
            logprobs=[-rng.random() * 6.0 for _ in range(n)],
            advantages=[rng.uniform(-2.0, 2.0) for _ in range(n)],
            action_mask=[rng.random() < 0.5 for _ in range(n)],
            observation_mask=[rng.random() < 0.3 for _ in range(n)],
            metadata={"index": i, "seed": seed, "tags": ["x", "y"], "score": rng.random()},
        )
        samples.append(
            Sample(
                datum=datum,
                group_id=group_id,
                episode_id=f"{group_id}-e{seed}-{i}",
                weight_version=version,
                reward=rng.random(),
            )
        )
    return samples


def crash_record(index: int) -> list[Sample]:
    """The samples of record ``index`` of a kill trial (one append of one to three samples),
    sequence numbers unset; equal in every process, so a test rebuilds what a child appended."""
    return make_samples(
        1 + index % 3, weight_version=index % 7, seed=index, group_id=f"r{index % 5}"
    )


def crash_record_starts(records: int) -> list[int]:
    """``starts[r]``: the first sequence number of :func:`crash_record` ``r`` when records
    0, 1, ... were appended in order, for ``r`` up to ``records``."""
    return list(itertools.accumulate((1 + i % 3 for i in range(records)), initial=0))


def append_crash_records(buffer: SampleBuffer, report: int, starts: Sequence[int]) -> NoReturn:
    """A kill trial's child: append the records of :func:`crash_record` to ``buffer``, from
    the one after those it holds, until the process is killed, writing to the file descriptor
    ``report`` ``a R`` once record R was acknowledged and, after every fourth record, ``C W``
    before committing the watermark W (two short of the record's last sequence) and ``c W``
    once committed. ``starts`` is :func:`crash_record_starts` of more records than a trial
    appends."""
    index = bisect.bisect_left(starts, buffer.committed() + 1 + buffer.pending())
    while True:
        stored = buffer.append(crash_record(index))
        os.write(report, f"a {index}\n".encode())
        if index % 4 == 3:
            watermark = stored[-1].sequence - 2
            os.write(report, f"C {watermark}\n".encode())
            buffer.commit(watermark)
            os.write(report, f"c {watermark}\n".encode())
        index += 1


def run_until_killed(script: str, *args: str, acks: int, timeout_s: float = 120.0) -> list[str]:
    """Run ``script`` in a fresh interpreter and SIGKILL it right after its ``acks``-th line
    that starts with ``ack``; return every stdout line read before the kill.

    The script must print (and flush) an ``ack ...`` line only after the operation it
    acknowledges has returned. Fails the test when the script exits on its own, prints an
    error, or produces fewer acknowledgments within ``timeout_s``.
    """
    if not hasattr(signal, "SIGKILL"):
        pytest.skip("SIGKILL is not available on this platform")
    with tempfile.TemporaryFile(mode="w+") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        assert process.stdout is not None
        watchdog = threading.Timer(timeout_s, process.kill)
        watchdog.start()
        lines: list[str] = []
        seen = 0
        try:
            while seen < acks:
                line = process.stdout.readline()
                if not line:
                    break
                lines.append(line.rstrip("\n"))
                if line.startswith("ack"):
                    seen += 1
            if seen == acks:
                os.kill(process.pid, signal.SIGKILL)
            process.wait()
        finally:
            watchdog.cancel()
            process.stdout.close()
        stderr.seek(0)
        errors = stderr.read()
    if seen < acks:
        pytest.fail(
            f"the child process printed {seen} of {acks} acknowledgments before it ended with"
            f" status {process.returncode} (or ran past {timeout_s}s); its stderr:\n{errors}"
        )
    return lines


def _load_factory(source: str) -> Callable[[str], Any]:
    namespace: dict[str, Any] = {"__name__": "rllm_conformance_factory"}
    exec(compile(source, "<subprocess_factory_source>", "exec"), namespace)
    factory = namespace.get("open_store")
    if not callable(factory):
        raise AssertionError(
            "subprocess_factory_source must define open_store(location) returning a store"
        )
    return factory


_replace = msgspec.structs.replace


def _float_bits(values: Iterable[float]) -> list[bytes]:
    return [struct.pack("<d", value) for value in values]


def _is_suffix(candidate: Sequence[int], full: Sequence[int]) -> bool:
    return len(candidate) <= len(full) and list(full[len(full) - len(candidate) :]) == list(
        candidate
    )


# --------------------------------------------------------------------------------------------
# Trace stores
# --------------------------------------------------------------------------------------------


@st.composite
def _trace_histories(draw: st.DrawFn) -> list[TraceRecord]:
    """Appends as a gateway could make them: continuations, resets (new roots in a lineage),
    forks from an earlier record and replays of an existing trace id, in any order."""
    session_id = f"prop-{uuid.uuid4().hex}"
    tokens = st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=6)
    records: dict[str, list[TraceRecord]] = {"main": [], "sub": []}
    appends: list[TraceRecord] = []
    for index in range(draw(st.integers(min_value=1, max_value=20))):
        lineage = draw(st.sampled_from(["main", "sub"]))
        chain = records[lineage]
        action = draw(st.sampled_from(["next", "next", "reset", "fork", "replay"]))
        if action == "replay" and chain:
            original = draw(st.sampled_from(chain))
            completion = draw(tokens)
            appends.append(
                _replace(
                    original,
                    completion_token_ids=completion,
                    logprobs=[-0.5 - i for i in range(len(completion))],
                )
            )
            continue
        if not chain or action == "reset":
            parent = None
        elif action == "fork":
            parent = draw(st.sampled_from(chain))
        else:
            parent = chain[-1]
        completion = draw(tokens)
        record = TraceRecord(
            trace_id=f"{session_id}-{index}",
            session_id=session_id,
            lineage_id=lineage,
            turn=(parent.turn + 1) if parent else (chain[-1].turn + 1 if chain else 0),
            parent_trace_id=parent.trace_id if parent else None,
            prompt_delta_token_ids=draw(tokens),
            completion_token_ids=completion,
            logprobs=[-0.25 * (i + 1) for i in range(len(completion))],
            reset_reason="bridge-failed" if parent is None and chain else None,
        )
        chain.append(record)
        appends.append(record)
    return draw(st.permutations(appends))


@pytest.mark.rllm_conformance
class TraceStoreConformance:
    """Checks the :class:`~rllm_core.ports.TraceStore` contract.

    Fixtures: ``trace_store`` (a fresh store) and ``reopen`` (close it, open a new instance on
    the same location).
    """

    # ---------------------------------------------------------------- rebuilding prompts

    def test_root_and_children_rebuild_full_prompts(self, trace_store: Any) -> None:
        root = TraceRecord(
            trace_id="r",
            session_id="s",
            prompt_delta_token_ids=[1, 2, 3],
            completion_token_ids=[4, 5],
            logprobs=[-0.1, -0.2],
        )
        child = TraceRecord(
            trace_id="c1",
            session_id="s",
            turn=1,
            parent_trace_id="r",
            prompt_delta_token_ids=[6],
            completion_token_ids=[7, 8],
            logprobs=[-0.3, -0.4],
        )
        grandchild = TraceRecord(
            trace_id="c2",
            session_id="s",
            turn=2,
            parent_trace_id="c1",
            prompt_delta_token_ids=[9, 10],
            completion_token_ids=[11],
            logprobs=[-0.5],
        )
        for record in (root, child, grandchild):
            trace_store.append(record)
        traces = trace_store.session("s")
        assert [t.record.trace_id for t in traces] == ["r", "c1", "c2"]
        assert [t.prompt_token_ids for t in traces] == [
            [1, 2, 3],
            [1, 2, 3, 4, 5, 6],
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        ]
        assert all(t.chain_complete for t in traces)
        assert all(isinstance(t, Trace) for t in traces)

    def test_every_prompt_extends_its_parent(self, trace_store: Any) -> None:
        records = make_trace_chain("s", 6, seed=11)
        for record in records:
            trace_store.append(record)
        traces = trace_store.session("s")
        assert [t.record for t in traces] == records
        assert traces[0].prompt_token_ids == records[0].prompt_delta_token_ids
        for previous, current in itertools.pairwise(traces):
            assert current.prompt_token_ids == (
                previous.prompt_token_ids
                + previous.record.completion_token_ids
                + current.record.prompt_delta_token_ids
            )

    def test_out_of_order_appends_rebuild_the_same(self, trace_store: Any) -> None:
        records = make_trace_chain("ordered", 7, seed=3)
        shuffled = make_trace_chain("shuffled", 7, seed=3)
        random.Random(5).shuffle(shuffled)
        for record in records:
            trace_store.append(record)
        for record in reversed(shuffled):
            trace_store.append(record)
        ordered = trace_store.session("ordered")
        scrambled = trace_store.session("shuffled")
        assert [t.prompt_token_ids for t in scrambled] == [t.prompt_token_ids for t in ordered]
        assert [t.record.turn for t in scrambled] == list(range(7))
        assert all(t.chain_complete for t in scrambled)

    def test_replay_overwrites_in_place(self, trace_store: Any) -> None:
        records = make_trace_chain("s", 3, seed=4)
        for record in records:
            trace_store.append(record)
        replayed = _replace(records[2], completion_token_ids=[42, 43], logprobs=[-1.5, -2.5])
        trace_store.append(replayed)
        assert trace_store.chain("s") == [records[0], records[1], replayed]
        traces = trace_store.session("s")
        assert len(traces) == 3
        assert traces[2].record == replayed
        assert traces[2].prompt_token_ids == expected_prompts(records)[records[2].trace_id]

    def test_replayed_parent_changes_what_children_rebuild(self, trace_store: Any) -> None:
        records = make_trace_chain("s", 3, seed=6)
        for record in records:
            trace_store.append(record)
        new_parent = _replace(records[1], completion_token_ids=[7, 7, 7], logprobs=[-1.0] * 3)
        trace_store.append(new_parent)
        root, _, child = records
        traces = trace_store.session("s")
        assert traces[2].prompt_token_ids == (
            root.prompt_delta_token_ids
            + root.completion_token_ids
            + new_parent.prompt_delta_token_ids
            + [7, 7, 7]
            + child.prompt_delta_token_ids
        )

    def test_forks_rebuild_each_branch(self, trace_store: Any) -> None:
        trunk = make_trace_chain("s", 2, seed=20)
        left = make_trace_chain("s", 2, parent=trunk[1], seed=21)
        right = make_trace_chain("s", 2, parent=trunk[1], seed=22)
        for record in right + trunk + left:
            trace_store.append(record)
        truth = expected_prompts(trunk + left + right)
        traces = trace_store.session("s")
        assert sorted(t.record.trace_id for t in traces) == sorted(truth)
        for trace in traces:
            assert trace.chain_complete
            assert trace.prompt_token_ids == truth[trace.record.trace_id]
        assert [t.record.turn for t in traces] == [0, 1, 2, 2, 3, 3]

    # ---------------------------------------------------------------- lineages and order

    def test_lineages_keep_separate_chains(self, trace_store: Any) -> None:
        main = make_trace_chain("s", 3, lineage_id="main", seed=1)
        sub = make_trace_chain("s", 3, lineage_id="sub", seed=2)
        for a, b in zip(sub, main, strict=True):
            trace_store.append(a)
            trace_store.append(b)
        traces = trace_store.session("s")
        assert [t.record.trace_id for t in traces] == [r.trace_id for r in main + sub]
        expected = expected_prompts(main + sub)
        for trace in traces:
            assert trace.prompt_token_ids == expected[trace.record.trace_id]
        assert traces[3].prompt_token_ids == sub[0].prompt_delta_token_ids

    def test_order_is_lineage_then_turn(self, trace_store: Any) -> None:
        first = make_trace_chain("s", 2, lineage_id="b", seed=1)
        reset = make_trace_chain("s", 2, lineage_id="b", first_turn=2, reset_reason="r", seed=2)
        other = make_trace_chain("s", 3, lineage_id="a", seed=3)
        for record in [reset[1], other[2], first[0], reset[0], other[0], first[1], other[1]]:
            trace_store.append(record)
        traces = trace_store.session("s")
        assert [(t.record.lineage_id, t.record.turn) for t in traces] == [
            ("a", 0),
            ("a", 1),
            ("a", 2),
            ("b", 0),
            ("b", 1),
            ("b", 2),
            ("b", 3),
        ]
        assert traces[5].prompt_token_ids == reset[0].prompt_delta_token_ids
        assert traces[5].record.reset_reason == "r"
        assert [r.trace_id for r in trace_store.chain("s")] == [t.record.trace_id for t in traces]

    # ---------------------------------------------------------------- missing ancestors

    def test_missing_parent_is_incomplete_and_fabricates_nothing(self, trace_store: Any) -> None:
        records = make_trace_chain("s", 5, seed=9)
        truth = expected_prompts(records)
        missing = records[2].trace_id
        for record in records:
            if record.trace_id != missing:
                trace_store.append(record)
        traces = trace_store.session("s")
        assert [t.record.trace_id for t in traces] == [
            r.trace_id for r in records if r.trace_id != missing
        ]
        by_id = {t.record.trace_id: t for t in traces}
        for record in records[:2]:
            assert by_id[record.trace_id].chain_complete
            assert by_id[record.trace_id].prompt_token_ids == truth[record.trace_id]
        for record in records[3:]:
            trace = by_id[record.trace_id]
            assert not trace.chain_complete, f"{record.trace_id} has a missing ancestor"
            full = truth[record.trace_id]
            assert full is not None
            assert _is_suffix(trace.prompt_token_ids, full), (
                f"{record.trace_id}: {trace.prompt_token_ids} holds tokens that are not the end"
                f" of its true prompt {full}"
            )
            assert len(trace.prompt_token_ids) < len(full)

    def test_missing_parent_completes_once_it_lands(self, trace_store: Any) -> None:
        records = make_trace_chain("s", 3, seed=10)
        trace_store.append(records[2])
        trace_store.append(records[0])
        assert [t.chain_complete for t in trace_store.session("s")] == [True, False]
        trace_store.append(records[1])
        traces = trace_store.session("s")
        assert [t.chain_complete for t in traces] == [True, True, True]
        truth = expected_prompts(records)
        assert [t.prompt_token_ids for t in traces] == [truth[r.trace_id] for r in records]

    # ---------------------------------------------------------------- reading

    def test_unknown_session_is_empty(self, trace_store: Any) -> None:
        assert trace_store.session("never-written") == []
        assert trace_store.chain("never-written") == []
        trace_store.append(make_trace_chain("known", 1)[0])
        assert trace_store.session("never-written") == []

    def test_chain_returns_stored_records_as_is(self, trace_store: Any) -> None:
        records = make_trace_chain("s", 4, seed=12)
        for record in reversed(records):
            trace_store.append(record)
        chain = trace_store.chain("s")
        assert chain == records
        for stored, original in zip(chain, records, strict=True):
            assert isinstance(stored, TraceRecord)
            assert _float_bits(stored.logprobs) == _float_bits(original.logprobs)
            assert struct.pack("<d", stored.created_at) == struct.pack("<d", original.created_at)
            assert stored.messages_delta == original.messages_delta

    def test_sessions_lists_every_session(self, trace_store: Any) -> None:
        assert list(trace_store.sessions()) == []
        for session_id in ("b", "a", "c"):
            for record in make_trace_chain(session_id, 2):
                trace_store.append(record)
        assert sorted(trace_store.sessions()) == ["a", "b", "c"]

    def test_delete_session(self, trace_store: Any) -> None:
        keep = make_trace_chain("keep", 2, seed=1)
        drop = make_trace_chain("drop", 2, seed=2)
        for record in keep + drop:
            trace_store.append(record)
        trace_store.delete_session("drop")
        assert trace_store.session("drop") == []
        assert trace_store.chain("drop") == []
        assert sorted(trace_store.sessions()) == ["keep"]
        assert trace_store.chain("keep") == keep
        trace_store.delete_session("drop")
        trace_store.delete_session("never-written")
        assert trace_store.chain("keep") == keep

    def test_survives_reopen(self, trace_store: Any, reopen: Callable[[Any], Any]) -> None:
        records = make_trace_chain("s", 4, seed=13) + make_trace_chain("t", 2, seed=14)
        for record in records:
            trace_store.append(record)
        before = trace_store.session("s")
        reopened = reopen(trace_store)
        assert sorted(reopened.sessions()) == ["s", "t"]
        assert reopened.chain("s") == records[:4]
        assert reopened.chain("t") == records[4:]
        assert reopened.session("s") == before
        extra = make_trace_chain("s", 1, parent=records[3], seed=15)[0]
        reopened.append(extra)
        assert (
            reopened.session("s")[-1].prompt_token_ids
            == expected_prompts([*records[:4], extra])[extra.trace_id]
        )

    def test_thousand_turn_session_rebuilds(self, trace_store: Any) -> None:
        turns = 1000
        records = make_long_trace_chain(turns)
        for record in reversed(records):
            trace_store.append(record)
        traces = trace_store.session("long")
        assert len(traces) == turns
        assert all(t.chain_complete for t in traces)
        last = traces[-1].prompt_token_ids
        assert len(last) == 2 + 2 * (turns - 1)
        assert last[:4] == [0, 1, 100_000, 1]
        assert last[-3:] == [998, 100_998, 999]

    @_SUITE_SETTINGS
    @given(history=_trace_histories())
    def test_any_append_sequence_reads_back(
        self, trace_store: Any, history: list[TraceRecord]
    ) -> None:
        final: dict[str, TraceRecord] = {}
        for record in history:
            trace_store.append(record)
            final[record.trace_id] = record
        session_id = history[0].session_id
        truth = expected_prompts(final.values())
        chain = trace_store.chain(session_id)
        traces = trace_store.session(session_id)
        assert len(chain) == len(final)
        assert {r.trace_id: r for r in chain} == final
        assert [t.record.trace_id for t in traces] == [r.trace_id for r in chain]
        keys = [(t.record.lineage_id, t.record.turn) for t in traces]
        assert keys == sorted(keys)
        for trace in traces:
            assert trace.record == final[trace.record.trace_id]
            assert trace.chain_complete
            assert trace.prompt_token_ids == truth[trace.record.trace_id]
        trace_store.delete_session(session_id)


# --------------------------------------------------------------------------------------------
# Sample buffers
# --------------------------------------------------------------------------------------------


_BUFFER_CRASH_DRIVER = """
import sys
from rllm_core.testing.suites.storage import make_samples

store = open_store(sys.argv[1])
index = 0
while True:
    count = 1 + index % 3
    stored = store.append(make_samples(count, weight_version=index, seed=index))
    print("ack", index, count, stored[0].sequence, flush=True)
    if index % 4 == 3:
        store.commit(stored[-1].sequence - 2)
        print("committed", stored[-1].sequence - 2, flush=True)
    index += 1
"""

_OBJECT_CRASH_DRIVER = """
import sys
from rllm_core.testing.suites.storage import _crash_payload

store = open_store(sys.argv[1])
index = 0
while True:
    store.put(f"crash/{index:06d}.bin", _crash_payload(index))
    print("ack", index, flush=True)
    index += 1
"""


def _crash_payload(index: int) -> bytes:
    seed = hashlib.sha256(str(index).encode()).digest()
    return (seed * (1 + (index * 977) % 2048))[: 1 + (index * 7919) % 60_000]


@st.composite
def buffer_programs(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    """Operations on a buffer: ("append", count, version), ("select", max, min_version),
    ("commit", 0, 0) commits the watermark of the last select, ("restore", offset, 0) restores
    to a watermark picked by ``offset`` among those of this program, ("reopen", 0, 0)."""
    ops = st.one_of(
        st.tuples(st.just("append"), st.integers(0, 4), st.integers(0, 4)),
        st.tuples(st.just("select"), st.integers(1, 6), st.integers(0, 4)),
        st.tuples(st.just("commit"), st.just(0), st.just(0)),
        st.tuples(st.just("restore"), st.integers(0, 20), st.just(0)),
        st.tuples(st.just("reopen"), st.just(0), st.just(0)),
    )
    return draw(st.lists(ops, min_size=1, max_size=25))


@pytest.mark.rllm_conformance
class SampleBufferConformance:
    """Checks the :class:`~rllm_core.ports.SampleBuffer` contract.

    Fixtures: ``sample_buffer`` (a fresh buffer), ``reopen`` (close it, open a new instance on
    the same location) and optionally ``subprocess_factory_source`` (see the module docstring).

    A buffer that drops committed samples, so that ``restore`` cannot move the watermark back
    below the committed one, sets ``rewinds = False`` on its test class; the suite then checks
    that rewinding raises ``ValueError`` and changes nothing.
    """

    rewinds = True

    @pytest.fixture
    def subprocess_factory_source(self) -> str | None:
        return None

    # ---------------------------------------------------------------- append

    def test_append_assigns_gap_free_sequences_from_zero(self, sample_buffer: Any) -> None:
        first = sample_buffer.append(make_samples(3, seed=1))
        second = sample_buffer.append(make_samples(2, seed=2))
        assert [s.sequence for s in first] == [0, 1, 2]
        assert [s.sequence for s in second] == [3, 4]

    def test_append_returns_the_samples_with_their_sequence(self, sample_buffer: Any) -> None:
        samples = make_samples(3, seed=3)
        samples[1] = _replace(samples[1], sequence=99)
        stored = sample_buffer.append(samples)
        assert [s.sequence for s in stored] == [0, 1, 2]
        for original, returned in zip(samples, stored, strict=True):
            assert _replace(original, sequence=returned.sequence) == returned

    def test_empty_append_uses_no_sequence_number(self, sample_buffer: Any) -> None:
        sample_buffer.append(make_samples(2, seed=1))
        assert list(sample_buffer.append([])) == []
        assert [s.sequence for s in sample_buffer.append(make_samples(1, seed=2))] == [2]
        assert sample_buffer.pending() == 3

    # ---------------------------------------------------------------- select

    def test_select_returns_oldest_after_watermark(self, sample_buffer: Any) -> None:
        stored = sample_buffer.append(make_samples(5, seed=4))
        batch = sample_buffer.select(max_samples=3)
        assert list(batch.samples) == stored[:3]
        assert batch.watermark == 2
        sample_buffer.commit(batch.watermark)
        batch = sample_buffer.select(max_samples=3)
        assert list(batch.samples) == stored[3:]
        assert batch.watermark == 4

    def test_select_does_not_consume(self, sample_buffer: Any) -> None:
        sample_buffer.append(make_samples(4, seed=5))
        first = sample_buffer.select(max_samples=3)
        second = sample_buffer.select(max_samples=3)
        assert first == second
        assert [s.sequence for s in second.samples] == [0, 1, 2]
        assert sample_buffer.pending() == 4
        assert sample_buffer.committed() == -1

    def test_select_skips_stale_samples(self, sample_buffer: Any) -> None:
        stored = sample_buffer.append(make_samples(5, weight_version=[0, 1, 2, 0, 3], seed=6))
        batch = sample_buffer.select(max_samples=10, min_weight_version=2)
        assert list(batch.samples) == [stored[2], stored[4]]
        assert batch.watermark == 4

    def test_select_stops_at_max_samples_among_stale_ones(self, sample_buffer: Any) -> None:
        stored = sample_buffer.append(make_samples(5, weight_version=[0, 2, 0, 2, 2], seed=7))
        batch = sample_buffer.select(max_samples=2, min_weight_version=1)
        assert list(batch.samples) == [stored[1], stored[3]]
        assert batch.watermark == 3

    def test_select_with_only_stale_samples_moves_the_watermark(self, sample_buffer: Any) -> None:
        sample_buffer.append(make_samples(2, weight_version=0, seed=8))
        batch = sample_buffer.select(max_samples=5, min_weight_version=1)
        assert batch.samples == ()
        assert batch.watermark == 1
        sample_buffer.commit(batch.watermark)
        assert sample_buffer.pending() == 0

    def test_select_on_empty_buffer(self, sample_buffer: Any) -> None:
        batch = sample_buffer.select(max_samples=4)
        assert batch.samples == ()
        assert batch.watermark == sample_buffer.committed() == -1

    # ---------------------------------------------------------------- commit

    def test_committed_is_minus_one_initially(self, sample_buffer: Any) -> None:
        assert sample_buffer.committed() == -1

    def test_commit_advances(self, sample_buffer: Any) -> None:
        stored = sample_buffer.append(make_samples(6, seed=9))
        sample_buffer.commit(1)
        assert sample_buffer.committed() == 1
        assert list(sample_buffer.select(max_samples=2).samples) == stored[2:4]
        sample_buffer.commit(4)
        assert sample_buffer.committed() == 4
        assert list(sample_buffer.select(max_samples=9).samples) == stored[5:]

    def test_commit_backwards_raises(self, sample_buffer: Any) -> None:
        sample_buffer.append(make_samples(5, seed=10))
        sample_buffer.commit(3)
        with pytest.raises(ValueError):
            sample_buffer.commit(2)
        assert sample_buffer.committed() == 3
        sample_buffer.commit(3)
        assert sample_buffer.committed() == 3

    def test_pending_counts_unconsumed(self, sample_buffer: Any) -> None:
        assert sample_buffer.pending() == 0
        sample_buffer.append(make_samples(5, seed=11))
        assert sample_buffer.pending() == 5
        sample_buffer.commit(1)
        assert sample_buffer.pending() == 3
        sample_buffer.append(make_samples(2, seed=12))
        assert sample_buffer.pending() == 5
        sample_buffer.commit(6)
        assert sample_buffer.pending() == 0

    # ---------------------------------------------------------------- restore

    def test_restore_backwards_selects_the_samples_again(
        self, sample_buffer: Any, reopen: Callable[[Any], Any]
    ) -> None:
        stored = sample_buffer.append(make_samples(6, seed=15))
        sample_buffer.commit(sample_buffer.select(max_samples=4).watermark)
        if not self.rewinds:
            with pytest.raises(ValueError):
                sample_buffer.restore(1)
            assert sample_buffer.committed() == 3
            assert list(sample_buffer.select(max_samples=9).samples) == stored[4:]
            return
        sample_buffer.restore(1)
        assert sample_buffer.committed() == 1
        assert sample_buffer.pending() == 4
        assert list(sample_buffer.select(max_samples=9).samples) == stored[2:]
        reopened = reopen(sample_buffer)
        assert reopened.committed() == 1
        assert list(reopened.select(max_samples=9).samples) == stored[2:]
        reopened.restore(-1)
        assert list(reopened.select(max_samples=9).samples) == stored
        assert reopened.pending() == 6

    def test_restore_forwards_skips_samples(
        self, sample_buffer: Any, reopen: Callable[[Any], Any]
    ) -> None:
        stored = sample_buffer.append(make_samples(5, seed=16))
        sample_buffer.restore(2)
        assert sample_buffer.committed() == 2
        assert list(sample_buffer.select(max_samples=9).samples) == stored[3:]
        reopened = reopen(sample_buffer)
        assert reopened.committed() == 2
        assert reopened.pending() == 2
        reopened.restore(2)
        assert reopened.committed() == 2
        reopened.restore(4)
        assert reopened.select(max_samples=9).samples == ()
        assert reopened.pending() == 0

    def test_commit_after_restore_moves_on_from_the_restored_watermark(
        self, sample_buffer: Any
    ) -> None:
        stored = sample_buffer.append(make_samples(6, seed=17))
        sample_buffer.commit(2)
        sample_buffer.restore(0 if self.rewinds else 3)
        start = sample_buffer.committed() + 1
        batch = sample_buffer.select(max_samples=2)
        assert list(batch.samples) == stored[start : start + 2]
        sample_buffer.commit(batch.watermark)
        assert sample_buffer.committed() == start + 1
        with pytest.raises(ValueError):
            sample_buffer.commit(start)
        assert sample_buffer.committed() == start + 1

    @pytest.mark.parametrize("offset", [-2, 0, 1])
    def test_restore_outside_the_appended_samples_raises(
        self, sample_buffer: Any, offset: int
    ) -> None:
        sample_buffer.append(make_samples(3, seed=18))
        sample_buffer.commit(0)
        watermark = -2 if offset == -2 else 3 + offset
        with pytest.raises(ValueError):
            sample_buffer.restore(watermark)
        assert sample_buffer.committed() == 0
        assert sample_buffer.pending() == 2

    def test_restore_on_an_empty_buffer(self, sample_buffer: Any) -> None:
        sample_buffer.restore(-1)
        assert sample_buffer.committed() == -1
        with pytest.raises(ValueError):
            sample_buffer.restore(0)
        assert sample_buffer.committed() == -1

    # ---------------------------------------------------------------- backlog

    def test_backlog_of_an_empty_buffer(self, sample_buffer: Any) -> None:
        assert sample_buffer.backlog() == BacklogStats(
            samples=0, groups=0, oldest_weight_version=None, per_version={}
        )

    def test_backlog_describes_the_pending_samples(
        self, sample_buffer: Any, reopen: Callable[[Any], Any]
    ) -> None:
        sample_buffer.append(make_samples(3, weight_version=[4, 4, 5], seed=19, group_id="a"))
        sample_buffer.append(make_samples(2, weight_version=[2, 6], seed=20, group_id="b"))
        sample_buffer.append(make_samples(2, weight_version=3, seed=21, group_id="c"))
        assert sample_buffer.backlog() == BacklogStats(
            samples=7, groups=3, oldest_weight_version=2, per_version={2: 1, 3: 2, 4: 2, 5: 1, 6: 1}
        )
        sample_buffer.commit(3)
        expected = BacklogStats(
            samples=3, groups=2, oldest_weight_version=3, per_version={3: 2, 6: 1}
        )
        assert sample_buffer.backlog() == expected
        # Stale samples stay in the backlog until the watermark passes them.
        assert sample_buffer.select(max_samples=9, min_weight_version=5).samples
        assert sample_buffer.backlog() == expected
        assert sample_buffer.backlog().samples == sample_buffer.pending()
        assert reopen(sample_buffer).backlog() == expected

    def test_backlog_is_empty_once_everything_is_committed(self, sample_buffer: Any) -> None:
        sample_buffer.append(make_samples(2, weight_version=[1, 2], seed=22))
        sample_buffer.commit(1)
        assert sample_buffer.backlog() == BacklogStats(
            samples=0, groups=0, oldest_weight_version=None, per_version={}
        )

    # ---------------------------------------------------------------- persistence

    def test_reopen_sees_samples_and_watermark(
        self, sample_buffer: Any, reopen: Callable[[Any], Any]
    ) -> None:
        stored = sample_buffer.append(make_samples(4, weight_version=[1, 2, 3, 4], seed=13))
        sample_buffer.commit(1)
        reopened = reopen(sample_buffer)
        assert reopened.committed() == 1
        assert reopened.pending() == 2
        assert list(reopened.select(max_samples=10).samples) == stored[2:]
        more = reopened.append(make_samples(1, seed=14))
        assert [s.sequence for s in more] == [4]

    def test_datum_fields_round_trip_exactly(
        self, sample_buffer: Any, reopen: Callable[[Any], Any]
    ) -> None:
        awkward = [1 / 3, -0.0, 5e-324, 1.7976931348623157e308, -2.5e-310, 0.1]
        datum = Datum(
            token_ids=[0, 1, 2**31 - 1, 151_643, 7, 65_535],
            logprobs=awkward,
            advantages=list(reversed(awkward)),
            action_mask=[True, False, True, True, False, False],
            observation_mask=[False, True, False, False, True, True],
            metadata={"source": "math", "nested": {"k": [1, 2.5, "x"]}, "none": None},
        )
        sample = Sample(
            datum=datum, group_id="grp", episode_id="ep", weight_version=17, reward=-0.0
        )
        (stored,) = sample_buffer.append([sample])
        (selected,) = sample_buffer.select(max_samples=1).samples
        (reread,) = reopen(sample_buffer).select(max_samples=1).samples
        for got in (stored, selected, reread):
            assert got == _replace(sample, sequence=0)
            assert _float_bits(got.datum.logprobs) == _float_bits(awkward)
            assert _float_bits(got.datum.advantages) == _float_bits(reversed(awkward))
            assert struct.pack("<d", got.reward) == struct.pack("<d", -0.0)

    @_SUITE_SETTINGS
    @given(program=buffer_programs())
    def test_any_program_matches_a_model(
        self, sample_buffer: Any, reopen: Callable[[Any], Any], program: list[tuple[str, int, int]]
    ) -> None:
        # Hypothesis runs every example on the same fixture value, which an earlier example
        # may have closed by reopening it: continue on the newest instance and consume what
        # earlier examples left behind.
        buffer = self.__dict__.get("_program_buffer", sample_buffer)
        if buffer.pending():
            buffer.commit(buffer.committed() + buffer.pending())
        base = buffer.committed()
        model: list[Sample] = []
        committed = last_watermark = base
        for step, (op, a, b) in enumerate(program):
            if op == "append":
                stored = buffer.append(
                    make_samples(a, weight_version=b, seed=step, group_id=f"g{b}.{step % 2}")
                )
                first = base + 1 + len(model)
                assert [s.sequence for s in stored] == list(range(first, first + a))
                model.extend(stored)
            elif op == "select":
                batch = buffer.select(max_samples=a, min_weight_version=b)
                expected: list[Sample] = []
                watermark = committed
                for sample in model[committed - base :]:
                    if len(expected) == a:
                        break
                    watermark = sample.sequence
                    if sample.weight_version >= b:
                        expected.append(sample)
                assert list(batch.samples) == expected
                assert batch.watermark == watermark
                last_watermark = watermark
            elif op == "commit":
                buffer.commit(last_watermark)
                committed = last_watermark
            elif op == "restore":
                target = base + a % (len(model) + 1)
                if target < committed and not self.rewinds:
                    with pytest.raises(ValueError):
                        buffer.restore(target)
                else:
                    buffer.restore(target)
                    committed = last_watermark = target
            else:
                buffer = reopen(buffer)
                self._program_buffer = buffer
            assert buffer.committed() == committed
            assert buffer.pending() == len(model) - (committed - base)
            assert buffer.backlog() == BacklogStats.of(
                (s.group_id, s.weight_version) for s in model[committed - base :]
            )

    def test_acknowledged_appends_survive_sigkill(
        self, subprocess_factory_source: str | None, tmp_path: Any
    ) -> None:
        if subprocess_factory_source is None:
            pytest.skip("provide the subprocess_factory_source fixture to run the crash test")
        location = str(tmp_path / "crash-buffer")
        script = textwrap.dedent(subprocess_factory_source) + "\n" + _BUFFER_CRASH_DRIVER
        lines = run_until_killed(script, location, acks=30)
        acked = [
            tuple(int(x) for x in line.split()[1:]) for line in lines if line.startswith("ack")
        ]
        commits = [int(line.split()[1]) for line in lines if line.startswith("committed")]
        buffer = _load_factory(subprocess_factory_source)(location)
        try:
            last_commit = commits[-1] if commits else -1
            assert buffer.committed() >= last_commit, (
                f"the committed watermark went back from {last_commit} to {buffer.committed()}"
            )
            everything = list(buffer.select(max_samples=10**6).samples)
            start = buffer.committed() + 1
            assert [s.sequence for s in everything] == list(range(start, start + len(everything)))
            by_sequence = {s.sequence: s for s in everything}
            for index, count, first in acked:
                expected = make_samples(count, weight_version=index, seed=index)
                for offset, sample in enumerate(expected):
                    sequence = first + offset
                    if sequence < start:
                        continue
                    assert sequence in by_sequence, f"acknowledged sample {sequence} was lost"
                    assert by_sequence[sequence] == _replace(sample, sequence=sequence)
            next_sequence = start + len(everything)
            assert [s.sequence for s in buffer.append(make_samples(1, seed=99))] == [next_sequence]
        finally:
            buffer.close()


# --------------------------------------------------------------------------------------------
# Object stores
# --------------------------------------------------------------------------------------------


@pytest.mark.rllm_conformance
class ObjectStoreConformance:
    """Checks the :class:`~rllm_core.ports.ObjectStore` contract.

    Fixtures: ``object_store`` (a fresh, empty store) and optionally
    ``subprocess_factory_source`` (see the module docstring).
    """

    @pytest.fixture
    def subprocess_factory_source(self) -> str | None:
        return None

    def test_put_get_round_trip(self, object_store: Any) -> None:
        object_store.put("a.txt", b"hello")
        got = object_store.get("a.txt")
        assert got == b"hello"
        assert isinstance(got, bytes)

    def test_empty_object(self, object_store: Any) -> None:
        object_store.put("empty", b"")
        assert object_store.get("empty") == b""
        assert object_store.exists("empty")
        assert object_store.list() == ["empty"]

    def test_large_binary_object(self, object_store: Any) -> None:
        data = bytes(range(256)) * 8192 + random.Random(1).randbytes(12_345)
        assert len(data) > 2 * 1024 * 1024
        object_store.put("big/blob.bin", data)
        assert object_store.get("big/blob.bin") == data

    def test_overwrite_replaces(self, object_store: Any) -> None:
        object_store.put("k", b"first version")
        object_store.put("k", b"2nd")
        assert object_store.get("k") == b"2nd"
        assert object_store.list() == ["k"]

    def test_put_if_absent_creates_a_missing_key(self, object_store: Any) -> None:
        assert object_store.put_if_absent("cuts/000011.json", b"new") is True
        assert object_store.get("cuts/000011.json") == b"new"
        assert object_store.list() == ["cuts/000011.json"]

    def test_put_if_absent_leaves_an_existing_key_alone(self, object_store: Any) -> None:
        object_store.put("cuts/000010.json", b"original")
        assert object_store.put_if_absent("cuts/000010.json", b"usurper") is False
        assert object_store.get("cuts/000010.json") == b"original"
        assert object_store.put_if_absent("cuts/000012.json", b"first") is True
        assert object_store.put_if_absent("cuts/000012.json", b"second") is False
        assert object_store.get("cuts/000012.json") == b"first"
        assert object_store.list() == ["cuts/000010.json", "cuts/000012.json"]

    def test_put_if_absent_after_delete_creates_again(self, object_store: Any) -> None:
        assert object_store.put_if_absent("lock/owner", b"one") is True
        object_store.delete("lock/owner")
        assert object_store.put_if_absent("lock/owner", b"two") is True
        assert object_store.get("lock/owner") == b"two"

    def test_put_overwrites_what_put_if_absent_created(self, object_store: Any) -> None:
        assert object_store.put_if_absent("k", b"created") is True
        object_store.put("k", b"replaced")
        assert object_store.get("k") == b"replaced"
        assert object_store.put_if_absent("k", b"again") is False
        assert object_store.get("k") == b"replaced"

    def test_get_missing_raises_object_not_found(self, object_store: Any) -> None:
        with pytest.raises(ObjectNotFoundError):
            object_store.get("missing")
        object_store.put("dir/present", b"x")
        with pytest.raises(ObjectNotFoundError):
            object_store.get("dir/absent")
        with pytest.raises(ObjectNotFoundError):
            object_store.get("dir")

    def test_exists(self, object_store: Any) -> None:
        assert not object_store.exists("x/y")
        object_store.put("x/y", b"1")
        assert object_store.exists("x/y")
        assert not object_store.exists("x")
        assert not object_store.exists("x/y/z")

    def test_delete(self, object_store: Any) -> None:
        object_store.put("d/one", b"1")
        object_store.put("d/two", b"2")
        object_store.delete("d/one")
        assert not object_store.exists("d/one")
        with pytest.raises(ObjectNotFoundError):
            object_store.get("d/one")
        assert object_store.list() == ["d/two"]
        object_store.delete("d/one")
        object_store.delete("never/written")
        assert object_store.get("d/two") == b"2"

    def test_list_is_sorted_and_prefix_filtered(self, object_store: Any) -> None:
        keys = ["b", "a/b/d/e", "ab", "a/c", "a/b.txt", "a/b/c.bin", "a/b-x", "z/0"]
        for i, key in enumerate(keys):
            object_store.put(key, bytes([i]))
        assert object_store.list() == sorted(keys)
        assert object_store.list("") == sorted(keys)
        assert object_store.list("a/") == ["a/b-x", "a/b.txt", "a/b/c.bin", "a/b/d/e", "a/c"]
        assert object_store.list("a/b") == ["a/b-x", "a/b.txt", "a/b/c.bin", "a/b/d/e"]
        assert object_store.list("a/b/") == ["a/b/c.bin", "a/b/d/e"]
        assert object_store.list("a") == ["a/b-x", "a/b.txt", "a/b/c.bin", "a/b/d/e", "a/c", "ab"]
        assert object_store.list("a/b/d/e") == ["a/b/d/e"]
        assert object_store.list("nothing/") == []
        assert object_store.list("q") == []

    def test_list_start_after(self, object_store: Any) -> None:
        keys = ["c/002", "c/000", "c/001", "c/010", "d", "b/9"]
        for key in keys:
            object_store.put(key, key.encode())
        everything = sorted(keys)
        assert object_store.list(start_after=None) == everything
        assert object_store.list(start_after="") == everything
        assert object_store.list(start_after="a") == everything
        assert object_store.list("c/", start_after="c/001") == ["c/002", "c/010"]
        assert object_store.list("c/", start_after="c/0015") == ["c/002", "c/010"]
        assert object_store.list("c/", start_after="c/000") == ["c/001", "c/002", "c/010"]
        assert object_store.list("c/", start_after="c/") == ["c/000", "c/001", "c/002", "c/010"]
        assert object_store.list("c/", start_after="b") == ["c/000", "c/001", "c/002", "c/010"]
        assert object_store.list("c/", start_after="c/010") == []
        assert object_store.list("c/", start_after="c/9") == []
        assert object_store.list("c/", start_after="d") == []
        assert object_store.list(start_after="c/010") == ["d"]
        assert object_store.list(start_after="c") == ["c/000", "c/001", "c/002", "c/010", "d"]
        assert object_store.list(start_after="d") == []
        assert object_store.list(start_after="zzz") == []

    def test_list_pages_through_every_key(self, object_store: Any) -> None:
        keys = [f"page/{i:03d}" for i in range(25)]
        for key in reversed(keys):
            object_store.put(key, b"x")
        seen: list[str] = []
        after: str | None = None
        for _ in range(len(keys)):
            page = object_store.list("page/", start_after=after)[:7]
            if not page:
                break
            assert page[0] not in seen, f"start_after={after!r} listed {page[0]!r} again"
            seen.extend(page)
            after = page[-1]
        assert seen == keys

    def test_list_after_delete(self, object_store: Any) -> None:
        object_store.put("runs/r1/cuts/000001.json", b"1")
        object_store.put("runs/r1/cuts/000002.json", b"2")
        object_store.delete("runs/r1/cuts/000001.json")
        assert object_store.list("runs/") == ["runs/r1/cuts/000002.json"]
        object_store.delete("runs/r1/cuts/000002.json")
        assert object_store.list() == []

    @pytest.mark.parametrize("key", INVALID_OBJECT_KEYS)
    def test_invalid_keys_raise_value_error(self, object_store: Any, key: str) -> None:
        with pytest.raises(ValueError):
            object_store.put(key, b"x")
        with pytest.raises(ValueError):
            object_store.put_if_absent(key, b"x")
        with pytest.raises(ValueError):
            object_store.get(key)
        with pytest.raises(ValueError):
            object_store.exists(key)
        with pytest.raises(ValueError):
            object_store.delete(key)
        assert object_store.list() == []

    def test_concurrent_puts_to_distinct_keys_all_land(self, object_store: Any) -> None:
        def writer(worker: int) -> None:
            for i in range(20):
                object_store.put(f"w{worker}/{i:03d}", f"{worker}:{i}".encode() * (i + 1))

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(writer, range(8)))
        expected = sorted(f"w{w}/{i:03d}" for w in range(8) for i in range(20))
        assert object_store.list() == expected
        for w in range(8):
            for i in range(20):
                assert object_store.get(f"w{w}/{i:03d}") == f"{w}:{i}".encode() * (i + 1)

    def test_concurrent_put_if_absent_has_one_winner(self, object_store: Any) -> None:
        contenders, rounds = 8, 4
        barrier = threading.Barrier(contenders, timeout=60)

        def contender(worker: int) -> list[bool]:
            outcomes = []
            for r in range(rounds):
                barrier.wait()
                outcomes.append(object_store.put_if_absent(f"lock/{r}", f"w{worker}".encode()))
            return outcomes

        with ThreadPoolExecutor(max_workers=contenders) as pool:
            won = list(pool.map(contender, range(contenders)))
        for r in range(rounds):
            winners = [w for w in range(contenders) if won[w][r] is True]
            losers = [w for w in range(contenders) if won[w][r] is False]
            assert len(winners) == 1, f"round {r}: {len(winners)} writers were told they won"
            assert len(losers) == contenders - 1
            assert object_store.get(f"lock/{r}") == f"w{winners[0]}".encode()

    def test_readers_never_see_a_partial_object(self, object_store: Any) -> None:
        versions = [bytes([v]) * (1024 * 1024) for v in (1, 2)]
        object_store.put("hot", versions[0])
        stop = threading.Event()

        def writer() -> None:
            v = 0
            while not stop.is_set():
                v ^= 1
                object_store.put("hot", versions[v])

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            for _ in range(40):
                got = object_store.get("hot")
                assert got in versions, f"read {len(got)} bytes mixing two versions"
        finally:
            stop.set()
            thread.join()

    def test_acknowledged_puts_survive_sigkill(
        self, subprocess_factory_source: str | None, tmp_path: Any
    ) -> None:
        if subprocess_factory_source is None:
            pytest.skip("provide the subprocess_factory_source fixture to run the crash test")
        location = str(tmp_path / "crash-objects")
        script = textwrap.dedent(subprocess_factory_source) + "\n" + _OBJECT_CRASH_DRIVER
        lines = run_until_killed(script, location, acks=40)
        acked = [int(line.split()[1]) for line in lines if line.startswith("ack")]
        store = _load_factory(subprocess_factory_source)(location)
        try:
            for index in acked:
                key = f"crash/{index:06d}.bin"
                assert store.exists(key), f"acknowledged object {key} was lost"
                assert store.get(key) == _crash_payload(index)
            for key in store.list("crash/"):
                index = int(key.removeprefix("crash/").removesuffix(".bin"))
                assert store.get(key) == _crash_payload(index), f"{key} holds partial bytes"
        finally:
            close = getattr(store, "close", None)
            if callable(close):
                close()
