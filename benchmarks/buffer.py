"""Sample buffers: append rate, select latency and recovery time.

Buffers:

- ``file``: rllm-sample-buffer-file, with ``fsync`` on (the default: one ``fdatasync`` per
  append) and off;
- ``object/file``: :class:`~rllm_sample_buffer_object_store.buffer.ObjectStoreSampleBuffer` over
  rllm-object-store-file in a local directory (each append: two create-only puts, each a
  written, fsynced, linked file and an fsynced directory);
- ``object/s3``: the same over rllm-object-store-s3 against a moto server on this machine,
  when ``rllm_core.testing.s3`` and moto are installed (``--no-s3`` leaves it out).

Every sample has 1,024 tokens (random ids below 150,000, float64 logprobs and advantages, two
masks): about 25 KB as msgpack.

Appends: one writer makes ``--appends`` appends of 1 sample and of 64 samples each; appends/s,
samples/s, MB/s and the median and p99 latency of one append. None of the buffers has a group
commit (appends from several threads sharing one fsync): one append is one frame and one
fsync, or two objects. Batching belongs to the caller, and the training loop appends a whole
rollout batch (its groups) in one call, so the 64-sample rows are the loop's case and the
1-sample rows show what one fsync or one round trip costs.

Select: 64 appends of 64 samples wait; a reader then selects 64 samples and commits, again and
again until the backlog is empty (the median of each call), and polls once nothing is left
(the median of ``select`` that finds nothing new). The file buffer's reader is the instance
that appended, reopened; the object buffer's is a new instance, as a trainer in another
process is, so its first read of each payload goes to the store.

Recovery: the time to open a buffer on ``--log-gb`` GB (default 1) of samples and count what
is pending. The file buffer reads its whole log once (checksums, and the frame headers it
keeps): logs of 64-sample frames and of 1-sample frames, with the log in the page cache
(warm) and evicted from it first (cold, ``posix_fadvise(DONTNEED)``). A new object-buffer
reader with nothing committed lists the index and reads every index record, never a payload,
so its time depends on the number of appends, not on their bytes; it is measured over the file
store holding the same 64-sample appends as the file log, with nothing committed and after a
commit of all but the last append (the reader then starts from the position stored with the
watermark). On S3 the appends hold one sample each (``--s3-appends`` of them): their bytes do
not matter to the reader, and moto keeps every object in memory.

Run from the repository root after ``scripts/setup.sh``, with nothing else running::

    .venv/bin/python benchmarks/buffer.py            # a table
    .venv/bin/python benchmarks/buffer.py --json     # one JSON object

``--quick`` runs every case at a tiny size (a smoke test, not a measurement). Needs about
``2 x --log-gb`` GB of free space in the temporary directory (``--tmp``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from _tables import right_aligned
from rllm_core.types import Datum, Sample
from rllm_object_store_file.objects import FileObjectStore
from rllm_sample_buffer_file.buffer import LOG_NAME, FileSampleBuffer
from rllm_sample_buffer_object_store.buffer import ObjectStoreSampleBuffer

TOKENS = 1024
BATCH = 64
PREFIX = "bench/buffer"


def make_samples(count: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    samples = []
    for i in range(count):
        datum = Datum(
            token_ids=[rng.randrange(150_000) for _ in range(TOKENS)],
            logprobs=[-rng.random() * 5 for _ in range(TOKENS)],
            advantages=[rng.uniform(-1, 1)] * TOKENS,
            action_mask=[rng.random() < 0.7 for _ in range(TOKENS)],
            observation_mask=[rng.random() < 0.2 for _ in range(TOKENS)],
        )
        samples.append(
            Sample(
                datum=datum,
                group_id=f"g{seed}-{i // 8}",
                episode_id=f"e{seed}-{i}",
                weight_version=seed,
                reward=rng.random(),
            )
        )
    return samples


SAMPLE_BYTES = len(msgspec.msgpack.encode(make_samples(1, 0)[0]))


# --------------------------------------------------------------------------------------------
# Buffers
# --------------------------------------------------------------------------------------------


@dataclass
class Kind:
    """How to open one kind of buffer on a location (a directory, or a prefix in S3)."""

    name: str
    open: Callable[[str], Any]
    fresh_location: Callable[[], str]


def kinds(root: Path, s3: Any | None) -> list[Kind]:
    counter = iter(range(10**6))

    def directory() -> str:
        path = root / f"b{next(counter)}"
        path.mkdir()
        return str(path)

    found = [
        Kind("file, fsync", lambda path: FileSampleBuffer(path, fsync=True), directory),
        Kind("file, no fsync", lambda path: FileSampleBuffer(path, fsync=False), directory),
        Kind(
            "object/file",
            lambda path: ObjectStoreSampleBuffer(FileObjectStore(path), PREFIX),
            directory,
        ),
    ]
    if s3 is not None:
        found.append(
            Kind(
                "object/s3 (moto)",
                lambda prefix: ObjectStoreSampleBuffer(s3, prefix),
                lambda: f"bench/b{next(counter)}",
            )
        )
    return found


@contextlib.contextmanager
def s3_store() -> Iterator[Any]:
    """An S3 object store on a moto server, or None when the S3 plugin or moto is missing."""
    try:
        from rllm_core.testing import s3 as s3_testing
    except ImportError:
        yield None
        return
    with s3_testing.moto_object_store() as store:
        yield store


def _ms(seconds: Sequence[float], quantile: float = 0.5) -> float:
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))] * 1e3


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


def measure_appends(kind: Kind, per_append: int, appends: int) -> dict[str, Any]:
    batches = [make_samples(per_append, seed) for seed in range(min(appends, 8))]
    buffer = kind.open(kind.fresh_location())
    times = []
    try:
        started = time.perf_counter()
        for n in range(appends):
            before = time.perf_counter()
            buffer.append(batches[n % len(batches)])
            times.append(time.perf_counter() - before)
        elapsed = time.perf_counter() - started
    finally:
        buffer.close()
    return {
        "buffer": kind.name,
        "samples_per_append": per_append,
        "appends": appends,
        "appends_per_s": appends / elapsed,
        "samples_per_s": appends * per_append / elapsed,
        "mb_per_s": appends * per_append * SAMPLE_BYTES / elapsed / 1e6,
        "append_p50_ms": _ms(times),
        "append_p99_ms": _ms(times, 0.99),
    }


def measure_select(kind: Kind, appends: int, polls: int) -> dict[str, Any]:
    location = kind.fresh_location()
    writer = kind.open(location)
    batch = make_samples(BATCH, 1)
    for _ in range(appends):
        writer.append(batch)
    writer.close()
    reader = kind.open(location)
    selects, commits = [], []
    try:
        while True:
            before = time.perf_counter()
            chosen = reader.select(max_samples=BATCH)
            selects.append(time.perf_counter() - before)
            if not chosen.samples:
                break
            before = time.perf_counter()
            reader.commit(chosen.watermark)
            commits.append(time.perf_counter() - before)
        empty = []
        for _ in range(polls):
            before = time.perf_counter()
            reader.select(max_samples=BATCH)
            empty.append(time.perf_counter() - before)
    finally:
        reader.close()
    return {
        "buffer": kind.name,
        "backlog_samples": appends * BATCH,
        "select_p50_ms": _ms(selects[:-1]),
        "select_p99_ms": _ms(selects[:-1], 0.99),
        "commit_p50_ms": _ms(commits),
        "poll_p50_ms": _ms(empty),
    }


def fill(buffer: Any, log_bytes: int, per_append: int) -> int:
    """Append ``per_append``-sample batches until about ``log_bytes`` of samples are stored;
    return the number of appends."""
    batches = [make_samples(per_append, seed) for seed in range(4)]
    appends = max(1, round(log_bytes / (per_append * SAMPLE_BYTES)))
    for n in range(appends):
        buffer.append(batches[n % len(batches)])
    return appends


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _time_open(open_buffer: Callable[[], Any], before: Callable[[], None], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        before()
        started = time.perf_counter()
        buffer = open_buffer()
        buffer.pending()
        times.append(time.perf_counter() - started)
        buffer.close()
    return statistics.median(times)


def measure_file_recovery(root: Path, log_bytes: int, per_append: int) -> dict[str, Any]:
    path = root / f"recovery-{per_append}"
    buffer = FileSampleBuffer(path, fsync=False)
    try:
        appends = fill(buffer, log_bytes, per_append)
    finally:
        buffer.close()
    log = path / LOG_NAME
    result = {
        "buffer": "file",
        "samples_per_append": per_append,
        "appends": appends,
        "log_gb": log.stat().st_size / 1e9,
        "warm_s": _time_open(lambda: FileSampleBuffer(path), lambda: log.read_bytes(), 3),
        "cold_s": _time_open(lambda: FileSampleBuffer(path), lambda: _evict(log), 3),
    }
    return result


def measure_object_recovery(
    name: str, open_buffer: Callable[[], Any], log_bytes: int, per_append: int
) -> dict[str, Any]:
    writer = open_buffer()
    appends = fill(writer, log_bytes, per_append)
    nothing = _time_open(open_buffer, lambda: None, 3)
    writer.commit(writer.committed() + writer.pending() - per_append)
    after_commit = _time_open(open_buffer, lambda: None, 3)
    writer.close()
    return {
        "buffer": name,
        "samples_per_append": per_append,
        "appends": appends,
        "log_gb": appends * per_append * SAMPLE_BYTES / 1e9,
        "nothing_committed_s": nothing,
        "all_but_one_committed_s": after_commit,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    load = os.getloadavg()[0]
    log_bytes = int(args.log_gb * 1e9)
    results: dict[str, Any] = {"appends": [], "select": [], "recovery": []}
    with (
        tempfile.TemporaryDirectory(dir=args.tmp) as tmp,
        s3_store() if args.s3 else contextlib.nullcontext() as s3,
    ):
        root = Path(tmp)
        for kind in kinds(root, s3):
            for per_append in (1, BATCH):
                results["appends"].append(measure_appends(kind, per_append, args.appends))
            results["select"].append(measure_select(kind, args.backlog, args.polls))
        for per_append in (BATCH, 1):
            results["recovery"].append(measure_file_recovery(root, log_bytes, per_append))
        store_root = root / "recovery-object"
        results["recovery"].append(
            measure_object_recovery(
                "object/file",
                lambda: ObjectStoreSampleBuffer(FileObjectStore(store_root), PREFIX),
                log_bytes,
                BATCH,
            )
        )
        if s3 is not None:
            results["recovery"].append(
                measure_object_recovery(
                    "object/s3 (moto)",
                    lambda: ObjectStoreSampleBuffer(s3, "bench/recovery"),
                    args.s3_appends * SAMPLE_BYTES,
                    1,
                )
            )
    results["setup"] = {
        "tokens_per_sample": TOKENS,
        "sample_bytes": SAMPLE_BYTES,
        "appends": args.appends,
        "backlog_appends": args.backlog,
        "log_gb": args.log_gb,
        "s3": s3 is not None,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "load_average_before": load,
    }
    return results


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def render(results: dict[str, Any]) -> str:
    setup = results["setup"]
    lines = [
        f"Sample buffers: {setup['tokens_per_sample']}-token samples of {setup['sample_bytes']}"
        f" bytes; load average before {setup['load_average_before']:.2f}",
        "",
        f"Appends ({setup['appends']} per row, one writer)",
    ]
    lines += right_aligned(
        ["buffer", "samples/append", "appends/s", "samples/s", "MB/s", "p50 ms", "p99 ms"],
        [
            [
                r["buffer"],
                str(r["samples_per_append"]),
                f"{r['appends_per_s']:.1f}",
                f"{r['samples_per_s']:.0f}",
                f"{r['mb_per_s']:.1f}",
                f"{r['append_p50_ms']:.2f}",
                f"{r['append_p99_ms']:.2f}",
            ]
            for r in results["appends"]
        ],
        left=1,
    )
    lines += [
        "",
        f"Select {BATCH} and commit, over a backlog of {setup['backlog_appends']} x {BATCH}",
    ]
    lines += right_aligned(
        ["buffer", "select p50 ms", "select p99 ms", "commit p50 ms", "empty poll p50 ms"],
        [
            [
                r["buffer"],
                f"{r['select_p50_ms']:.2f}",
                f"{r['select_p99_ms']:.2f}",
                f"{r['commit_p50_ms']:.2f}",
                f"{r['poll_p50_ms']:.3f}",
            ]
            for r in results["select"]
        ],
        left=1,
    )
    lines += ["", "Recovery: open and count what is pending (median of 3)"]
    rows = []
    for r in results["recovery"]:
        if r["buffer"] == "file":
            times = f"{r['warm_s']:.2f} warm, {r['cold_s']:.2f} cold"
        else:
            times = (
                f"{r['nothing_committed_s']:.2f} nothing committed,"
                f" {r['all_but_one_committed_s']:.3f} after a commit"
            )
        rows.append(
            [
                r["buffer"],
                str(r["samples_per_append"]),
                str(r["appends"]),
                f"{r['log_gb']:.2f}",
                times,
            ]
        )
    lines += right_aligned(["buffer", "samples/append", "appends", "GB", "seconds"], rows, left=1)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--appends", type=int, default=200, help="appends per append row")
    parser.add_argument("--backlog", type=int, default=64, help="appends of 64 to select from")
    parser.add_argument("--polls", type=int, default=50, help="empty polls timed")
    parser.add_argument("--log-gb", type=float, default=1.0, help="size of the recovered logs")
    parser.add_argument(
        "--s3-appends", type=int, default=640, help="index records of the S3 recovery case"
    )
    parser.add_argument("--no-s3", dest="s3", action="store_false", help="leave out S3 on moto")
    parser.add_argument("--tmp", default=None, help="directory for the buffers (default: TMPDIR)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.appends, args.backlog, args.polls, args.log_gb, args.s3_appends = 4, 2, 3, 0.002, 4
    results = run(args)
    print(json.dumps(results, indent=2) if args.json else render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
