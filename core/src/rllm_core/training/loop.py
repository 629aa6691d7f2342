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

Loggers and lifecycle hooks (:class:`~rllm_core.run.observers.RunObservers`): after the
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

Both pipelines are one step (:meth:`TrainingLoop._step`) over the two halves: the producer
(:mod:`rllm_core.training.producer_half`) rolls batches out into the sample buffer
(``[sample_buffer]``, or one in memory) and the trainer
(:mod:`rllm_core.training.trainer_half`) trains step ``N`` on batch ``N`` once it is queued
and commits the buffer's watermark. The groups of batch ``N`` start once step ``N - 1 - lead``
is trained (and, without lead, saved), ``lead = max_policy_age // (mini_batches * epochs)``,
at most ``(1 + lead) * batch_size`` groups in flight: ``[run].pipeline = "sync"``
is a lead of 0 (each batch is rolled out by the policy that trains on it; the metrics line has
no ``async/*`` keys and ``queue.jsonl`` is not written). With ``[run].pipeline = "async"`` the
rollouts run ahead of the trainer (:mod:`rllm_core.training.pipeline`) and the trainer drops
the groups older than ``[algorithm].max_policy_age`` versions. A signal
drains at a step boundary: the rollouts in flight are cancelled, a train phase in flight
finishes, and the checkpoint records the buffer's watermark. Resuming keeps the queued
batches the buffer still holds after that watermark (a durable buffer; they are listed in
``queue.jsonl``) and rolls out the rest again from the checkpoint's data order (a memory
buffer loses them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Mapping
from typing import Any

from rllm_core.evaluation.during_run import RunEvaluator
from rllm_core.plan import ResolvedPlan
from rllm_core.plugins.manager import PluginManager, get_plugin_manager
from rllm_core.ports import SampleBuffer
from rllm_core.rollout import TooManyFailedRollouts
from rllm_core.rollout.sessions import SessionKey
from rllm_core.run.checkpoints import RunCheckpoints
from rllm_core.run.components import Components
from rllm_core.run.folder import RunFolder
from rllm_core.run.lifecycle import Lifecycle, ResumeError, RunResult, fresh_or_resumed
from rllm_core.run.observers import RunObservers
from rllm_core.run.parts import RunParts
from rllm_core.run.state import LoopState
from rllm_core.storage.memory_buffer import MemorySampleBuffer
from rllm_core.training.pipeline import Ticket
from rllm_core.training.producer_half import ProducerHalf
from rllm_core.training.trainer_half import TrainerHalf
from rllm_core.types import Task

__all__ = ["TrainingLoop"]


class TrainingLoop:
    """One run of a resolved plan with built components, writing into ``folder``: the
    producer half and the trainer half in one process, on the run lifecycle.

    ``record_datums`` also writes ``datums.jsonl`` (every trained datum's token ids, masks,
    logprobs, advantages and provenance), for checking what the trainer saw against the
    traces. ``plugins`` is the manager whose lifecycle hooks fire (the process-wide one by
    default).
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
        self.c = components
        self.folder = folder
        self.resume = resume
        self.run_id = run_id or folder.path.name
        self.tasks: list[Task] = []
        self._phase = "idle"
        self._wait_task: asyncio.Future[Ticket] | None = None
        self._stop = False
        self._asynchronous = resolved.plan.run.pipeline == "async"
        self._kept: list[Ticket] = []
        self.evaluator: RunEvaluator | None = None
        self.buffer: SampleBuffer = (
            components.sample_buffer
            if components.sample_buffer is not None
            else MemorySampleBuffer()
        )
        self.observers = RunObservers(
            loggers=components.loggers,
            plugins=plugins if plugins is not None else get_plugin_manager(),
            warn=display.warn,
        )
        self.parts = RunParts(resolved, components, folder, display, self.observers)
        self.checkpoints = RunCheckpoints(folder.checkpoints)
        self.trainer = TrainerHalf(self.parts, buffer=self.buffer, record_datums=record_datums)
        self.producer = ProducerHalf(
            self.parts,
            buffer=self.buffer,
            run_id=self.run_id,
            trainer_call=self.trainer.on_trainer_thread,
        )
        self.lifecycle = Lifecycle(
            plan=self.plan,
            folder=folder,
            display=display,
            observers=self.observers,
            run_id=self.run_id,
            summarize=self.trainer.summarize,
            save=lambda state, trigger: self.checkpoints.save(
                self.c.trainer, state, trigger=trigger
            ),
        )

    @property
    def display(self) -> Any:
        return self.parts.display

    @display.setter
    def display(self, display: Any) -> None:
        """Show the run on ``display`` from now on."""
        self.parts.display = self.lifecycle.display = display

    # ------------------------------------------------------------------ state

    def _initial_state(self) -> LoopState:
        self.tasks = list(self.c.tasks.tasks("train"))
        batch_size = self.plan.algorithm.batch_size
        if not self.resume and batch_size > len(self.tasks):
            raise ResumeError(
                f"batch_size {batch_size} is larger than the {len(self.tasks)} train tasks;"
                " lower [algorithm].batch_size or add tasks"
            )
        state = fresh_or_resumed(
            self.folder,
            self.c.trainer,
            size=len(self.tasks),
            seed=self.plan.run.seed,
            resume=self.resume,
            what=f"the train split has {len(self.tasks)} tasks",
            again="resume with the same [tasks] as the run",
            display=self.display,
            observers=self.observers,
        )
        if self.resume:
            if self._asynchronous:
                self._kept = self._queued_batches(state)
                self.folder.rewrite(self.folder.queue, [t.to_dict() for t in self._kept])
            self._forget_sessions_after(state.step, keep={t.step for t in self._kept})
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

    def _on_stop(self) -> None:
        self._stop = True
        self.trainer.stopping = True
        self.display.warn("stopping: cancelling the step in flight, then cleaning up")
        if self._phase == "train":
            self.trainer.interrupt()
        self.producer.cancel()
        if self.evaluator is not None:
            self.evaluator.cancel()
        if self._wait_task is not None:
            self._wait_task.cancel()

    def _on_force(self) -> None:
        """A second signal: what the first asked for, however far the cleanup got."""
        self._stop = True
        self.trainer.stopping = True
        self.producer.cancel()
        self.trainer.interrupt()

    # ------------------------------------------------------------------ run

    async def run(self) -> RunResult:
        """Run the steps left; see the module docstring."""
        rollouts = contextlib.AsyncExitStack()
        try:
            state = self._initial_state()
            runner, builder = await self.producer.open(rollouts)
            self.trainer.policy_sync = self.producer.policy_sync()
            if self._asynchronous:
                # Versions published are what the age bound counts: no need to wait for the
                # step's records. Without lead the next batch waits for them, as sampling and
                # an evaluation would otherwise share the sampler.
                self.trainer.on_updated = self.producer.trained
            evaluator = RunEvaluator.for_run(self.parts, self.producer.rollouts, run_id=self.run_id)
            self.evaluator = self.trainer.evaluator = evaluator
        except BaseException:
            await rollouts.aclose()
            self.observers.close_loggers()
            raise
        life = self.lifecycle
        life.begin(state, resumed=self.resume)
        failure: TooManyFailedRollouts | None = None
        try:
            # The handlers stay through the cleanup, so that a second signal there still
            # ends the run with its summary.
            with life.stop_signals(self._on_stop, self._on_force):
                try:
                    await self.trainer.route_loss()
                    if self.trainer.policy_sync is not None:
                        await self.trainer.policy_sync()
                    if not self._stop:
                        self.producer.start(
                            state,
                            self.tasks,
                            runner,
                            builder,
                            kept=self._kept,
                            on_ticket=self._on_ticket,
                        )
                        self.trainer.step_ended = time.monotonic()
                    while state.step < self.plan.run.steps and not self._stop:
                        try:
                            done = await self._step(state)
                        except TooManyFailedRollouts as exc:
                            failure = exc
                            break
                        if not done:
                            break
                        life.after_step(state)
                        if self.evaluator is not None:
                            self.evaluator.keep_best(
                                state, self.checkpoints, lambda s: life.checkpoint(s, "scheduled")
                            )
                        self.producer.trained(state.step)
                finally:
                    await self.producer.stop()
                    await rollouts.aclose()
                    self.trainer.shutdown()
                if life.stop_code is not None:
                    status, exit_code = "interrupted", life.stop_code
                elif failure is not None:
                    status, exit_code = "failed", 1
                else:
                    status, exit_code = "finished", 0
                life.final_checkpoint(state, torn_step=self.trainer.torn_step)
                export = self.plan.run.export
                if status == "finished" and export is not None:
                    life.export(self.c.trainer, export, "[run].export")
                summary = life.summary(status)
                if status == "finished" and export is not None:
                    summary["export"] = export
                if self.evaluator is not None:
                    summary |= self.evaluator.summary()
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
                return life.finish(status, exit_code, summary, failure)
        except BaseException as exc:
            life.crashed(exc)
            raise
        finally:
            life.close()

    def _on_ticket(self, ticket: Ticket) -> None:
        if self._asynchronous:
            self.folder.append(self.folder.queue, ticket.to_dict())

    # ------------------------------------------------------------------ the RL step

    async def _next_ticket(self) -> Ticket | None:
        """The next queued batch, or None when a signal stopped the wait."""
        self._phase = "wait"
        self._wait_task = asyncio.ensure_future(self.producer.next_ticket())
        try:
            return await self._wait_task
        except asyncio.CancelledError:
            if not self._stop:
                raise
            return None
        finally:
            self._wait_task = None
            self._phase = "train"

    async def _step(self, state: LoopState) -> bool:
        """The RL step: train step ``state.step + 1`` on its rollout batch once the producer
        has queued it (rolled out ahead by up to the pipeline's lead, or just now with the
        sync pipeline); False when a signal stopped the wait or the update. Raises what
        stopped the producer at this step (:class:`TooManyFailedRollouts`, before training)."""
        self.observers.step_start(state.step + 1)
        waiting = time.monotonic()
        ticket = await self._next_ticket()
        if ticket is None:
            return False
        return await self.trainer.train_ticket(
            state,
            ticket,
            trainer_wait_s=time.monotonic() - waiting,
            sampler_wait_s=self.producer.take_waited,
            dispatch=self.producer.take_dispatch,
            pipeline_metrics=self._asynchronous,
        )

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
