"""The trainer on its own island without training: the scheduler launches each incarnation as a
process through the local-process launcher, hands it a command file, waits for its ready
marker, stops it through the object store and journals each lifecycle event; an incarnation
that is never ready, loses its heartbeat or comes up after a newer one was launched is
released. The job is the real :class:`IslandIncarnation` over a role that only counts steps
(``island_fake_job.py``); ``tests/test_trainer_island_training.py`` trains for real."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from island_fake_job import CountingRole
from pydantic import ValidationError
from rllm_core.errors import SchedulerGaveUp
from rllm_core.plan.schema import SchedulerSection
from rllm_core.training.island import (
    CommandFile,
    IslandIncarnation,
    IslandTrainer,
    LocalProcessLauncher,
    island_key,
    read_command,
)
from rllm_core.training.pipeline import Ticket
from rllm_core.training.scheduler import Controller, SchedulerJournal, SchedulerSettings
from rllm_core.training.shared import SharedRun
from rllm_object_store_file.objects import FileObjectStore

RUN = "isl"
STEPS = 4
JOB = Path(__file__).with_name("island_fake_job.py")


def ticket(step: int) -> Ticket:
    return Ticket(step=step, first=step - 1, count=1, groups=1, data={}, rollout={})


class Recording(LocalProcessLauncher):
    """The local-process launcher, keeping each job it launched."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.jobs: list[Any] = []

    async def launch(self, incarnation: int, command_file_uri: str) -> Any:
        job = await super().launch(incarnation, command_file_uri)
        self.jobs.append(job)
        return job


def scheduler(
    tmp_path: Path, argv: Any, *, ready_timeout_s: float = 30.0, **island: Any
) -> tuple[Controller, IslandTrainer, Recording, SharedRun]:
    store = FileObjectStore(tmp_path / "store")
    shared = SharedRun(store, RUN)
    launcher = Recording(store, logs=tmp_path / "logs", argv=argv)
    trainer = IslandTrainer(
        launcher=launcher,
        shared=shared,
        command=CommandFile(
            incarnation=0, run=RUN, plan_path="plan.toml", plan="[run]\n", cwd=str(tmp_path)
        ),
        steps=STEPS,
        ready_timeout_s=ready_timeout_s,
        poll_s=0.02,
        **island,
    )
    controller = Controller(
        lifecycle=trainer,
        settings=SchedulerSettings(batch_groups=1, idle_stop_s=0.2, poll_s=0.02, max_failures=1),
        store=store,
        prefix=shared.key("scheduler"),
        backlog=lambda: shared.waiting_groups(
            trainer._seen if controller.state.running else shared.progress()[0], 1
        ),
        data_ended=lambda: shared.ticket(STEPS) is not None,
    )
    trainer.record = controller.record_event
    return controller, trainer, launcher, shared


def fake_job(tmp_path: Path) -> Any:
    return lambda command, key: [
        sys.executable,
        str(JOB),
        str(tmp_path / "store"),
        command.run,
        str(command.incarnation),
    ]


def events(shared: SharedRun) -> list[tuple[Any, ...]]:
    kinds = ("started", "launched", "ready", "ready-timeout", "released", "stopped", "failed")
    return [
        (r["kind"], r["incarnation"], r.get("trigger") or r.get("reason"))
        for r in SchedulerJournal(shared.store, shared.key("scheduler")).read()
        if r["kind"] in kinds
    ]


def test_two_incarnations_launch_get_ready_stop_and_are_released(tmp_path):
    controller, _, launcher, shared = scheduler(tmp_path, fake_job(tmp_path))
    for step in (1, 2):
        shared.put_ticket(ticket(step))

    async def produce_later() -> None:
        while not any(e[0] == "stopped" for e in events(shared)):
            await asyncio.sleep(0.02)
        for step in (3, 4):
            shared.put_ticket(ticket(step))

    async def both() -> Any:
        outcome, _ = await asyncio.gather(controller.run(), produce_later())
        return outcome

    began = time.monotonic()
    outcome = asyncio.run(asyncio.wait_for(both(), 60))
    assert (outcome.ended, outcome.incarnation, outcome.rounds) == ("finished", 2, STEPS)
    assert events(shared) == [
        ("started", 1, None),
        ("launched", 1, None),
        ("ready", 1, None),
        ("released", 1, "stopped"),
        ("stopped", 1, "scheduled"),
        ("started", 2, None),
        ("launched", 2, None),
        ("ready", 2, None),
        ("released", 2, "stopped"),
        ("stopped", 2, "final"),
    ]
    records = SchedulerJournal(shared.store, shared.key("scheduler")).read()
    launched = [r for r in records if r["kind"] == "launched"]
    assert [r["job"] for r in launched] == [job.job_id for job in launcher.jobs]
    assert [r["command"] for r in launched] == [
        island_key(shared, n, "command.json") for n in (1, 2)
    ]
    first = read_command(shared.store, launched[0]["command"])
    assert (first.incarnation, first.role, first.run, first.resume_cut) == (1, "trainer", RUN, None)
    assert (first.plan_path, first.plan, first.cwd) == ("plan.toml", "[run]\n", str(tmp_path))
    assert first.launched_at >= began - 1
    assert read_command(shared.store, launched[1]["command"]).incarnation == 2
    # Each job exited 0 after cutting with the trigger it was sent.
    assert [job.process.returncode for job in launcher.jobs] == [0, 0]
    for n, trigger in ((1, "scheduled"), (2, "final")):
        assert f"ended: {trigger}" in (tmp_path / "logs" / f"trainer-{n}.log").read_text()
        stopped = json.loads(shared.store.get(island_key(shared, n, "stopped")))
        assert stopped["trigger"] == trigger
    assert shared.progress()[0] == STEPS


def test_an_incarnation_not_ready_in_time_is_released_and_fails(tmp_path):
    argv = lambda command, key: [sys.executable, "-c", "import time; time.sleep(60)"]  # noqa: E731
    controller, _, launcher, shared = scheduler(tmp_path, argv, ready_timeout_s=0.5)
    shared.put_ticket(ticket(1))
    shared.put_ticket(ticket(2))
    began = time.monotonic()
    with pytest.raises(SchedulerGaveUp, match="TrainerNotReady: trainer incarnation 1"):
        asyncio.run(asyncio.wait_for(controller.run(), 30))
    assert time.monotonic() - began < 10
    assert events(shared) == [
        ("started", 1, None),
        ("launched", 1, None),
        ("ready-timeout", 1, None),
        ("released", 1, "not ready within 0.5 s"),
        ("failed", 1, None),
    ]
    assert launcher.jobs[0].process.poll() is not None  # killed, not left running


def test_an_incarnation_whose_heartbeat_stops_is_released(tmp_path):
    beat_once = (
        "import json, sys, time\n"
        "from rllm_object_store_file.objects import FileObjectStore\n"
        "store = FileObjectStore(sys.argv[1])\n"
        "for name in ('heartbeat', 'ready'):\n"
        "    store.put(sys.argv[2] + name, json.dumps({'ts': time.time(), 'step': 0}).encode())\n"
        "time.sleep(60)\n"
    )
    argv = lambda command, key: [  # noqa: E731
        sys.executable,
        "-c",
        beat_once,
        str(tmp_path / "store"),
        key.removesuffix("command.json"),
    ]
    controller, _, launcher, shared = scheduler(tmp_path, argv, lease_s=0.3)
    shared.put_ticket(ticket(1))
    shared.put_ticket(ticket(2))
    with pytest.raises(SchedulerGaveUp, match="wrote no heartbeat"):
        asyncio.run(asyncio.wait_for(controller.run(), 30))
    kinds = events(shared)
    assert kinds[-2:] == [("released", 1, kinds[-2][2]), ("failed", 1, None)]
    assert kinds[-2][2].startswith("heartbeat lost for ")
    assert launcher.jobs[0].process.poll() is not None


def test_a_job_that_comes_up_after_a_newer_incarnation_was_launched_does_nothing(tmp_path):
    shared = SharedRun(FileObjectStore(tmp_path / "store"), RUN)
    for n in (1, 2):
        command = {"incarnation": n, "run": RUN, "plan_path": "plan.toml", "plan": ""}
        shared.store.put(island_key(shared, n, "command.json"), json.dumps(command).encode())
    role = CountingRole(shared, poll_s=0.01)
    ended = asyncio.run(IslandIncarnation(role, 1).run())  # type: ignore[arg-type]
    assert (ended, role.calls) == ("orphaned", [])
    assert not shared.store.exists(island_key(shared, 1, "ready"))


def test_ready_timeout_is_refused_without_a_launcher_and_when_not_positive():
    with pytest.raises(ValidationError, match=r'ready_timeout_s = 5.0 .* launcher = "in-process"'):
        SchedulerSection(ready_timeout_s=5)
    with pytest.raises(ValidationError, match="ready_timeout_s"):
        SchedulerSection(launcher="local-process", ready_timeout_s=0)
    assert SchedulerSection(launcher="local-process", ready_timeout_s=5).ready_timeout_s == 5
