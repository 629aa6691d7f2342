"""``rllm-core run PLAN --role sampler|trainer``: the async pipeline split over two processes.

The two roles share nothing but the plan's ``[object_store]`` (:mod:`rllm_core.training.shared`):

- **sampler** (:class:`SamplerRole`): rolls out batch after batch into the shared sample
  buffer, each as the one-process async run would (same data order, datums, versions), and
  records a ticket per batch. Batch ``N`` starts once the trainer has trained step ``N - 1 -
  lead`` (``lead = max_policy_age // (mini_batches * epochs)``), so the sampler waits at a
  backlog cap of ``lead + 1`` batches. Whenever the trainer reports a new weight version it
  loads the newest release (checking its digest) before letting the next batch start, and
  samples are tagged with the version that produced them. With a ``[sampler]`` (model servers)
  it exports each release it loads to them (:mod:`rllm_core.rollout.policy_sync`) before the
  next batch starts. It ends once ``[run].steps`` batches are in the buffer.
- **trainer** (:class:`TrainerRole`): runs trainer incarnations under the scheduler
  (:mod:`rllm_core.training.scheduler`, ``[scheduler]``). An incarnation restores the newest
  cut (weights, optimizer, counters, random generators, the buffer watermark), trains step
  after step on the batches in order (dropping groups older than ``max_policy_age``),
  publishes its progress after each step and a release of each new weight version, cuts
  every ``[run].save_every`` steps (trigger ``scheduled``), and on a stop drains at a step
  boundary and cuts with the stop's trigger (``scheduled`` when the scheduler idles it,
  ``manual`` on SIGINT, ``preempt`` on SIGTERM, ``final`` after the last step). The buffer
  is restored to the cut's watermark on each start: a batch trained after the last cut by an
  incarnation that then crashed is trained again (its weights were lost with it), none
  before the cut is. It rolls out nothing, so a ``[sampler]`` is left to the sampler role.

Each role writes its own run folder: the sampler its traces and ``queue.jsonl``, the trainer
``metrics.jsonl``, ``episodes.jsonl``, plots and ``summary.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from rllm_core.errors import CutError, SchedulerGaveUp
from rllm_core.training.cuts import (
    latest_cut,
    load_release,
    publish_release,
    restore_cut,
    write_cut,
)
from rllm_core.training.folder import write_json
from rllm_core.training.loop import RunResult, TrainingLoop
from rllm_core.training.pipeline import Ticket
from rllm_core.training.scheduler import Controller, SchedulerSettings
from rllm_core.training.shared import SharedRun
from rllm_core.training.signals import StopSignals
from rllm_core.training.state import DataOrder, LoopState, capture_rngs, restore_rngs, seed_rngs

__all__ = ["ROLES", "SamplerRole", "TrainerRole"]

ROLES = ("both", "sampler", "trainer")

_NO_STATE = LoopState(step=0, data=DataOrder(size=1, seed=0))
"""What a trainer that never started reports."""

KEEP = 3
"""Cuts and releases kept in the store besides the newest."""


def _require_shared_buffer(components: Any) -> None:
    if components.sample_buffer is None:
        raise ValueError(
            "a split run's roles meet in the sample buffer of its [object_store]; the run"
            " built none (prepare the plan with rllm_core.training.components.prepare_plan)"
        )


class SamplerRole(TrainingLoop):
    """The sampler side of a split run; see the module docstring."""

    def __init__(self, *, shared: SharedRun, **kwargs: Any) -> None:
        _require_shared_buffer(kwargs["components"])
        super().__init__(**kwargs)
        self.shared = shared
        self._loaded_version = 0
        self._workdir = Path(tempfile.mkdtemp(prefix="releases-", dir=self.folder.path))

    def _initial_state(self) -> LoopState:
        self.tasks = list(self.c.tasks.tasks("train"))
        seed_rngs(self.plan.run.seed)
        last = self.shared.last_step()
        ticket = self.shared.ticket(last) if last else None
        if ticket is not None:
            data = DataOrder.from_dict(ticket.data)
            self.display.info(f"run {self.shared.name!r}: batches 1..{last} are produced")
        else:
            data = DataOrder(size=len(self.tasks), seed=self.plan.run.seed)
        return LoopState(step=last, data=data)

    def _on_ticket(self, ticket: Ticket) -> None:
        self.shared.put_ticket(ticket)
        super()._on_ticket(ticket)
        self.display.info(f"batch {ticket.step} queued: {ticket.groups} groups")

    async def _follow_trainer(self) -> int:
        """Load the newest release when the trainer moved on; returns its trained step."""
        step, version = await asyncio.to_thread(self.shared.progress)
        if version != self._loaded_version:
            loaded = await asyncio.to_thread(
                load_release, self.shared.store, self.shared.prefix, self.c.trainer, self._workdir
            )
            self._loaded_version = loaded
            policy = self._policy_sync()
            if policy is not None:
                await policy()
            self.display.info(f"loaded policy version {loaded} (trainer at step {step})")
        return step

    async def _watch(self) -> None:
        while True:
            step = await self._follow_trainer()
            assert self._gate is not None
            self._gate.trained(step)
            await asyncio.sleep(self.plan.scheduler.poll_s)

    async def run(self) -> RunResult:
        rollouts = contextlib.AsyncExitStack()
        try:
            state = self._initial_state()
            runner, builder = await self._start(rollouts)
            policy = self._policy_sync()
            if policy is not None:
                await policy()
            trained = await self._follow_trainer()
        except BaseException:
            await rollouts.aclose()
            self.observers.close_loggers()
            raise
        started = time.monotonic()
        status, exit_code = "finished", 0
        watcher: asyncio.Task[None] | None = None
        try:
            with StopSignals(self._on_stop, self._on_force) as signals:
                if state.step < self.plan.run.steps:
                    self._start_producer(state, runner, builder, trained=trained)
                    watcher = asyncio.ensure_future(self._watch())
                    assert self._producer_task is not None
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait(
                            {self._producer_task, watcher}, return_when=asyncio.FIRST_COMPLETED
                        )
                    if watcher.done() and not watcher.cancelled():
                        # A release that cannot be loaded: the gate would never open again.
                        raise watcher.exception() or RuntimeError("the release watcher ended")
                if signals.received is not None:
                    status, exit_code = "interrupted", signals.exit_code
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            await self._stop_producer()
            await rollouts.aclose()
            await asyncio.to_thread(self.buffer.close)
        failure = self._queue.failure()
        if failure is not None:
            raise failure
        summary = {
            "status": status,
            "role": "sampler",
            "run_dir": str(self.folder.path),
            "wall_s": time.monotonic() - started,
            "last_batch": self.shared.last_step(),
            "weight_version": self._loaded_version,
        }
        write_json(self.folder.summary, summary)
        self.display.info(f"sampler {status}: batches up to {summary['last_batch']} produced")
        self.observers.close_loggers()
        return RunResult(
            status=status, exit_code=exit_code, step=summary["last_batch"], summary=summary
        )


class TrainerRole(TrainingLoop):
    """The trainer side of a split run, one incarnation at a time; see the module docstring.

    Implements the scheduler's trainer lifecycle (``start``, ``train_round``, ``stop``).
    """

    interrupts_training = False  # a round ends whole: its release and progress follow it

    def __init__(self, *, shared: SharedRun, **kwargs: Any) -> None:
        _require_shared_buffer(kwargs["components"])
        super().__init__(**kwargs)
        self.shared = shared
        self.state: LoopState | None = None
        self._incarnation = 0
        self._ticket: Ticket | None = None
        self._trainer_open = True
        self._workdir = Path(tempfile.mkdtemp(prefix="cuts-", dir=self.folder.path))
        self._cut_step = -1
        self._published: int | None = None
        self._running = False
        self._signals: StopSignals | None = None
        self._controller: Controller | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self, incarnation: int) -> None:
        """Build the trainer when the last incarnation released it, restore the newest cut
        and the buffer's watermark."""
        self._incarnation = incarnation
        self._cut_step = -1
        self._published = None
        if not self._trainer_open:
            component = self.resolved.get("[trainer]")
            assert component is not None
            self.c.trainer = await asyncio.to_thread(component.build)
            self.c.built.append(self.c.trainer)  # closed with the other components
            self._trainer_open = True
        self.tasks = list(self.c.tasks.tasks("train"))
        ref = await asyncio.to_thread(latest_cut, self.shared.store, self.shared.prefix)
        if ref is None:
            seed_rngs(self.plan.run.seed)
            state = LoopState(step=0, data=DataOrder(size=len(self.tasks), seed=self.plan.run.seed))
        else:
            state, ref = await asyncio.to_thread(
                restore_cut, self.shared.store, self.shared.prefix, self.c.trainer, self._workdir
            )
            restore_rngs(state.rngs)
            self.display.info(
                f"incarnation {incarnation}: restored cut {ref.name} (step {state.step})"
            )
        await asyncio.to_thread(self.buffer.restore, state.buffer_watermark)
        self.folder.truncate_after(state.step)
        self.state = state
        self._step_ended = time.monotonic()
        self._running = True

    async def train_round(self) -> bool:
        """Train the next step when its batch is in the buffer; False when it is not."""
        state = self.state
        assert state is not None
        if state.step >= self.plan.run.steps:
            return False
        ticket = await asyncio.to_thread(self.shared.ticket, state.step + 1)
        if ticket is None:
            return False
        self._ticket = ticket
        self._running = False  # until the step is through: a failure ends the incarnation
        await self._async_step(state, None, None)  # type: ignore[arg-type]
        version = self.c.trainer.weight_version
        if version != self._published:
            # A step that changed no weights (no datum, or every optimizer step skipped)
            # leaves this incarnation's release of the version as it is.
            await asyncio.to_thread(
                functools.partial(
                    publish_release,
                    self.shared.store,
                    self.shared.prefix,
                    self.c.trainer,
                    self._workdir,
                    incarnation=self._incarnation,
                    keep=KEEP,
                )
            )
            self._published = version
        await asyncio.to_thread(self.shared.put_progress, state.step, version)
        every = self.plan.run.save_every
        if every and state.step % every == 0 and state.step < self.plan.run.steps:
            await self._cut("scheduled")
        self._running = True
        return True

    async def stop(self, trigger: str) -> None:
        """Cut with ``trigger`` (the step in flight has finished; a step this incarnation cut
        already keeps that cut) and release the trainer."""
        self._running = False
        if self.state is not None and self.state.step not in (0, self._cut_step):
            await self._cut(trigger)
        if trigger != "final":
            await asyncio.to_thread(self.c.trainer.close)
            self._trainer_open = False

    async def _cut(self, trigger: str) -> None:
        state = self.state
        assert state is not None
        state.buffer_watermark = self.buffer.committed()
        state.rngs = capture_rngs()
        ref = await asyncio.to_thread(
            functools.partial(
                write_cut,
                self.shared.store,
                self.shared.prefix,
                self.c.trainer,
                state,
                trigger=trigger,
                incarnation=self._incarnation,
                workdir=self._workdir,
                keep=KEEP,
            )
        )
        self._cut_step = state.step
        self.observers.event(
            "checkpoint", {"step": state.step, "cut": str(ref), "trigger": trigger}
        )
        self.display.info(f"cut {ref.name} ({trigger})")

    # ------------------------------------------------------------------ the loop's hooks

    async def _next_ticket(self) -> Ticket | None:
        ticket, self._ticket = self._ticket, None
        return ticket

    def _on_stop(self) -> None:
        self._stop = True
        self.display.warn("stopping: the trainer cuts after the step in flight")
        received = self._signals.received if self._signals is not None else None
        if self._controller is not None:
            self._controller.request_stop("preempt" if received == signal.SIGTERM else "manual")

    # ------------------------------------------------------------------ run

    async def run(self) -> RunResult:
        started = time.monotonic()
        settings = SchedulerSettings.from_plan(self.plan)
        self._controller = Controller(
            lifecycle=self,
            settings=settings,
            store=self.shared.store,
            prefix=self.shared.key("scheduler"),
            backlog=self._backlog,
            data_ended=self._data_ended,
            on_decision=lambda decision: self.display.info(f"scheduler: {decision}"),
        )
        self.observers.run_start(self._run_info())
        status, exit_code, failure = "finished", 0, None
        try:
            with StopSignals(self._on_stop, self._on_force) as signals:
                self._signals = signals
                await self._controller.run()
                if signals.received is not None:
                    status, exit_code = "interrupted", signals.exit_code
        except SchedulerGaveUp as exc:
            failure = exc
            status, exit_code = "failed", exc.exit_code
        except BaseException as exc:
            self._crashed(
                exc, self.state or LoopState(step=0, data=DataOrder(size=1, seed=0)), started
            )
            raise
        finally:
            if self._trainer_executor is not None:
                self._trainer_executor.shutdown(wait=True)
                self._trainer_executor = None
            await asyncio.to_thread(self.buffer.close)
        state = self.state or _NO_STATE
        summary = self._summary(status, state, started) | {"role": "trainer"}
        if failure is not None:
            summary["reason"] = str(failure)
        self._write_summary(summary)
        return self._ended(status, exit_code, state.step, summary, failure)

    def _backlog(self) -> int:
        """Groups waiting after the running incarnation's step or, with none running, after
        the newest cut (what a failed one trained past it is trained again)."""
        if self.state is not None and self._running:
            step = self.state.step
        else:
            try:
                ref = latest_cut(self.shared.store, self.shared.prefix)
            except CutError:
                ref = None  # the start it leads to fails with this error, and counts it
            step = ref.step if ref is not None else 0
        return self.shared.waiting_groups(step, self.plan.algorithm.batch_size)

    def _data_ended(self) -> bool:
        return self.shared.ticket(self.plan.run.steps) is not None
