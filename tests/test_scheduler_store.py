"""The scheduler journal on the ``file`` object store: writers racing for one record leave
exactly one winner, and a controller whose process is killed mid-run is continued by a new one
on a reopened store (idle timer, numbering, measured start-up time)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from rllm_core.training.scheduler import (
    Controller,
    JournalConflictError,
    SchedulerJournal,
    SchedulerSettings,
)
from rllm_object_store_file.objects import FileObjectStore
from test_scheduler import EPOCH, PREFIX, RemoteTrainer, World

CORE_TESTS = Path(__file__).resolve().parent.parent / "core" / "tests"

WRITERS = 8

# Incarnation 1 starts at EPOCH (30 s start-up), trains its batch (5 s) and idles from
# EPOCH + 35; the process dies 20 s later, with the trainer (on its machine) still up.
CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    sys.path.insert(0, sys.argv[2])
    from test_scheduler import EPOCH, PREFIX, RemoteTrainer, World
    from rllm_core.training.scheduler import Controller, SchedulerSettings
    from rllm_object_store_file.objects import FileObjectStore

    class Dying(World):
        def advance(self, seconds):
            super().advance(seconds)
            if self.now >= EPOCH + 55.0:
                os._exit(9)

    world = Dying(arrivals=[EPOCH] * 4 + [EPOCH + 5000.0] * 4, batch=4)
    asyncio.run(
        Controller(
            lifecycle=RemoteTrainer(world, startup_s=30.0),
            settings=SchedulerSettings(batch_groups=4, poll_s=1.0),
            store=FileObjectStore(sys.argv[1]),
            prefix=PREFIX,
            backlog=world.backlog,
            data_ended=world.data_ended,
            clock=lambda: world.now,
            sleep=world.sleep,
        ).run()
    )
    """
)


def test_racing_writers_leave_one_record(tmp_path: Path) -> None:
    journals = [SchedulerJournal(FileObjectStore(tmp_path), PREFIX) for _ in range(WRITERS)]
    for journal in journals:
        journal.read()
    barrier = threading.Barrier(WRITERS)
    outcomes: list[str] = []

    def write(i: int) -> None:
        barrier.wait()
        try:
            journals[i].append({"kind": "decision", "ts": EPOCH, "writer": i})
            outcomes.append("won")
        except JournalConflictError:
            outcomes.append("lost")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["lost"] * (WRITERS - 1) + ["won"]
    [record] = SchedulerJournal(FileObjectStore(tmp_path), PREFIX).read()
    assert record["n"] == 0 and 0 <= record["writer"] < WRITERS


def test_a_killed_controller_is_continued_on_a_reopened_store(tmp_path: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), str(CORE_TESTS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 9, child.stderr
    before = SchedulerJournal(FileObjectStore(tmp_path), PREFIX).read()
    assert [r["kind"] for r in before if r["kind"] != "decision"] == [
        "started",
        "ready",
        "training",
        "idle",
    ]

    world = World(arrivals=[EPOCH] * 4 + [EPOCH + 5000.0] * 4, batch=4, now=EPOCH + 55.0)
    world.trained = 4
    trainer = RemoteTrainer(world, startup_s=10.0)
    outcome = asyncio.run(
        Controller(
            lifecycle=trainer,
            settings=SchedulerSettings(batch_groups=4, poll_s=1.0),
            store=FileObjectStore(tmp_path),
            prefix=PREFIX,
            backlog=world.backlog,
            data_ended=world.data_ended,
            clock=lambda: world.now,
            sleep=world.sleep,
        ).run()
    )
    assert trainer.named("reattach") == [(1, EPOCH + 55.0)]
    (trigger, stopped), *_ = trainer.named("stop")
    assert trigger == "scheduled"
    assert EPOCH + 35.0 + 30.0 <= stopped <= EPOCH + 66.0, "idle since before the kill, T_s 30"
    assert [i for i, _ in trainer.named("start")] == [2]
    assert outcome.ended == "finished" and outcome.trigger == "final"
    records = SchedulerJournal(FileObjectStore(tmp_path), PREFIX).read()
    assert records[: len(before)] == before
    assert [r["startup_s"] for r in records if r["kind"] == "ready"] == [30.0, 10.0]
