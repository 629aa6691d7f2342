"""The training loop of ``rllm-core run``: rollouts -> datums -> one optimizer step, repeated.

Each step takes ``batch_size`` train tasks in the seeded data order, runs ``group_size``
rollouts of each through the in-process gateway, builds datums (advantages, prefix merging),
updates the policy with the plan's objective (:mod:`rllm_core.training.update`: ``epochs``
passes of ``mini_batches`` optimizer steps, one by default), then writes the step's metrics
line, episode records and plots; checkpoints follow ``save_every`` and the end.
A step without datums (every group zero-variance and dropped, or no scored episode) trains
nothing, says why and still counts as a step. So does one whose optimizer steps the trainer
skipped (it dropped every datum a service would have rejected; ``<name>/skipped_step`` in the
metrics): the weight version stays, and nothing is synced or published for it.

A trainer backend that chooses where the objective runs (:class:`~rllm_core.ports.LossRouting`)
is asked once, before the first update: the route's line goes to stderr, ``loss_path.json``
into the run folder and the route's record into ``summary.json`` (``loss_path``). A
``[trainer].loss_path = "native"`` the objective cannot take fails the run, naming the key.

A step whose excluded rollouts (infrastructure failures after their retries) exceed
``[rollout].max_failed_fraction`` of its rollouts is not trained: the run ends ``failed``
(exit code 1) with the reason in ``summary.json``, and the last completed step is
checkpointed as on a signal (the failed step never is).

Any other exception once the run has started (a component that crashes, a trainer that
raises) also ends it ``failed``: ``summary.json`` gets ``status = "failed"``, the ``error``
(``type`` and ``message``), the ``reason`` and ``last_step`` (the last finished step), no
checkpoint is written, and the exception propagates (``rllm-core run`` exits 1).

Loggers and lifecycle hooks (:class:`~rllm_core.training.observers.RunObservers`): after the
resume state is loaded and the gateway is up, ``rllm_run_start``; each step fires
``rllm_step_start``, and once its ``metrics.jsonl`` line is written, every logger's
``log_metrics`` then ``rllm_step_end``. Loggers also receive the events ``resume``,
``checkpoint``, ``failure`` and ``summary``. On every way out the loggers are closed, then
``rllm_run_end`` fires once with ``completed``, ``interrupted`` or ``failed`` (and the error).
A run that cannot start (:class:`ResumeError`, a gateway bind error) closes its loggers and
fires no hook.

The gateway binds ``[gateway].host`` and ``[gateway].port``; when it cannot,
:class:`~rllm_core.rollout.gateway_address.GatewayBindError` says which key to change
(:func:`~rllm_core.rollout.gateway_address.check_gateway_address` runs the same test before
anything is built).

On SIGINT/SIGTERM the rollout phase in flight is cancelled (the runner cleans up within its
``cancel_timeout_s``); a train phase in flight finishes and its step is recorded. The last
completed step is checkpointed and :attr:`RunResult.exit_code` is 130 or 143.

With a ``[sampler]`` section the rollouts sample from its model servers, kept on the policy
(:mod:`rllm_core.rollout.policy_sync`): the trainer's weights are exported to them before the
first rollout (a fresh or a resumed run, once the run has started) and after every optimizer
step, on the trainer thread, and the next rollout starts only once the servers serve them. A
sync that fails (the sampler gave up on a server) ends the run ``failed`` with the sampler's
error, as any other exception does.

With ``[run].pipeline = "async"`` the rollouts run ahead of the trainer
(:mod:`rllm_core.training.pipeline`) into the sample buffer (``[sample_buffer]``, or one in
memory): step ``N`` trains on rollout batch ``N`` once it is queued, dropping the groups older
than ``[algorithm].max_policy_age`` versions, and commits the buffer's watermark. A signal
drains at a step boundary: the rollouts in flight are cancelled, a train phase in flight
finishes, and the checkpoint records the buffer's watermark. Resuming keeps the queued
batches the buffer still holds after that watermark (a durable buffer; they are listed in
``queue.jsonl``) and rolls out the rest again from the checkpoint's data order (a memory
buffer loses them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rllm_core.algorithms import DatumBuilder
from rllm_core.algorithms.native_losses import LossRoute, NativeLossError
from rllm_core.algorithms.objective import Objective
from rllm_core.errors import TrainingInterrupted
from rllm_core.plan import ResolvedPlan
from rllm_core.plugins.manager import PluginManager, get_plugin_manager
from rllm_core.ports import SampleBuffer
from rllm_core.ports.training import BusyClock, Interruptible, LossRouting
from rllm_core.rollout import RolloutBatch, RolloutRunner, TooManyFailedRollouts, check_failures
from rllm_core.rollout.context import RolloutContext, open_rollouts, rollout_settings
from rllm_core.rollout.dynamic import sample_informative
from rllm_core.rollout.sessions import SessionKey
from rllm_core.storage.memory_buffer import MemorySampleBuffer
from rllm_core.training.checkpoints import latest_checkpoint, load_checkpoint, save_checkpoint
from rllm_core.training.components import Components
from rllm_core.training.folder import RunFolder, write_json
from rllm_core.training.metrics import episode_record, step_metrics, summarize, train_metrics
from rllm_core.training.observers import RunObservers
from rllm_core.training.pipeline import RolloutProducer, StepGate, Ticket, TicketQueue
from rllm_core.training.plots import write_plots
from rllm_core.training.signals import StopSignals
from rllm_core.training.state import DataOrder, LoopState, capture_rngs, restore_rngs, seed_rngs
from rllm_core.training.update import build_objective, update_policy
from rllm_core.types import Datum, RunInfo, RunStatus, Sample, Task

__all__ = ["FORCE_EXIT_S", "ResumeError", "RunResult", "TrainingLoop"]

FORCE_EXIT_S = 5.0
"""Seconds between a second SIGINT / SIGTERM and the end of the process, cleanup or not."""


class ResumeError(Exception):
    """The run cannot start or resume as asked; the message says why and what to do."""


@dataclass
class RunResult:
    """How a run ended: ``status`` is ``finished``, ``interrupted`` or ``failed`` (then
    ``reason`` is the message to show, also in ``summary["reason"]``)."""

    status: str
    exit_code: int
    step: int
    summary: dict[str, Any]
    reason: str | None = None


class TrainingLoop:
    """One run of a resolved plan with built components, writing into ``folder``.

    ``record_datums`` also writes ``datums.jsonl`` (every trained datum's token ids, masks and
    provenance), for checking what the trainer saw against the traces. ``plugins`` is the
    manager whose lifecycle hooks fire (the process-wide one by default).
    """

    def __init__(
        self,
        *,
        resolved: ResolvedPlan,
        components: Components,
        folder: RunFolder,
        display: Any,
        resume: bool = False,
        record_datums: bool = False,
        run_id: str | None = None,
        plugins: PluginManager | None = None,
    ) -> None:
        self.plan = resolved.plan
        self.resolved = resolved
        self._built_objective: Objective | None = None
        self._loss_route: LossRoute | None = None
        self._routed_trainer: Any = None
        self.plan_path = resolved.path
        self.c = components
        self.folder = folder
        self.display = display
        self.resume = resume
        self.record_datums = record_datums
        self.run_id = run_id or folder.path.name
        self._phase = "idle"
        self._rollout_task: asyncio.Task[Any] | None = None
        self._stop = False
        self._torn_step: int | None = None
        self._force_timer: threading.Timer | None = None
        self._signals: StopSignals | None = None
        self._ending: tuple[LoopState, float] | None = None
        self._trainer_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._rollouts: RolloutContext | None = None
        self._asynchronous = resolved.plan.run.pipeline == "async"
        self._kept: list[Ticket] = []
        self._producer: RolloutProducer | None = None
        self._producer_task: asyncio.Task[None] | None = None
        self._queue = TicketQueue()
        self._gate: StepGate | None = None
        self._wait_task: asyncio.Future[Ticket] | None = None
        self._step_ended = 0.0
        self.buffer: SampleBuffer
        if components.sample_buffer is not None:
            self.buffer = components.sample_buffer
        else:
            self.buffer = MemorySampleBuffer()
        self.observers = RunObservers(
            loggers=components.loggers,
            plugins=plugins if plugins is not None else get_plugin_manager(),
            warn=display.warn,
        )

    # ------------------------------------------------------------------ state

    def _initial_state(self) -> LoopState:
        tasks = self.c.tasks.tasks("train")
        self.tasks = list(tasks)
        seed_rngs(self.plan.run.seed)
        if not self.resume:
            if self.plan.algorithm.batch_size > len(self.tasks):
                raise ResumeError(
                    f"batch_size {self.plan.algorithm.batch_size} is larger than the"
                    f" {len(self.tasks)} train tasks; lower [algorithm].batch_size or add tasks"
                )
            return LoopState(step=0, data=DataOrder(size=len(self.tasks), seed=self.plan.run.seed))
        checkpoint = latest_checkpoint(self.folder.checkpoints)
        if checkpoint is None:
            raise ResumeError(
                f"{self.folder.path} has no complete checkpoint to resume from; start a new run"
                " (without --resume)"
            )
        state = load_checkpoint(checkpoint, self.c.trainer)
        if state.data.size != len(self.tasks):
            raise ResumeError(
                f"the train split has {len(self.tasks)} tasks but the run was started with"
                f" {state.data.size}; resume with the same [tasks] as the run"
            )
        restore_rngs(state.rngs)
        self.folder.truncate_after(state.step)
        if self._asynchronous:
            self._kept = self._queued_batches(state)
            self.folder.rewrite(self.folder.queue, [t.to_dict() for t in self._kept])
        self._forget_sessions_after(state.step, keep={t.step for t in self._kept})
        self.display.info(f"resumed from {checkpoint} (step {state.step})")
        self.observers.event("resume", {"step": state.step, "checkpoint": str(checkpoint)})
        return state

    def _forget_sessions_after(self, step: int, keep: Collection[int] = ()) -> None:
        """Delete traces of steps after ``step`` but those in ``keep`` (the interrupted step
        reruns with the same session ids)."""
        store = self.c.trace_store
        for session in store.sessions():
            key = SessionKey.parse(session, run=self.run_id)
            if key is not None and key.step > step and key.step not in keep:
                store.delete_session(session)

    def _queued_batches(self, state: LoopState) -> list[Ticket]:
        """The rollout batches after ``state.step`` that the sample buffer still holds, in
        order: none unless the buffer is where the checkpoint left it (a memory buffer starts
        empty; a durable one may have been consumed further by steps the checkpoint missed)."""
        if self.buffer.committed() != state.buffer_watermark:
            return []
        end = state.buffer_watermark + self.buffer.pending()
        latest: dict[int, Ticket] = {}
        for row in RunFolder.read_jsonl(self.folder.queue):
            ticket = Ticket.from_dict(row)
            latest[ticket.step] = ticket
        kept: list[Ticket] = []
        position = state.buffer_watermark
        for step in range(state.step + 1, self.plan.run.steps + 1):
            ticket = latest.get(step)
            if ticket is None or (ticket.count and ticket.first != position + 1):
                break
            if ticket.count and ticket.first + ticket.count - 1 > end:
                break
            kept.append(ticket)
            position += ticket.count
        return kept

    # ------------------------------------------------------------------ signals

    interrupts_training: ClassVar[bool] = True
    """Whether a signal stops a step's training midway (:class:`Interruptible` trainers);
    a role whose steps must end whole says no."""

    def _on_stop(self) -> None:
        self._stop = True
        self.display.warn("stopping: cancelling the step in flight, then cleaning up")
        if self._phase == "rollout" and self._rollout_task is not None:
            self._rollout_task.cancel()
        if self._phase == "train":
            self._interrupt_training()
        if self._producer_task is not None:
            self._producer_task.cancel()
        if self._wait_task is not None:
            self._wait_task.cancel()

    def _on_force(self) -> None:
        """A second signal: what the first asked for, then the process ends within
        ``FORCE_EXIT_S`` however far the cleanup got, with ``summary.json`` written."""
        self.display.warn(f"second signal: exiting within {FORCE_EXIT_S:.0f} s")
        self._stop = True
        if self._rollout_task is not None:
            self._rollout_task.cancel()
        if self._producer_task is not None:
            self._producer_task.cancel()
        self._interrupt_training()
        if self._force_timer is None:
            self._force_timer = threading.Timer(FORCE_EXIT_S, self._force_exit)
            self._force_timer.daemon = True
            self._force_timer.start()

    def _interrupt_training(self) -> None:
        trainer = self.c.trainer
        if self.interrupts_training and isinstance(trainer, Interruptible):
            trainer.interrupt()

    def _force_exit(self) -> None:
        """The watchdog a second signal starts: the summary of what finished, then exit."""
        code = self._signals.exit_code if self._signals is not None else 130
        if self._ending is not None:
            state, started = self._ending
            with contextlib.suppress(Exception):
                summary = self._summary("interrupted", state, started)
                summary["reason"] = f"exited {FORCE_EXIT_S:.0f} s after a second signal"
                write_json(self.folder.summary, summary)
        print(
            f"rllm-core: exited {FORCE_EXIT_S:.0f} s after a second signal; the cleanup had"
            " not finished",
            file=sys.stderr,
            flush=True,
        )
        os._exit(code)

    # ------------------------------------------------------------------ run

    async def run(self) -> RunResult:
        """Run the steps left; see the module docstring."""
        rollouts = contextlib.AsyncExitStack()
        try:
            state = self._initial_state()
            runner, builder = await self._start(rollouts)
        except BaseException:
            await rollouts.aclose()
            self.observers.close_loggers()
            raise
        saved_step = state.step if self.resume else -1
        status, exit_code = "finished", 0
        failure: TooManyFailedRollouts | None = None
        started = time.monotonic()
        self._ending = (state, started)
        self.observers.run_start(self._run_info())
        try:
            # The handlers stay through the cleanup, so that a second signal there still
            # ends the run with its summary.
            with StopSignals(self._on_stop, self._on_force) as signals:
                self._signals = signals
                try:
                    await self._route_loss()
                    policy = self._policy_sync()
                    if policy is not None:
                        await policy()
                    if self._asynchronous and not self._stop:
                        self._start_producer(state, runner, builder)
                    take_step = self._async_step if self._asynchronous else self._step
                    while state.step < self.plan.run.steps and not self._stop:
                        try:
                            done = await take_step(state, runner, builder)
                        except TooManyFailedRollouts as exc:
                            failure = exc
                            break
                        if not done:
                            break
                        every = self.plan.run.save_every
                        if every and state.step % every == 0:
                            self._checkpoint(state)
                            saved_step = state.step
                finally:
                    await self._stop_producer()
                    await rollouts.aclose()
                    if self._trainer_executor is not None:
                        self._trainer_executor.shutdown(wait=True)
                        self._trainer_executor = None
                if signals.received is not None:
                    status, exit_code = "interrupted", signals.exit_code
                elif failure is not None:
                    status, exit_code = "failed", 1
                if state.step > 0 and saved_step != state.step:
                    self._final_checkpoint(state)
                summary = self._summary(status, state, started)
                if failure is not None:
                    summary["reason"] = str(failure)
                    summary["failure"] = failure.to_dict()
                    self.observers.event(
                        "failure",
                        {
                            "step": state.step + 1,
                            "reason": str(failure),
                            "failure": failure.to_dict(),
                        },
                    )
                self._groups_line(summary)
                self._write_summary(summary)
        except BaseException as exc:
            self._crashed(exc, state, started)
            raise
        finally:
            if self._force_timer is not None:
                self._force_timer.cancel()
        return self._ended(status, exit_code, state.step, summary, failure)

    def _final_checkpoint(self, state: LoopState) -> None:
        """The checkpoint of the last finished step, unless an interrupted step had moved the
        weights past it already."""
        if self._torn_step is not None:
            self.display.warn(
                f"step {self._torn_step} was interrupted after it had changed the weights: no"
                f" checkpoint of step {state.step} written now; resume starts from the last"
                " saved one"
            )
            return
        path = self._checkpoint(state)
        self.display.info(f"checkpoint: {path}")

    def _write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.folder.summary, summary)
        self.observers.event("summary", summary)
        self.display.finish(summary)

    def _ended(
        self,
        status: str,
        exit_code: int,
        step: int,
        summary: dict[str, Any],
        failure: BaseException | None,
    ) -> RunResult:
        """Fire ``rllm_run_end`` for a run that ended with ``status``; its result."""
        run_status = {"finished": RunStatus.COMPLETED, "interrupted": RunStatus.INTERRUPTED}
        self.observers.run_end(run_status.get(status, RunStatus.FAILED), failure)
        return RunResult(
            status=status,
            exit_code=exit_code,
            step=step,
            summary=summary,
            reason=str(failure) if failure is not None else None,
        )

    async def _start(self, stack: contextlib.AsyncExitStack) -> tuple[RolloutRunner, DatumBuilder]:
        """Open the rollout context on ``stack``; build the datum builder."""
        algorithm = self.plan.algorithm
        self._rollouts = await stack.enter_async_context(
            open_rollouts(
                self.plan,
                self.c,
                settings=rollout_settings(self.plan, group_size=algorithm.group_size),
                run_id=self.run_id,
                on_event=self.display.on_event,
                plan_path=self.plan_path,
                trainer_call=self._on_trainer_thread,
                sync=False,
            )
        )
        drop = algorithm.drop_zero_variance_groups or algorithm.filter_groups != "none"
        builder = DatumBuilder(self.c.advantage, drop_zero_variance_groups=drop)
        return self._rollouts.runner, builder

    def _run_info(self) -> RunInfo:
        return RunInfo(
            run_id=self.run_id,
            name=self.plan.run.name,
            output_dir=str(self.folder.path),
            plan=self.plan.model_dump(mode="json", exclude_none=True),
            started_at=time.time(),
        )

    def _checkpoint(self, state: LoopState) -> Path:
        path = save_checkpoint(self.folder.checkpoints, self.c.trainer, state)
        self.observers.event("checkpoint", {"step": state.step, "path": str(path)})
        return path

    def _summary(self, status: str, state: LoopState, started: float) -> dict[str, Any]:
        rows = RunFolder.read_jsonl(self.folder.metrics)
        summary = summarize(rows) | {
            "status": status,
            "run_dir": str(self.folder.path),
            "wall_s": time.monotonic() - started,
            "last_step": state.step,
            "weight_version": getattr(self.c.trainer, "weight_version", None),
        }
        if self._loss_route is not None:
            summary["loss_path"] = self._loss_route.record()
        return summary

    def _crashed(self, exc: BaseException, state: LoopState, started: float) -> None:
        """After an exception that ends the run: ``summary.json`` (status ``failed``, the
        error, the last finished step), a ``failure`` and a ``summary`` event, the loggers
        closed and ``rllm_run_end(FAILED)``; the caller re-raises."""
        error = {"type": type(exc).__name__, "message": str(exc)}
        reason = f"{error['type']}: {error['message']}" if error["message"] else error["type"]
        self.observers.event("failure", {"step": state.step + 1, "reason": reason, "error": error})
        try:
            summary = self._summary("failed", state, started) | {"reason": reason, "error": error}
            write_json(self.folder.summary, summary)
        except Exception as problem:
            self.display.warn(f"could not write {self.folder.summary}: {problem}")
        else:
            self.observers.event("summary", summary)
        self.observers.run_end(RunStatus.FAILED, exc)

    async def _step(self, state: LoopState, runner: RolloutRunner, builder: DatumBuilder) -> bool:
        """Run step ``state.step + 1``; False when a signal cancelled its rollouts. Raises
        :class:`TooManyFailedRollouts` (before training) when too many rollouts were excluded."""
        step = state.step + 1
        self.observers.step_start(step)
        algorithm = self.plan.algorithm
        data = DataOrder.from_dict(state.data.to_dict())
        batch_tasks = [self.tasks[i] for i in data.take(algorithm.batch_size)]
        self.display.step_started(step, len(batch_tasks) * algorithm.group_size)
        step_start = time.monotonic()
        self._phase = "rollout"
        busy_before = self._sampler_busy()
        self._rollout_task = asyncio.ensure_future(
            sample_informative(
                functools.partial(runner.run, step=step),
                batch_tasks,
                lambda k: [self.tasks[i] for i in data.take(k)],
                batch_size=algorithm.batch_size,
                filter_groups=algorithm.filter_groups,
                max_sample_batches=algorithm.max_sample_batches,
                check=functools.partial(self._check_failures, step),
            )
        )
        try:
            sampled = await self._rollout_task
        except asyncio.CancelledError:
            if not self._stop:
                raise
            return False
        finally:
            self._phase = "train"
            self._rollout_task = None
        rollout_s = time.monotonic() - step_start
        busy_after = self._sampler_busy()
        sampler_busy_s = (
            busy_after - busy_before if busy_before is not None and busy_after is not None else None
        )
        batch = sampled.batch
        built = builder.build(batch.groups)
        datums = built.datums
        try:
            train, train_s = await self._train(
                datums,
                step=step,
                why_none=f"step {step}: no datum to train on ({built.report.episodes} scored"
                f" episodes, {built.report.dropped_groups} zero-variance groups dropped)",
            )
        except TrainingInterrupted:
            self.display.warn(f"step {step}: training interrupted; the step is not recorded")
            return False
        episodes = sampled.episodes
        line = step_metrics(
            step=step,
            episodes=episodes,
            infra_failures=len(batch.infra_failures),
            retries=batch.retries,
            report=built.report.metrics(),
            datums=datums,
            train=train,
            rollout_s=rollout_s,
            train_s=train_s,
            step_s=time.monotonic() - step_start,
            weight_version=self.c.trainer.weight_version,
            sampler_busy_s=sampler_busy_s,
        )
        line |= sampled.metrics()
        self._record(line, [episode_record(step, e) for e in episodes], datums)
        state.step = step
        state.data = data
        state.rngs = capture_rngs()
        self._show(line)
        return True

    def _check_failures(self, step: int, batch: RolloutBatch, tasks: list[Task]) -> None:
        check_failures(
            batch,
            max_fraction=self.plan.rollout.max_failed_fraction,
            context=f"step {step}",
            tasks=tasks,
        )

    async def _train(
        self, datums: Sequence[Datum], *, step: int, why_none: str
    ) -> tuple[dict[str, float], float]:
        """Update the policy on ``datums`` for ``step`` (the update's metrics and seconds);
        without datums, warn ``why_none`` and leave the optimizer alone. Raises
        :class:`TrainingInterrupted` when a signal stopped the update midway."""
        algorithm = self.plan.algorithm
        began = time.monotonic()
        if not datums:
            self.display.warn(f"{why_none}; the optimizer did not step")
            return {}, 0.0
        await self._route_loss()
        version = self.c.trainer.weight_version
        try:
            train = await update_policy(
                self.c.trainer,
                datums,
                self._objective(),
                epochs=algorithm.epochs,
                mini_batches=algorithm.mini_batches,
                call=self._on_trainer_thread,
                after_step=self._policy_sync(),
            )
        except TrainingInterrupted:
            if not self._stop:
                raise
            if self.c.trainer.weight_version != version:
                self._torn_step = step
            raise
        return train, time.monotonic() - began

    def _record(
        self, line: dict[str, Any], episodes: list[dict[str, Any]], datums: Sequence[Datum]
    ) -> None:
        """Write a finished step's metrics line (then tell the loggers and hooks), its episode
        records and, when asked, its datums."""
        step = line["step"]
        self._warn_about(line)
        self.folder.append(self.folder.metrics, line)
        self.observers.step_end(step, line)
        self.folder.append(self.folder.episodes, episodes)
        if self.record_datums:
            self.folder.append(self.folder.path / "datums.jsonl", _datum_rows(step, datums))

    def _show(self, line: dict[str, Any]) -> None:
        problem = write_plots(RunFolder.read_jsonl(self.folder.metrics), self.folder.path)
        if problem is not None and line["step"] == 1:
            self.display.warn(problem)
        self.display.step_finished(line)

    # ------------------------------------------------------------------ async pipeline

    def _start_producer(
        self,
        state: LoopState,
        runner: RolloutRunner,
        builder: DatumBuilder,
        *,
        trained: int | None = None,
    ) -> None:
        """Queue the batches kept from before a resume and start rolling out the next ones
        (after ``state.step``, gated by ``trained`` steps, ``state.step`` by default)."""
        algorithm = self.plan.algorithm
        data = state.data
        for ticket in self._kept:
            self._queue.put(ticket)
            data = DataOrder.from_dict(ticket.data)
        self._gate = StepGate(
            trained=state.step if trained is None else trained,
            lead=algorithm.max_policy_age // (algorithm.mini_batches * algorithm.epochs),
        )
        self._producer = RolloutProducer(
            runner=runner,
            builder=builder,
            tasks=self.tasks,
            data=DataOrder.from_dict(data.to_dict()),
            next_step=state.step + len(self._kept) + 1,
            last_step=self.plan.run.steps,
            batch_size=algorithm.batch_size,
            max_failed_fraction=self.plan.rollout.max_failed_fraction,
            buffer=self.buffer,
            gate=self._gate,
            queue=self._queue,
            on_ticket=self._on_ticket,
            on_start=self.display.step_started,
            filter_groups=algorithm.filter_groups,
            max_sample_batches=algorithm.max_sample_batches,
        )
        self._producer_task = asyncio.ensure_future(self._producer.run())
        self._step_ended = time.monotonic()

    def _on_ticket(self, ticket: Ticket) -> None:
        self.folder.append(self.folder.queue, ticket.to_dict())

    async def _stop_producer(self) -> None:
        task, self._producer_task = self._producer_task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _next_ticket(self) -> Ticket | None:
        """The next queued batch, or None when a signal stopped the wait."""
        self._phase = "wait"
        self._wait_task = asyncio.ensure_future(self._queue.get())
        try:
            return await self._wait_task
        except asyncio.CancelledError:
            if not self._stop:
                raise
            return None
        finally:
            self._wait_task = None
            self._phase = "train"

    async def _async_step(
        self, state: LoopState, runner: RolloutRunner, builder: DatumBuilder
    ) -> bool:
        """Train step ``state.step + 1`` on its queued rollout batch; False when a signal
        stopped the wait. Raises what stopped the producer at this step."""
        step = state.step + 1
        self.observers.step_start(step)
        algorithm = self.plan.algorithm
        waiting = time.monotonic()
        ticket = await self._next_ticket()
        if ticket is None:
            return False
        trainer_wait_s = time.monotonic() - waiting
        version = self.c.trainer.weight_version
        samples, watermark = await asyncio.to_thread(self._select, ticket)
        fresh = [s for s in samples if version - s.weight_version <= algorithm.max_policy_age]
        stale_groups = {s.group_id for s in samples} - {s.group_id for s in fresh}
        datums = [s.datum for s in fresh]
        ages = [version - s.weight_version for s in fresh]
        try:
            train, train_s = await self._train(
                datums,
                step=step,
                why_none=f"step {step}: no datum to train on ({ticket.rollout['episodes']:.0f}"
                f" scored episodes, {len(stale_groups)} groups older than max_policy_age"
                " dropped)",
            )
        except TrainingInterrupted:
            self.display.warn(f"step {step}: training interrupted; the step is not recorded")
            return False
        if watermark > self.buffer.committed():
            await asyncio.to_thread(self.buffer.commit, watermark)
        now = time.monotonic()
        line = (
            {"step": step}
            | ticket.rollout
            | train_metrics(
                datums=datums,
                train=train,
                train_s=train_s,
                step_s=now - self._step_ended,
                weight_version=self.c.trainer.weight_version,
            )
        )
        line |= {
            "async/policy_age_mean": sum(ages) / len(ages) if ages else 0.0,
            "async/policy_age_max": float(max(ages, default=0)),
            "async/dropped_stale": float(len(stale_groups)),
            "async/queue_groups": float(self.buffer.backlog().groups),
            "async/sampler_wait_s": self._producer.take_waited() if self._producer else 0.0,
            "async/trainer_wait_s": trainer_wait_s,
        }
        self._step_ended = now
        self._record(line, ticket.episodes, datums)
        state.step = step
        state.data = DataOrder.from_dict(ticket.data)
        state.buffer_watermark = self.buffer.committed()
        state.rngs = capture_rngs()
        if self._gate is not None:
            self._gate.trained(step)
        self._show(line)
        return True

    def _select(self, ticket: Ticket) -> tuple[list[Sample], int]:
        """The samples of ``ticket`` and the watermark to commit once trained. Samples before
        them (appended by a run that stopped before recording their batch) are skipped."""
        committed = self.buffer.committed()
        if not ticket.count:
            return [], committed
        if ticket.first > committed + 1:
            skipped = self.buffer.select(max_samples=ticket.first - committed - 1)
            self.buffer.commit(skipped.watermark)
        batch = self.buffer.select(max_samples=ticket.count)
        sequences = [s.sequence for s in batch.samples]
        if sequences != list(range(ticket.first, ticket.first + ticket.count)):
            raise RuntimeError(
                f"step {ticket.step}: the sample buffer returned sequences"
                f" {sequences[:1]}..{sequences[-1:]} where the batch was stored at"
                f" {ticket.first}..{ticket.first + ticket.count - 1}"
            )
        return list(batch.samples), batch.watermark

    async def _route_loss(self) -> None:
        """Ask a trainer that chooses where the objective runs (:class:`LossRouting`) for its
        route, once per trainer instance (the trainer role builds one per incarnation): print
        it to stderr, write ``loss_path.json`` and keep it for ``summary.json``. A route that
        ``loss_path = "native"`` forces and the objective cannot take fails the run."""
        trainer = self.c.trainer
        if self._routed_trainer is trainer or not isinstance(trainer, LossRouting):
            return
        objective = self._objective()
        try:
            route = await self._on_trainer_thread(functools.partial(trainer.loss_route, objective))
        except NativeLossError as exc:
            raise NativeLossError(
                f'{self.plan_path}: [trainer].loss_path: {exc}; set loss_path = "auto" or'
                ' "custom", or choose a loss the service runs natively (`rllm-core plan check`'
                " says which)"
            ) from exc
        self._routed_trainer = trainer
        self._loss_route = route
        route.write(self.folder.path)
        print(route.line(), file=sys.stderr, flush=True)

    def _objective(self) -> Objective:
        if self._built_objective is None:
            self._built_objective = build_objective(
                self.resolved, self.c.loss, list(self.c.aux_losses)
            )
        return self._built_objective

    async def _on_trainer_thread(self, call: Callable[[], Any]) -> Any:
        """Run ``call`` on the one thread that does every training computation.

        Each thread that runs parallel torch work keeps its own OpenMP workers, and GNU OpenMP
        shortens its spin-waits once they outnumber the cores, which slowed the quickstart's
        train steps by about a third; one thread for the trainer keeps their number down.
        """
        if self._trainer_executor is None:
            self._trainer_executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="rllm-trainer"
            )
        return await asyncio.get_running_loop().run_in_executor(self._trainer_executor, call)

    def _policy_sync(self) -> Callable[[], Awaitable[Any]] | None:
        """What moves the ``[sampler]`` to the trainer's new version after an optimizer step;
        None without one, or where this process rolls out nothing (the trainer role)."""
        policy = self._rollouts.policy if self._rollouts is not None else None
        return policy.sync if policy is not None else None

    def _sampler_busy(self) -> float | None:
        sampler = self._rollouts.sampler if self._rollouts is not None else None
        return sampler.busy_seconds if isinstance(sampler, BusyClock) else None

    def _warn_about(self, line: Mapping[str, Any]) -> None:
        step = line["step"]
        if line["infra_retries"] or line["infra_failures"]:
            self.display.warn(
                f"step {step}: {line['infra_retries']:.0f} infrastructure retries,"
                f" {line['infra_failures']:.0f} rollouts excluded"
            )
        if line["resets"]:
            self.display.warn(f"step {step}: {line['resets']:.0f} cumulative-session resets")

    def _groups_line(self, summary: Mapping[str, Any]) -> None:
        """One line at the end of the run on the groups that carried no signal (the per-step
        counts are the ``zero_variance_groups`` and ``groups/*`` metrics)."""
        flat, groups = summary["zero_variance_groups"], summary["groups"]
        if self.plan.algorithm.filter_groups != "none":
            sampled, filtered = summary["groups_sampled"], summary["groups_filtered"]
            self.display.info(
                f"dynamic sampling: {sampled:.0f} groups rolled out, {filtered:.0f} with equal"
                " rewards left out (groups/* in metrics.jsonl)"
            )
        elif flat:
            self.display.warn(
                f"{flat:.0f} of {groups:.0f} groups had equal rewards (no learning signal);"
                ' [algorithm].filter_groups = "zero-variance" rolls out more tasks in their place'
            )


def _datum_rows(step: int, datums: Any) -> list[dict[str, Any]]:
    return [
        {
            "step": step,
            "session_id": d.metadata.get("session_id"),
            "episode_id": d.metadata.get("episode_id"),
            "token_ids": list(d.token_ids),
            "action_mask": list(d.action_mask),
            "logprobs": list(d.logprobs),
        }
        for d in datums
    ]
