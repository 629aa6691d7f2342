"""The trainer half of the RL pipeline: a batch's datums -> the policy update -> the step's
records.

The one-process loop (both pipelines) and a split run's trainer role train through one
:class:`TrainerHalf`: :meth:`TrainerHalf.train` updates the policy
(:func:`~rllm_core.training.update.update_policy` on one trainer thread),
:meth:`TrainerHalf.train_ticket` is the whole step of a queued batch (select its samples from
the sample buffer, drop groups older than ``[algorithm].max_policy_age``, update, commit the
buffer's watermark, record), and :meth:`TrainerHalf.record` writes a finished step's metrics
line, episode records and datums and tells the loggers and hooks.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from rllm_core.algorithms.native_losses import LossRoute, NativeLossError
from rllm_core.algorithms.objective import Objective
from rllm_core.errors import TrainingInterrupted
from rllm_core.evaluation.during_run import RunEvaluator
from rllm_core.plan import Plan
from rllm_core.ports import SampleBuffer
from rllm_core.ports.training import Interruptible, LossRouting
from rllm_core.run.components import Components
from rllm_core.run.folder import RunFolder
from rllm_core.run.metrics import summarize, train_metrics
from rllm_core.run.parts import RunParts
from rllm_core.run.plots import write_plots
from rllm_core.run.state import DataOrder, LoopState, capture_rngs
from rllm_core.run.trainer_thread import TrainerThread
from rllm_core.training.pipeline import Ticket
from rllm_core.training.update import build_objective, update_policy
from rllm_core.types import Datum, Sample

__all__ = ["TrainerHalf"]


class TrainerHalf:
    """Trains the policy of the run's trainer (read at each step: the trainer role builds
    one per incarnation) on batches and records each step into the run folder.

    ``interrupts`` says whether a stop interrupts an update midway (:class:`Interruptible`
    trainers); a trainer role's steps end whole. ``stopping`` is set by the loop on a stop
    signal; ``policy_sync`` moves a ``[sampler]`` to each new version after an optimizer step;
    ``on_updated`` is told each step's number once its update has published its versions,
    before the step is recorded (the async pipeline dispatches more groups then).
    """

    def __init__(
        self,
        parts: RunParts,
        *,
        buffer: SampleBuffer,
        record_datums: bool = False,
        interrupts: bool = True,
    ) -> None:
        self.parts = parts
        self.buffer = buffer
        self.record_datums = record_datums
        self.interrupts = interrupts
        self.stopping = False
        self.torn_step: int | None = None
        self.loss_route: LossRoute | None = None
        self.policy_sync: Callable[[], Awaitable[Any]] | None = None
        self.on_updated: Callable[[int], None] = lambda step: None
        self.evaluator: RunEvaluator | None = None
        self.step_ended = time.monotonic()
        self._routed_trainer: Any = None
        self._objective: Objective | None = None
        self.thread = TrainerThread()

    @property
    def c(self) -> Components:
        return self.parts.components

    @property
    def plan(self) -> Plan:
        return self.parts.plan

    @property
    def folder(self) -> RunFolder:
        return self.parts.folder

    @property
    def display(self) -> Any:
        return self.parts.display

    # ------------------------------------------------------------------ the trainer thread

    async def on_trainer_thread(self, call: Callable[[], Any]) -> Any:
        """Run ``call`` on the trainer thread (:class:`TrainerThread`)."""
        return await self.thread.call(call)

    def shutdown(self) -> None:
        """Wait for the trainer thread's work and end the thread."""
        self.thread.shutdown()

    def interrupt(self) -> None:
        """Stop an update midway, where the trainer can and the half may."""
        trainer = self.c.trainer
        if self.interrupts and isinstance(trainer, Interruptible):
            trainer.interrupt()

    # ------------------------------------------------------------------ the update

    def objective(self) -> Objective:
        if self._objective is None:
            self._objective = build_objective(
                self.parts.resolved, self.c.loss, list(self.c.aux_losses)
            )
        return self._objective

    async def route_loss(self) -> None:
        """Ask a trainer that chooses where the objective runs (:class:`LossRouting`) for its
        route, once per trainer instance: print it to stderr, write ``loss_path.json`` and keep
        it for ``summary.json``. A route that ``loss_path = "native"`` forces and the objective
        cannot take fails the run."""
        trainer = self.c.trainer
        if self._routed_trainer is trainer or not isinstance(trainer, LossRouting):
            return
        objective = self.objective()
        try:
            route = await self.on_trainer_thread(functools.partial(trainer.loss_route, objective))
        except NativeLossError as exc:
            raise NativeLossError(
                f'{self.parts.resolved.path}: [trainer].loss_path: {exc}; set loss_path = "auto" or'
                ' "custom", or choose a loss the service runs natively (`rllm-core plan check`'
                " says which)"
            ) from exc
        self._routed_trainer = trainer
        self.loss_route = route
        route.write(self.folder.path)
        print(route.line(), file=sys.stderr, flush=True)

    async def train(
        self, datums: Sequence[Datum], *, step: int, why_none: str
    ) -> tuple[dict[str, float], float]:
        """Update the policy on ``datums`` for ``step`` (the update's metrics and seconds);
        without datums, warn ``why_none`` and leave the optimizer alone. Raises
        :class:`TrainingInterrupted` when a stop interrupted the update midway."""
        algorithm = self.plan.algorithm
        began = time.monotonic()
        if not datums:
            self.display.warn(f"{why_none}; the optimizer did not step")
            return {}, 0.0
        await self.route_loss()
        version = self.c.trainer.weight_version
        try:
            train = await update_policy(
                self.c.trainer,
                datums,
                self.objective(),
                epochs=algorithm.epochs,
                mini_batches=algorithm.mini_batches,
                call=self.on_trainer_thread,
                after_step=self.policy_sync,
            )
        except TrainingInterrupted:
            if not self.stopping:
                raise
            if self.c.trainer.weight_version != version:
                self.torn_step = step
            raise
        return train, time.monotonic() - began

    # ------------------------------------------------------------------ a queued batch

    def select(self, ticket: Ticket) -> tuple[list[Sample], int]:
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

    async def train_ticket(
        self,
        state: LoopState,
        ticket: Ticket,
        *,
        trainer_wait_s: float,
        sampler_wait_s: Callable[[], float] = lambda: 0.0,
        dispatch: Callable[[], dict[str, float]] = dict,
        pipeline_metrics: bool = True,
    ) -> bool:
        """Train step ``state.step + 1`` on its queued batch ``ticket``; False when a stop
        interrupted the update (the step is not recorded). ``sampler_wait_s`` takes the seconds the
        producer waited since the last step and ``dispatch`` its rollouts running and groups in
        flight; ``pipeline_metrics`` adds the ``async/*`` keys (policy ages, stale groups, queue,
        waits, dispatch), which a pipeline without lead leaves out."""
        step = state.step + 1
        algorithm = self.plan.algorithm
        version = self.c.trainer.weight_version
        samples, watermark = await asyncio.to_thread(self.select, ticket)
        # Without lead the batch was rolled out by this very policy: no age to check.
        bound = algorithm.max_policy_age if pipeline_metrics else None
        fresh = [s for s in samples if bound is None or version - s.weight_version <= bound]
        stale_groups = {s.group_id for s in samples} - {s.group_id for s in fresh}
        datums = [s.datum for s in fresh]
        ages = [version - s.weight_version for s in fresh]
        dropped = [
            f"{ticket.rollout.get('episodes', 0.0):.0f} scored episodes",
            f"{ticket.rollout.get('dropped_groups', 0.0):.0f} zero-variance groups dropped",
        ]
        if pipeline_metrics:
            dropped.append(f"{len(stale_groups)} groups older than max_policy_age dropped")
        try:
            train, train_s = await self.train(
                datums,
                step=step,
                why_none=f"step {step}: no datum to train on ({', '.join(dropped)})",
            )
        except TrainingInterrupted:
            self.display.warn(f"step {step}: training interrupted; the step is not recorded")
            return False
        self.on_updated(step)
        if watermark > self.buffer.committed():
            await asyncio.to_thread(self.buffer.commit, watermark)
        evaluated = await self.evaluator.evaluate(step) if self.evaluator is not None else {}
        now = time.monotonic()
        line = (
            {"step": step}
            | ticket.rollout
            | train_metrics(
                datums=datums,
                train=train,
                train_s=train_s,
                step_s=now - self.step_ended,
                weight_version=self.c.trainer.weight_version,
            )
            | evaluated
        )
        if pipeline_metrics:
            line |= {
                "async/policy_age_mean": sum(ages) / len(ages) if ages else 0.0,
                "async/policy_age_max": float(max(ages, default=0)),
                "async/dropped_stale": float(len(stale_groups)),
                "async/queue_groups": float(self.buffer.backlog().groups),
                "async/sampler_wait_s": sampler_wait_s(),
                "async/trainer_wait_s": trainer_wait_s,
            } | dispatch()
        self.step_ended = now
        self.record(line, ticket.episodes, datums)
        state.step = step
        state.data = DataOrder.from_dict(ticket.data)
        if pipeline_metrics:
            # Without lead the buffer is empty between steps: no position to resume from.
            state.buffer_watermark = self.buffer.committed()
        state.rngs = capture_rngs()
        self.show(line)
        return True

    # ------------------------------------------------------------------ records

    def record(
        self, line: dict[str, Any], episodes: list[dict[str, Any]], datums: Sequence[Datum]
    ) -> None:
        """Write a finished step's metrics line (then tell the loggers and hooks), its episode
        records and, when asked, its datums."""
        step = line["step"]
        self._warn_about(line)
        self.folder.append(self.folder.metrics, line)
        self.parts.observers.step_end(step, line)
        self.folder.append(self.folder.episodes, episodes)
        if self.record_datums:
            self.folder.append(self.folder.path / "datums.jsonl", _datum_rows(step, datums))

    def show(self, line: dict[str, Any]) -> None:
        problem = write_plots(RunFolder.read_jsonl(self.folder.metrics), self.folder.path)
        if problem is not None and line["step"] == 1:
            self.display.warn(problem)
        self.display.step_finished(line)

    def summarize(self, status: str, state: LoopState) -> dict[str, Any]:
        """The RL part of ``summary.json``: the metrics' summary, the last step, the weight
        version and the loss route."""
        summary = summarize(RunFolder.read_jsonl(self.folder.metrics)) | {
            "last_step": state.step,
            "weight_version": getattr(self.c.trainer, "weight_version", None),
        }
        if self.loss_route is not None:
            summary["loss_path"] = self.loss_route.record()
        return summary

    def _warn_about(self, line: Mapping[str, Any]) -> None:
        step = line["step"]
        if line["infra_retries"] or line["infra_failures"]:
            self.display.warn(
                f"step {step}: {line['infra_retries']:.0f} infrastructure retries,"
                f" {line['infra_failures']:.0f} rollouts excluded"
            )
        if line["resets"]:
            self.display.warn(f"step {step}: {line['resets']:.0f} cumulative-session resets")


def _datum_rows(step: int, datums: Any) -> list[dict[str, Any]]:
    return [
        {
            "step": step,
            "session_id": d.metadata.get("session_id"),
            "episode_id": d.metadata.get("episode_id"),
            "token_ids": list(d.token_ids),
            "action_mask": list(d.action_mask),
            "logprobs": list(d.logprobs),
            "advantages": list(d.advantages),
        }
        for d in datums
    ]
