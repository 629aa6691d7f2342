"""Trace storage: the delta-chain store against a flat store with the same codec.

Sessions of 10, 50, 100 and 200 turns; each turn adds a 300-token prompt delta and a 100-token
completion with one float32 logprob per completion token. Two flavours of token ids:

- ``random``: ids drawn uniformly below 150,000.
- ``text``: real text (the Python standard library's top-level modules, in name order)
  tokenized with the SmolLM2-135M-Instruct tokenizer; each session reads its own stretch of
  the token stream.

Logprobs are float32 logs of uniform probabilities in (0.001, 1]: like a sampler's, their
mantissas are close to random. Records carry uuid-style trace and session ids and no
``messages_delta``; one extra figure shows what storing each turn's text as messages adds.

Where the bytes go: every record of a 200-turn session is encoded again as the store encodes it
(same segment table, same context; the total is checked against the store's files), then
without its token ids, without its logprobs and without both; the differences are what the ids
and the logprobs cost, the rest is the record's own overhead.

The flat store is the same ``deltachain`` store fed the same records turned into roots (full
prompt each turn), so the codec is identical and only the delta chain differs. Read times are
medians of ``store.session(id)`` on an open store whose files are in the page cache; "from
memory" is the ``memory`` store. The copy floor is what any store returning fresh lists pays:
copying every prompt of the session out of ready-made lists.

Run from the repository root after ``scripts/setup.sh`` (needs rllm-trace-store-deltachain, and
``tokenizers`` and ``transformers`` for the SmolLM2 tokenizer)::

    .venv/bin/python benchmarks/trace_storage.py            # a table
    .venv/bin/python benchmarks/trace_storage.py --json     # one JSON object

``--compression-level`` sets the stores' zstd level; ``--context-tokens`` changes how many tokens
of context records are compressed against (a constant of the file format, changed here only to
measure what the context buys: 0 compresses every record alone).

Exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import array
import json
import math
import os
import platform
import random
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import zstandard
from _tables import right_aligned
from rllm_core.storage.framing import FRAME_HEADER
from rllm_core.types import Message, TraceRecord
from rllm_trace_store_deltachain import context
from rllm_trace_store_deltachain.codec import EntryCodec, SegmentTable
from rllm_trace_store_deltachain.memory import MemoryTraceStore
from rllm_trace_store_deltachain.packing import count_ids
from rllm_trace_store_deltachain.segments import MAGIC
from rllm_trace_store_deltachain.store import DeltaChainTraceStore

DELTA_TOKENS = 300
COMPLETION_TOKENS = 100
RANDOM_VOCAB = 150_000
SIZES = (10, 50, 100, 200)
REBUILD_TURNS = 100
REPEAT = 31
"""Timed reads of the 100-turn session; the median is reported."""

GOALS = {
    "growth_100_over_10": ("<=", 11.0),
    "flat_over_delta_at_50": (">=", 25.0),
    "random_bytes_over_raw": ("<=", 1.0),
    "text_bytes_per_unique_token": ("<=", 2.5),
    "read_rebuild_100_disk_ms": ("<=", 20.0),
    "read_rebuild_100_memory_ms": ("<=", 5.0),
}


# --------------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------------


def _float32(value: float) -> float:
    return array.array("f", [value])[0]


class TokenSource:
    """Hands out token ids for one flavour; ``text`` also knows how to decode them."""

    def __init__(self, flavour: str, stream: Sequence[int] = (), decode: Callable | None = None):
        self.flavour = flavour
        self.stream = stream
        self.decode = decode
        self._position = 0

    def take(self, rng: random.Random, count: int) -> list[int]:
        if self.flavour == "random":
            return [rng.randrange(RANDOM_VOCAB) for _ in range(count)]
        if self._position + count > len(self.stream):
            self._position = 0
        ids = list(self.stream[self._position : self._position + count])
        self._position += count
        return ids


def text_stream(needed: int) -> tuple[list[int], Callable[[list[int]], str], dict[str, Any]]:
    """At least ``needed`` SmolLM2 token ids of standard-library source, and a decoder."""
    try:
        from rllm_core.testing.tokenizers import smollm2_tokenizer_dir
        from tokenizers import Tokenizer
    except ImportError as exc:
        sys.exit(
            f"the text flavour needs the SmolLM2 tokenizer ({exc}); run scripts/setup.sh, or"
            " pip install tokenizers transformers gguf"
        )
    folder = smollm2_tokenizer_dir()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    ids: list[int] = []
    files = chars = 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        ids.extend(tokenizer.encode(text, add_special_tokens=False).ids)
        files += 1
        chars += len(text)
        if len(ids) >= needed:
            break
    corpus = {
        "source": f"{stdlib}/*.py in name order",
        "files": files,
        "characters": chars,
        "tokens": len(ids),
        "tokenizer": folder.name,
    }
    return ids, lambda tokens: tokenizer.decode(tokens, skip_special_tokens=False), corpus


def make_session(
    source: TokenSource, turns: int, rng: random.Random, *, with_messages: bool = False
) -> list[TraceRecord]:
    """One session's records: a root, then a chain of ``turns - 1`` extensions."""
    session_id = f"{rng.getrandbits(128):032x}"
    records: list[TraceRecord] = []
    parent: str | None = None
    for turn in range(turns):
        delta = source.take(rng, DELTA_TOKENS)
        completion = source.take(rng, COMPLETION_TOKENS)
        messages: tuple[Message, ...] = ()
        if with_messages and source.decode is not None:
            messages = (
                Message(role="user", content=source.decode(delta)),
                Message(role="assistant", content=source.decode(completion)),
            )
        trace_id = f"{rng.getrandbits(128):032x}"
        records.append(
            TraceRecord(
                trace_id=trace_id,
                session_id=session_id,
                turn=turn,
                parent_trace_id=parent,
                prompt_delta_token_ids=delta,
                completion_token_ids=completion,
                logprobs=[
                    _float32(math.log(1.0 - rng.random() * 0.999)) for _ in range(len(completion))
                ],
                finish_reason="stop",
                weight_version=3,
                model="policy",
                messages_delta=messages,
                created_at=1.7e9 + 2.5 * turn + rng.random(),
                latency_s=rng.uniform(0.2, 3.0),
            )
        )
        parent = trace_id
    return records


def flatten(records: list[TraceRecord]) -> list[TraceRecord]:
    """The same records as roots holding their full prompts (what a flat store keeps)."""
    flat, prompt, previous = [], [], None
    for record in records:
        if previous is not None:
            prompt = prompt + previous.completion_token_ids
        prompt = prompt + record.prompt_delta_token_ids
        flat.append(
            msgspec.structs.replace(record, parent_trace_id=None, prompt_delta_token_ids=prompt)
        )
        previous = record
    return flat


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


def _median_ms(call: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
        del result
    return statistics.median(times) * 1e3


def _stored_tokens(records: Sequence[TraceRecord]) -> int:
    return sum(len(r.prompt_delta_token_ids) + len(r.completion_token_ids) for r in records)


def _returned_tokens(records: Sequence[TraceRecord]) -> int:
    """Tokens a full read hands back: every full prompt and completion."""
    total, prompt = 0, 0
    for record in records:
        prompt += len(record.prompt_delta_token_ids)
        total += prompt + len(record.completion_token_ids)
        prompt += len(record.completion_token_ids)
    return total


def store_sessions(
    directory: Path, sessions: list[list[TraceRecord]], level: int
) -> tuple[DeltaChainTraceStore, float]:
    """Append every record to a new store in ``directory``; the store and seconds taken."""
    store = DeltaChainTraceStore(directory, compression_level=level)
    start = time.perf_counter()
    for records in sessions:
        for record in records:
            store.append(record)
    return store, time.perf_counter() - start


def measure_size(
    root: Path, flavour: str, turns: int, sessions: list[list[TraceRecord]], level: int
) -> dict[str, Any]:
    flats = [flatten(records) for records in sessions]
    delta_store, delta_write_s = store_sessions(root / f"{flavour}-{turns}-d", sessions, level)
    flat_store, flat_write_s = store_sessions(root / f"{flavour}-{turns}-f", flats, level)
    try:
        delta_bytes = delta_store.size_on_disk() / len(sessions)
        flat_bytes = flat_store.size_on_disk() / len(sessions)
        delta_read_s = flat_read_s = 0.0
        for records in sessions:
            session_id = records[0].session_id
            delta_read_s += _median_ms(partial(delta_store.session, session_id), 3) / 1e3
            flat_read_s += _median_ms(partial(flat_store.session, session_id), 3) / 1e3
    finally:
        delta_store.close()
        flat_store.close()
    unique = _stored_tokens(sessions[0])
    logprobs = sum(len(r.logprobs) for r in sessions[0])
    raw = 4 * unique + 4 * logprobs
    flat_raw = 4 * _stored_tokens(flats[0]) + 4 * logprobs
    returned = sum(_returned_tokens(records) for records in sessions)
    return {
        "turns": turns,
        "sessions": len(sessions),
        "unique_tokens_per_session": unique,
        "raw_bytes_per_session": raw,
        "delta_bytes_per_session": delta_bytes,
        "flat_bytes_per_session": flat_bytes,
        "flat_over_delta": flat_bytes / delta_bytes,
        "flat_over_delta_uncompressed": flat_raw / raw,
        "delta_bytes_per_unique_token": delta_bytes / unique,
        "delta_over_raw": delta_bytes / raw,
        "delta_write_tokens_per_s": sum(map(_stored_tokens, sessions)) / delta_write_s,
        "flat_write_tokens_per_s": sum(map(_stored_tokens, flats)) / flat_write_s,
        "delta_read_tokens_per_s": returned / delta_read_s,
        "flat_read_tokens_per_s": returned / flat_read_s,
    }


def measure_rebuild(
    root: Path, flavour: str, records: list[TraceRecord], level: int
) -> dict[str, Any]:
    """Reading one 100-turn session and rebuilding every prompt: disk, memory and baselines."""
    session_id = records[0].session_id
    flat = flatten(records)
    delta_dir, flat_dir = root / f"{flavour}-rebuild-delta", root / f"{flavour}-rebuild-flat"
    for directory, batch in ((delta_dir, records), (flat_dir, flat)):
        store, _ = store_sessions(directory, [batch], level)
        store.close()
    start = time.perf_counter()
    delta_store = DeltaChainTraceStore(delta_dir, compression_level=level)
    open_ms = (time.perf_counter() - start) * 1e3
    flat_store = DeltaChainTraceStore(flat_dir, compression_level=level)
    memory = MemoryTraceStore()
    for record in records:
        memory.append(record)
    prompts = [trace.prompt_token_ids for trace in memory.session(session_id)]
    try:
        assert [t.prompt_token_ids for t in delta_store.session(session_id)] == prompts
        return {
            "turns": len(records),
            "open_store_ms": open_ms,
            "disk_ms": _median_ms(lambda: delta_store.session(session_id), REPEAT),
            "disk_flat_ms": _median_ms(lambda: flat_store.session(session_id), REPEAT),
            "memory_ms": _median_ms(lambda: memory.session(session_id), REPEAT),
            "copy_floor_ms": _median_ms(lambda: [list(p) for p in prompts], REPEAT),
            "prompt_tokens": sum(map(len, prompts)),
        }
    finally:
        delta_store.close()
        flat_store.close()


def byte_breakdown(root: Path, flavour: str, records: list[TraceRecord], level: int) -> dict:
    """Bytes per turn of one session, by what they hold (see the module docstring)."""
    directory = root / f"{flavour}-breakdown"
    store, _ = store_sessions(directory, [records], level)
    on_disk = store.size_on_disk() - len(MAGIC)
    store.close()
    codec, table, reader, tail = EntryCodec(level), SegmentTable(), SegmentTable(), None
    total = framing = head = mantissas = ids = logprobs = with_context = 0
    replace = msgspec.structs.replace
    for record in records:
        used = tail if tail is not None and count_ids(tail) >= context.MIN_CONTEXT_TOKENS else None

        def body(changed: TraceRecord, used: bytes | None = used) -> int:
            return len(
                msgspec.msgpack.decode(codec.encode_record(changed, table, context=used).entry)[6]
            )

        payload, tokens, _ = codec.encode_record(record, table, context=used)
        entry = msgspec.msgpack.decode(payload)
        full = len(entry[6])
        total += FRAME_HEADER.size + len(payload)
        framing += FRAME_HEADER.size
        head += len(payload) - full - len(entry[7])
        with_context += codec.decode_head(payload, reader).has_context
        mantissas += len(entry[7])
        ids += full - body(replace(record, prompt_delta_token_ids=[], completion_token_ids=[]))
        logprobs += len(entry[7]) + full - body(replace(record, logprobs=[]))
        table.note(record.session_id, record.lineage_id, record.trace_id)
        tail = context.extend_tail(tail, tokens)
    if total != on_disk:
        raise AssertionError(
            f"re-encoding the session gives {total} bytes but the store wrote {on_disk}: the"
            " breakdown no longer encodes records as the store does; update byte_breakdown"
        )
    turns = len(records)
    rest = total - ids - logprobs
    return {
        "turns": turns,
        "bytes_per_turn": total / turns,
        "records_with_context": with_context,
        "ids_per_turn": ids / turns,
        "bytes_per_id": ids / _stored_tokens(records),
        "logprobs_per_turn": logprobs / turns,
        "bytes_per_logprob": logprobs / sum(len(r.logprobs) for r in records),
        "logprob_mantissa_planes_per_turn": mantissas / turns,
        "record_per_turn": rest / turns,
        "record_framing_and_head_per_turn": (framing + head) / turns,
    }


def run(sessions_per_size: int, seed: int, level: int) -> dict[str, Any]:
    """Every measurement; see the module docstring."""
    rng = random.Random(seed)
    per_session_tokens = (DELTA_TOKENS + COMPLETION_TOKENS) * (sum(SIZES) + REBUILD_TURNS + 10)
    stream, decode, corpus = text_stream(per_session_tokens * sessions_per_size)
    sources = {"random": TokenSource("random"), "text": TokenSource("text", stream, decode)}
    results: dict[str, Any] = {"flavours": {}, "rebuild": {}}
    with tempfile.TemporaryDirectory(prefix="rllm-trace-bench-") as tmp:
        root = Path(tmp)
        for flavour, source in sources.items():
            rows = []
            for turns in SIZES:
                sessions = [make_session(source, turns, rng) for _ in range(sessions_per_size)]
                rows.append(measure_size(root, flavour, turns, sessions, level))
                if turns == max(SIZES):
                    results.setdefault("breakdown", {})[flavour] = byte_breakdown(
                        root, flavour, sessions[0], level
                    )
            results["flavours"][flavour] = rows
            rebuild_session = make_session(source, REBUILD_TURNS, rng)
            results["rebuild"][flavour] = measure_rebuild(root, flavour, rebuild_session, level)
        with_text = [
            make_session(sources["text"], 50, rng, with_messages=True)
            for _ in range(sessions_per_size)
        ]
        messages_row = measure_size(root, "text-messages", 50, with_text, level)
        results["text_with_messages_50"] = {
            "delta_bytes_per_unique_token": messages_row["delta_bytes_per_unique_token"],
            "delta_bytes_per_session": messages_row["delta_bytes_per_session"],
        }
    results["goals"] = evaluate(results)
    results["corpus"] = corpus
    results["setup"] = {
        "sizes": list(SIZES),
        "sessions_per_size": sessions_per_size,
        "delta_tokens_per_turn": DELTA_TOKENS,
        "completion_tokens_per_turn": COMPLETION_TOKENS,
        "seed": seed,
        "store_config": (
            f"deltachain: snapshot_every=0, compression_level={level}, fsync=false;"
            f" {context.CONTEXT_TOKENS} tokens of context"
        ),
        "python": platform.python_version(),
        "zstandard": zstandard.__version__,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }
    return results


def _row(results: dict[str, Any], flavour: str, turns: int) -> dict[str, Any]:
    return next(r for r in results["flavours"][flavour] if r["turns"] == turns)


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every goal with its measured value and verdict."""
    checks: list[tuple[str, str, float]] = []
    for flavour in ("random", "text"):
        growth = (
            _row(results, flavour, 100)["delta_bytes_per_session"]
            / _row(results, flavour, 10)["delta_bytes_per_session"]
        )
        checks.append(("growth_100_over_10", flavour, growth))
        checks.append(
            ("flat_over_delta_at_50", flavour, _row(results, flavour, 50)["flat_over_delta"])
        )
    worst_raw = max(r["delta_over_raw"] for r in results["flavours"]["random"])
    checks.append(("random_bytes_over_raw", "random", worst_raw))
    worst_text = max(r["delta_bytes_per_unique_token"] for r in results["flavours"]["text"])
    checks.append(("text_bytes_per_unique_token", "text", worst_text))
    for flavour in ("random", "text"):
        rebuild = results["rebuild"][flavour]
        checks.append(("read_rebuild_100_disk_ms", flavour, rebuild["disk_ms"]))
        checks.append(("read_rebuild_100_memory_ms", flavour, rebuild["memory_ms"]))
    verdicts = []
    for name, flavour, value in checks:
        op, goal = GOALS[name]
        passed = value <= goal if op == "<=" else value >= goal
        verdicts.append(
            {
                "goal": name,
                "flavour": flavour,
                "value": value,
                "target": f"{op} {goal:g}",
                "passed": passed,
            }
        )
    return verdicts


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def _k(value: float) -> str:
    return f"{value / 1e3:,.0f}k" if value >= 1e4 else f"{value:,.0f}"


def render(results: dict[str, Any]) -> str:
    lines = []
    setup = results["setup"]
    lines.append(
        f"Trace storage: {setup['sessions_per_size']} sessions per size, each turn"
        f" {setup['delta_tokens_per_turn']} prompt + {setup['completion_tokens_per_turn']}"
        f" completion tokens with float32 logprobs; {setup['store_config']}"
    )
    for flavour, rows in results["flavours"].items():
        lines.append("")
        lines.append(
            f"{flavour} token ids: bytes per session on disk ('uncompressed': flat/delta at 4 B"
            " per token and logprob), throughput"
        )
        lines.extend(
            right_aligned(
                [
                    "turns",
                    "delta B",
                    "flat B",
                    "flat/delta",
                    "uncompressed",
                    "B/unique tok",
                    "delta/raw",
                    "write tok/s delta",
                    "flat",
                    "read tok/s delta",
                    "flat",
                ],
                [
                    [
                        str(r["turns"]),
                        f"{r['delta_bytes_per_session']:,.0f}",
                        f"{r['flat_bytes_per_session']:,.0f}",
                        f"{r['flat_over_delta']:.1f}x",
                        f"{r['flat_over_delta_uncompressed']:.1f}x",
                        f"{r['delta_bytes_per_unique_token']:.3f}",
                        f"{r['delta_over_raw']:.3f}",
                        _k(r["delta_write_tokens_per_s"]),
                        _k(r["flat_write_tokens_per_s"]),
                        _k(r["delta_read_tokens_per_s"]),
                        _k(r["flat_read_tokens_per_s"]),
                    ]
                    for r in rows
                ],
            )
        )
    lines.append("")
    lines.append(
        f"Reading a {REBUILD_TURNS}-turn session and rebuilding every prompt (median ms);"
        " baselines: the flat store (no rebuild) and copying ready-made prompts"
    )
    lines.extend(
        right_aligned(
            ["ids", "prompt tokens", "disk", "disk flat", "memory", "copy floor", "open store"],
            [
                [
                    flavour,
                    f"{r['prompt_tokens']:,}",
                    f"{r['disk_ms']:.2f}",
                    f"{r['disk_flat_ms']:.2f}",
                    f"{r['memory_ms']:.2f}",
                    f"{r['copy_floor_ms']:.2f}",
                    f"{r['open_store_ms']:.2f}",
                ]
                for flavour, r in results["rebuild"].items()
            ],
        )
    )
    lines.append("")
    lines.append(
        f"Where the bytes of a {max(SIZES)}-turn session go, per turn (ids and logprobs: what"
        " removing them saves; record: the rest)"
    )
    lines.extend(
        right_aligned(
            [
                "ids",
                "B/turn",
                "ids B",
                "B/id",
                "logprobs B",
                "B/logprob",
                "of which mantissas",
                "record B",
                "of which framing+head",
                "with context",
            ],
            [
                [
                    flavour,
                    f"{b['bytes_per_turn']:,.0f}",
                    f"{b['ids_per_turn']:,.0f}",
                    f"{b['bytes_per_id']:.3f}",
                    f"{b['logprobs_per_turn']:,.0f}",
                    f"{b['bytes_per_logprob']:.2f}",
                    f"{b['logprob_mantissa_planes_per_turn']:,.0f}",
                    f"{b['record_per_turn']:,.0f}",
                    f"{b['record_framing_and_head_per_turn']:,.0f}",
                    f"{b['records_with_context']}/{b['turns']}",
                ]
                for flavour, b in results["breakdown"].items()
            ],
        )
    )
    lines.append("")
    extra = results["text_with_messages_50"]
    lines.append(
        "Text with each turn's messages stored too (50 turns):"
        f" {extra['delta_bytes_per_unique_token']:.3f} B per unique token"
    )
    lines.append("")
    lines.append("Goals")
    lines.extend(
        right_aligned(
            ["goal", "ids", "measured", "target", "result"],
            [
                [
                    g["goal"],
                    g["flavour"],
                    f"{g['value']:.3f}",
                    g["target"],
                    "pass" if g["passed"] else "FAIL",
                ]
                for g in results["goals"]
            ],
        )
    )
    corpus = results["corpus"]
    lines.append("")
    lines.append(
        f"text corpus: {corpus['files']} files, {corpus['tokens']:,} tokens from"
        f" {corpus['source']}; tokenizer {corpus['tokenizer']}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sessions", type=int, default=4, help="sessions per size (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compression-level", type=int, default=3, help="zstd level of the stores (default 3)"
    )
    parser.add_argument(
        "--context-tokens",
        type=int,
        default=context.CONTEXT_TOKENS,
        help=f"tokens of context per record (default {context.CONTEXT_TOKENS}; 0: none)",
    )
    args = parser.parse_args(argv)
    context.CONTEXT_TOKENS = args.context_tokens
    results = run(args.sessions, args.seed, args.compression_level)
    print(json.dumps(results, indent=2) if args.json else render(results))
    return 0 if all(goal["passed"] for goal in results["goals"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
