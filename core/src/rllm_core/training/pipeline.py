"""The rollout side of the asynchronous pipeline (``[run].pipeline = "async"``).

A :class:`RolloutProducer` keeps rolling out batches while the trainer trains: batch ``r``
takes the next ``batch_size`` tasks of the data order, runs their groups through the rollout
runner under the session label ``step = r``, builds its datums, appends them to the sample
buffer in one call and queues a :class:`Ticket` saying where they are. Batches roll out side
by side as far as the bound allows, and are appended and queued in step order. Step ``r``
trains on batch ``r``: tickets are consumed one per step, in order. With
``[algorithm].filter_groups`` a batch rolls out more tasks until it has ``batch_size``
informative groups (:mod:`rollout.dynamic <rllm_core.rollout.dynamic>`); those extra tasks are
taken from the data order when needed, so batches that overlap interleave their takes, and a run
resumed from batch ``r`` may see a few tasks again or skip them.

The age bound: each step publishes ``mini_batches * epochs`` weight versions, so with
``max_policy_age = N`` the trainer can take samples up to ``lead = N // (mini_batches *
epochs)`` steps old. Dispatch is continuous, group by group (:class:`DispatchGate`): a group
of batch ``r`` starts whenever step ``r - 1 - lead`` is trained and fewer than ``(1 + lead) *
batch_size`` groups are in flight (dispatched, and the step that trains them not yet trained),
its rollouts as places under ``[rollout].max_concurrency`` free up; every step trained frees
its batch's places at once, and the next groups start without waiting for a whole batch to
finish. Every model call of a group of batch ``r`` therefore samples a version at least
``r - 1 - lead`` steps new, so no sample outlives the bound unless the trainer publishes
versions other than expected; the trainer still checks each group's age and drops stale ones.
Groups are dispatched in step order, so that the data order is taken as a step at a time
would take it. A producer as far ahead as the bound allows waits (``async/sampler_wait_s``).

Versions: every sample of a group carries the group's version, the oldest policy behind any
model call of any of its episodes, so a group is trained or dropped whole.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from rllm_core.algorithms import DatumBuilder
from rllm_core.algorithms.distill import TeacherScoring
from rllm_core.ports import SampleBuffer
from rllm_core.rollout import RolloutBatch, RolloutRunner, check_failures
from rllm_core.rollout.dynamic import sample_informative
from rllm_core.rollout.gauge import Gauge
from rllm_core.run.metrics import episode_record, rollout_metrics
from rllm_core.run.state import DataOrder
from rllm_core.types import Sample, Task

__all__ = [
    "DispatchGate",
    "RolloutProducer",
    "RoundThrottle",
    "Ticket",
    "TicketQueue",
    "group_versions",
]


@dataclass
class Ticket:
    """One rollout batch in the sample buffer, waiting for the step that trains it.

    ``first`` and ``count`` locate its samples (sequences ``first .. first + count - 1``);
    ``groups`` counts the groups among them; ``data`` is the data order after its tasks were
    taken; ``rollout`` the rollout part of the step's metrics line and ``episodes`` its
    ``episodes.jsonl`` records.
    """

    step: int
    first: int
    count: int
    groups: int
    data: dict[str, Any]
    rollout: dict[str, float]
    episodes: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "first": self.first,
            "count": self.count,
            "groups": self.groups,
            "data": self.data,
            "rollout": self.rollout,
            "episodes": self.episodes,
        }

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Ticket:
        return cls(
            step=int(row["step"]),
            first=int(row["first"]),
            count=int(row["count"]),
            groups=int(row["groups"]),
            data=dict(row["data"]),
            rollout={k: float(v) for k, v in row["rollout"].items()},
            episodes=list(row["episodes"]),
        )


@dataclass
class _Failed:
    """The producer stopped with ``error`` before producing batch ``step``."""

    step: int
    error: BaseException


class TicketQueue:
    """Tickets in step order; one event loop."""

    def __init__(self) -> None:
        self._items: deque[Ticket | _Failed] = deque()
        self._ready = asyncio.Event()

    def put(self, item: Ticket | _Failed) -> None:
        self._items.append(item)
        self._ready.set()

    async def get(self) -> Ticket:
        """The next ticket; raises the producer's error when it stopped there instead."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if isinstance(item, _Failed):
            self._items.appendleft(item)
            raise item.error
        return item

    def failure(self) -> BaseException | None:
        """What stopped the producer, once it is queued; None otherwise."""
        for item in self._items:
            if isinstance(item, _Failed):
                return item.error
        return None


class DispatchGate:
    """Admits rollout groups one at a time, in dispatch order (batch ``r``'s groups ``0 ..
    groups_per_step - 1``, then batch ``r + 1``'s, from batch ``first`` on): group ``(r, j)``
    starts once step ``r - 1 - lead`` is trained and fewer than ``capacity = (1 + lead) *
    groups_per_step`` groups are in flight. A group is in flight from its admission until
    :meth:`trained` passes its step; the batches after ``trained`` and before ``first``
    (queued before a resume, or produced by an earlier sampler) count as in flight from the
    start. ``in_flight`` is the count (and its mean over time)."""

    def __init__(self, *, trained: int, lead: int, groups_per_step: int, first: int) -> None:
        self.lead = lead
        self.groups_per_step = groups_per_step
        self.capacity = (1 + lead) * groups_per_step
        self._trained = trained
        self._next = (first, 0)
        self._held = {step: groups_per_step for step in range(trained + 1, first)}
        self.in_flight = Gauge()
        self.in_flight.add(sum(self._held.values()))
        self._closed = False
        self._changed = asyncio.Event()

    def close(self) -> None:
        """Let every waiter through at once (the producer is stopping)."""
        self._closed = True
        self._changed.set()

    def trained(self, step: int) -> None:
        """Step ``step`` is trained: its batch and those before it leave the flight."""
        self._trained = max(self._trained, step)
        for done in [s for s in self._held if s <= step]:
            self.in_flight.add(-self._held.pop(done))
        self._changed.set()

    def _admits(self, step: int) -> bool:
        return self._trained >= step - 1 - self.lead and self.in_flight.value < self.capacity

    async def acquire(self, step: int, index: int) -> float:
        """Wait until group ``index`` of batch ``step`` may start and count it in flight;
        returns the seconds it waited for the trainer once it was next in order."""
        waited = 0.0
        began: float | None = None
        while not self._closed:
            if self._next == (step, index):
                if self._admits(step):
                    break
                if began is None:
                    began = time.monotonic()
            self._changed.clear()
            await self._changed.wait()
        if began is not None:
            waited = time.monotonic() - began
        if not self._closed:
            self._held[step] = self._held.get(step, 0) + 1
            self.in_flight.add(1)
            last = index + 1 == self.groups_per_step
            self._next = (step + 1, 0) if last else (step, index + 1)
            self._changed.set()
        return waited


def group_versions(samples: Sequence[Sample]) -> list[Sample]:
    """``samples`` with each one's ``weight_version`` set to the oldest in its group."""
    oldest: dict[str, int] = {}
    for sample in samples:
        oldest[sample.group_id] = min(
            oldest.get(sample.group_id, sample.weight_version), sample.weight_version
        )
    return [
        msgspec.structs.replace(sample, weight_version=oldest[sample.group_id])
        for sample in samples
    ]


class RoundThrottle:
    """Spaces the starts of the sampler's rounds (one batch each) at least ``min_round_s``
    apart (``[scheduler].min_round_s``): :meth:`wait` returns once that long has passed since
    the last :meth:`started`. A sampler that outpaces the trainer then leaves it idle between
    batches: a trainer started for one batch is stopped by rule S1 before the next when
    ``min_round_s`` exceeds its start-up, its round and ``idle_stop_s`` together."""

    def __init__(
        self,
        min_round_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.min_round_s = min_round_s
        self.clock = clock
        self.sleep = sleep
        self._last: float | None = None
        self.waited_s = 0.0
        """Seconds spent in :meth:`wait` so far."""

    async def wait(self) -> None:
        if self._last is None:
            return
        left = self._last + self.min_round_s - self.clock()
        if left > 0:
            self.waited_s += left
            await self.sleep(left)

    def started(self) -> None:
        self._last = self.clock()


class RolloutProducer:
    """Rolls out batches ``next_step .. last_step`` into ``buffer``; see the module docstring.

    Each group starts as soon as the gate admits it, even while the batch before is still
    rolling out (the runner's ``max_concurrency`` bounds every rollout together); batches are
    appended to the buffer and queued in step order. With ``filter_groups`` the extra rounds
    of a batch replace its groups with equal rewards and start without asking the gate.
    ``on_ticket`` is called with each ticket once its samples are in the buffer, before the
    trainer can see it (the run records it there); ``on_start`` with a batch's step and its
    number of rollouts when it starts. ``run`` ends once ``last_step`` is queued; an error in
    a batch (too many failed rollouts, a harness bug) is queued in its place and nothing
    after it, so that the trainer first trains every batch before it. Cancelling ``run``
    cancels every batch in flight. ``sampler_busy`` reads the sampler's busy clock
    (:class:`~rllm_core.ports.BusyClock`) for a pipeline whose batches never overlap (a lead
    of 0): each batch's line then has ``time/sampler_busy_s`` and ``sampler_utilization``.
    ``scoring`` (on-policy distillation) replaces each built batch's advantages with a
    teacher's per-token ones and adds its ``distill/*`` metrics to the batch's line.
    ``throttle`` spaces the starts of batches (:class:`RoundThrottle`).
    ``serving_metrics`` gives the serving side's figures, added to each batch's line: the
    gateway workers' calls since its last call (``gateway/calls/<i>``) and the sampler's
    weight-update counts (:class:`~rllm_core.ports.SyncCounters`).
    """

    def __init__(
        self,
        *,
        runner: RolloutRunner,
        builder: DatumBuilder,
        tasks: Sequence[Task],
        data: DataOrder,
        next_step: int,
        last_step: int,
        batch_size: int,
        max_failed_fraction: float,
        buffer: SampleBuffer,
        gate: DispatchGate,
        queue: TicketQueue,
        on_ticket: Callable[[Ticket], None],
        on_start: Callable[[int, int], None] = lambda step, rollouts: None,
        filter_groups: str = "none",
        max_sample_batches: int = 1,
        sampler_busy: Callable[[], float | None] = lambda: None,
        scoring: TeacherScoring | None = None,
        throttle: RoundThrottle | None = None,
        serving_metrics: Callable[[], Mapping[str, float]] = dict,
    ) -> None:
        self.runner = runner
        self.builder = builder
        self.tasks = list(tasks)
        self.data = data
        self.next_step = next_step
        self.last_step = last_step
        self.batch_size = batch_size
        self.max_failed_fraction = max_failed_fraction
        self.buffer = buffer
        self.gate = gate
        self.queue = queue
        self.on_ticket = on_ticket
        self.on_start = on_start
        self.filter_groups = filter_groups
        self.max_sample_batches = max_sample_batches
        self.sampler_busy = sampler_busy
        self.scoring = scoring
        self.throttle = throttle
        self.serving_metrics = serving_metrics
        self.waited_s = 0.0
        """Seconds spent waiting for the trainer since the last :meth:`take_waited`."""
        self._failed = False

    def take_waited(self) -> float:
        waited, self.waited_s = self.waited_s, 0.0
        return waited

    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            # The trainer waits on the queue: whatever stops the producer must reach it.
            self._fail(_Failed(self.next_step, exc))

    def _fail(self, failure: _Failed) -> None:
        if not self._failed:
            self._failed = True
            self.gate.close()
            self.queue.put(failure)

    async def _run(self) -> None:
        previous: asyncio.Future[None] | None = None
        async with asyncio.TaskGroup() as batches:
            while self.next_step <= self.last_step and not self._failed:
                step = self.next_step
                if self.throttle is not None:
                    await self.throttle.wait()
                waited = await self.gate.acquire(step, 0)
                if self.throttle is not None:
                    self.throttle.started()
                # Added after the await: take_waited may have reset the sum meanwhile.
                self.waited_s += waited
                if self._failed:
                    break
                batch_tasks = [self.tasks[i] for i in self.data.take(self.batch_size)]
                queued = asyncio.get_running_loop().create_future()
                batches.create_task(
                    self._batch(step, batch_tasks, self.data.to_dict(), previous, queued),
                    name=f"rollout batch {step}",
                )
                previous = queued
                self.next_step += 1

    async def _batch(
        self,
        step: int,
        batch_tasks: list[Task],
        data: dict[str, Any],
        previous: asyncio.Future[None] | None,
        queued: asyncio.Future[None],
    ) -> None:
        """Roll out one batch, then, once the batch before is queued, queue it."""
        try:
            try:
                outcome: tuple[Ticket, list[Sample]] | _Failed = await self._roll_out(
                    step, batch_tasks, data
                )
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                outcome = _Failed(step, exc)
            if previous is not None:
                await previous
            if self._failed:
                return
            if not isinstance(outcome, _Failed):
                try:
                    ticket = await self._store(*outcome)
                    self.on_ticket(ticket)
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:
                    outcome = _Failed(step, exc)
                else:
                    self.queue.put(ticket)
                    return
            self._fail(outcome)
        finally:
            if not queued.done():
                queued.set_result(None)

    async def _roll_out(
        self, step: int, batch_tasks: list[Task], data: dict[str, Any]
    ) -> tuple[Ticket, list[Sample]]:
        self.on_start(step, len(batch_tasks) * self.runner.settings.group_size)

        def check(batch: RolloutBatch, tasks: list[Task]) -> None:
            check_failures(
                batch, max_fraction=self.max_failed_fraction, context=f"step {step}", tasks=tasks
            )

        async def admit(index: int) -> None:
            if index:  # the first group was admitted before the batch took its tasks
                self.waited_s += await self.gate.acquire(step, index)

        first_round = functools.partial(self.runner.run, step=step, admit=admit)
        rounds = [first_round]

        async def run(tasks: list[Task]) -> RolloutBatch:
            call = rounds.pop() if rounds else functools.partial(self.runner.run, step=step)
            return await call(tasks)

        busy_before = self.sampler_busy()
        sampled = await sample_informative(
            run,
            batch_tasks,
            lambda k: [self.tasks[i] for i in self.data.take(k)],
            batch_size=self.batch_size,
            filter_groups=self.filter_groups,
            max_sample_batches=self.max_sample_batches,
            check=check,
            mask=self.runner.settings.mask,
        )
        busy_after = self.sampler_busy()
        batch = sampled.batch
        built = self.builder.build(batch.groups)
        distilled: dict[str, float] = {}
        if self.scoring is not None:
            built, distilled = await self.scoring.ascore(built)
        episodes = sampled.episodes
        ticket = Ticket(
            step=step,
            first=-1,
            count=0,
            groups=0,
            data=data,
            rollout=rollout_metrics(
                episodes=episodes,
                infra_failures=len(batch.infra_failures),
                excluded=[failure.termination for failure in batch.infra_failures],
                retries=batch.retries,
                report=built.report.metrics(),
                rollout_s=batch.wall_s,
                sampler_busy_s=(
                    busy_after - busy_before
                    if busy_before is not None and busy_after is not None
                    else None
                ),
            )
            | sampled.metrics()
            | distilled
            | dict(self.serving_metrics()),
            episodes=[episode_record(step, e, self.builder.shaping) for e in episodes],
        )
        return ticket, group_versions(built.samples)

    async def _store(self, ticket: Ticket, samples: list[Sample]) -> Ticket:
        """Append ``samples`` to the buffer; ``ticket`` saying where they are."""
        stored = await asyncio.to_thread(self.buffer.append, samples) if samples else []
        return dataclasses.replace(
            ticket,
            first=stored[0].sequence if stored else -1,
            count=len(stored),
            groups=len({s.group_id for s in stored}),
        )
