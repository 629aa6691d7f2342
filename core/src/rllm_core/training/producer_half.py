"""The producer half of the RL pipeline: tasks -> rollouts -> datums -> the sample buffer and a
ticket per batch.

The one-process loop and a split run's sampler role roll out through one
:class:`ProducerHalf`: :meth:`ProducerHalf.open` opens the rollout context (the gateway, the
runner, a ``[sampler]`` kept on the policy) and builds the datum builder;
:meth:`ProducerHalf.start` runs the async pipeline's
:class:`~rllm_core.training.pipeline.RolloutProducer` ahead of the trainer, gated by the steps
trained.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from rllm_core.algorithms import DatumBuilder
from rllm_core.algorithms.distill import TeacherScoring
from rllm_core.algorithms.shaping import RewardShaping
from rllm_core.plan import Plan
from rllm_core.ports import SampleBuffer
from rllm_core.ports.training import BusyClock, SyncCounters
from rllm_core.rollout import RolloutRunner
from rllm_core.rollout.context import RolloutContext, open_rollouts, rollout_settings
from rllm_core.run.parts import RunParts
from rllm_core.run.state import DataOrder, LoopState
from rllm_core.training.distill import teacher_scoring
from rllm_core.training.pipeline import (
    DispatchGate,
    RolloutProducer,
    RoundThrottle,
    Ticket,
    TicketQueue,
)
from rllm_core.types import Task

__all__ = ["ProducerHalf"]


class ProducerHalf:
    """Rolls out the plan's train tasks for a run ``run_id``; see the module docstring.

    ``trainer_call`` runs a call on the trainer's thread (weight exports to a ``[sampler]``).
    """

    def __init__(
        self,
        parts: RunParts,
        *,
        buffer: SampleBuffer,
        run_id: str,
        trainer_call: Callable[[Callable[[], Any]], Awaitable[Any]],
    ) -> None:
        self.parts = parts
        self.buffer = buffer
        self.run_id = run_id
        self.trainer_call = trainer_call
        self.queue = TicketQueue()
        self.gate: DispatchGate | None = None
        self.producer: RolloutProducer | None = None
        self.task: asyncio.Task[None] | None = None
        self.rollouts: RolloutContext | None = None
        self.scoring: TeacherScoring | None = None

    @property
    def plan(self) -> Plan:
        return self.parts.plan

    async def open(self, stack: contextlib.AsyncExitStack) -> tuple[RolloutRunner, DatumBuilder]:
        """Open the rollout context on ``stack``; build the datum builder."""
        algorithm = self.plan.algorithm
        self.rollouts = await stack.enter_async_context(
            open_rollouts(
                self.plan,
                self.parts.components,
                settings=rollout_settings(self.plan, group_size=algorithm.group_size),
                run_id=self.run_id,
                on_event=self.parts.display.on_event,
                plan_path=self.parts.resolved.path,
                trainer_call=self.trainer_call,
                sync=False,
            )
        )
        drop = algorithm.drop_zero_variance_groups or algorithm.filter_groups != "none"
        builder = DatumBuilder(
            self.parts.components.advantage,
            drop_zero_variance_groups=drop,
            shaping=RewardShaping.from_plan(self.plan),
            mask=self.rollouts.runner.settings.mask,
        )
        self.scoring = teacher_scoring(self.parts)
        return self.rollouts.runner, builder

    def policy_sync(self) -> Callable[[], Awaitable[Any]] | None:
        """What moves the ``[sampler]`` to the trainer's new version; None without one."""
        policy = self.rollouts.policy if self.rollouts is not None else None
        return policy.sync if policy is not None else None

    def sampler_busy(self) -> float | None:
        """The sampler's busy seconds so far, where it keeps count."""
        sampler = self.rollouts.sampler if self.rollouts is not None else None
        return sampler.busy_seconds if isinstance(sampler, BusyClock) else None

    def serving_metrics(self) -> dict[str, float]:
        """The gateway workers' calls since the last call (``gateway/calls/<i>``) and the
        sampler's weight-update counts, where it keeps them (:class:`SyncCounters`)."""
        if self.rollouts is None:
            return {}
        line = self.rollouts.calls()
        sampler = self.rollouts.sampler
        if isinstance(sampler, SyncCounters):
            line |= {key: float(value) for key, value in sampler.sync_metrics().items()}
        return line

    def start(
        self,
        state: LoopState,
        tasks: Sequence[Task],
        runner: RolloutRunner,
        builder: DatumBuilder,
        *,
        kept: Sequence[Ticket] = (),
        trained: int | None = None,
        on_ticket: Callable[[Ticket], None],
    ) -> None:
        """Queue the batches ``kept`` from before a resume and start rolling out the next
        ones (after ``state.step``, gated by ``trained`` steps, ``state.step`` by default).
        A group of batch ``r`` starts once step ``r - 1 - lead`` is trained and fewer than
        ``(1 + lead) * batch_size`` groups are in flight, ``lead = max_policy_age //
        (mini_batches * epochs)`` (:class:`DispatchGate`): with ``max_policy_age = 0`` (the
        sync pipeline) each batch is rolled out by the policy that then trains on it."""
        algorithm = self.plan.algorithm
        data = state.data
        for ticket in kept:
            self.queue.put(ticket)
            data = DataOrder.from_dict(ticket.data)
        lead = algorithm.max_policy_age // (algorithm.mini_batches * algorithm.epochs)
        next_step = state.step + len(kept) + 1
        self.gate = DispatchGate(
            trained=state.step if trained is None else trained,
            lead=lead,
            groups_per_step=algorithm.batch_size,
            first=next_step,
        )
        self.producer = RolloutProducer(
            runner=runner,
            builder=builder,
            tasks=list(tasks),
            data=DataOrder.from_dict(data.to_dict()),
            next_step=next_step,
            last_step=self.plan.run.steps,
            batch_size=algorithm.batch_size,
            max_failed_fraction=self.plan.rollout.max_failed_fraction,
            buffer=self.buffer,
            gate=self.gate,
            queue=self.queue,
            on_ticket=on_ticket,
            on_start=self.parts.display.step_started,
            filter_groups=algorithm.filter_groups,
            max_sample_batches=algorithm.max_sample_batches,
            sampler_busy=self.sampler_busy if lead == 0 else lambda: None,
            scoring=self.scoring,
            throttle=(
                RoundThrottle(self.plan.scheduler.min_round_s)
                if self.plan.scheduler.min_round_s > 0
                else None
            ),
            serving_metrics=self.serving_metrics,
        )
        self.task = asyncio.ensure_future(self.producer.run())

    def trained(self, step: int) -> None:
        """Step ``step`` is trained and saved: the batches it gates may start."""
        if self.gate is not None:
            self.gate.trained(step)

    def take_waited(self) -> float:
        """Seconds the producer waited at the gate since the last call."""
        return self.producer.take_waited() if self.producer is not None else 0.0

    def take_dispatch(self) -> dict[str, float]:
        """``async/running_rollouts`` and ``async/in_flight_groups``: the rollouts running and
        the groups in flight, each a mean over the time since the last call."""
        if self.producer is None or self.gate is None:
            return {}
        return {
            "async/running_rollouts": self.producer.runner.running.take_mean(),
            "async/in_flight_groups": self.gate.in_flight.take_mean(),
        }

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def stop(self) -> None:
        """Cancel the producer and wait for it to end."""
        task, self.task = self.task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def next_ticket(self) -> Ticket:
        return await self.queue.get()
