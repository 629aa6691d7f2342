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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rllm_core.errors import CutError, SchedulerGaveUp
from rllm_core.plan import ResolvedPlan
from rllm_core.plugins.manager import PluginManager, get_plugin_manager
from rllm_core.ports import SampleBuffer, TrainerLauncher
from rllm_core.run.components import Components
from rllm_core.run.cuts import (
    latest_cut,
    load_release,
    publish_release,
    restore_cut,
    write_cut,
)
from rllm_core.run.folder import RunFolder
from rllm_core.run.lifecycle import Lifecycle, RunResult
from rllm_core.run.observers import RunObservers
from rllm_core.run.parts import RunParts
from rllm_core.run.state import DataOrder, LoopState, capture_rngs, restore_rngs, seed_rngs
from rllm_core.run.trainer_thread import TrainerThread
from rllm_core.training.island import (
    DEFAULT_READY_TIMEOUT_S,
    CommandFile,
    IslandIncarnation,
    IslandTrainer,
    build_launcher,
    close_launcher,
)
from rllm_core.training.node_agent import NodeAgent, StoreNodeConverter, node_pool, node_urls
from rllm_core.training.nodes import ConvertingTrainer
from rllm_core.training.pipeline import Ticket
from rllm_core.training.producer_half import ProducerHalf
from rllm_core.training.scheduler import Controller, SchedulerSettings
from rllm_core.training.shared import SharedRun
from rllm_core.training.trainer_half import TrainerHalf

__all__ = ["ROLES", "SamplerRole", "TrainerRole"]

ROLES = ("both", "sampler", "trainer")

KEEP = 3
"""Cuts and releases kept in the store besides the newest."""


class _Role:
    """What both roles hold: the plan, the components, the run folder, the shared sample
    buffer, the observers and the run lifecycle."""

    def __init__(
        self,
        *,
        shared: SharedRun,
        resolved: ResolvedPlan,
        components: Components,
        folder: RunFolder,
        display: Any,
        record_datums: bool = False,
        run_id: str | None = None,
        plugins: PluginManager | None = None,
    ) -> None:
        if components.sample_buffer is None:
            raise ValueError(
                "a split run's roles meet in the sample buffer of its [object_store]; the run"
                " built none (prepare the plan with rllm_core.run.components.prepare_plan)"
            )
        self.shared = shared
        self.resolved = resolved
        self.plan = resolved.plan
        self.c = components
        self.folder = folder
        self.display = display
        self.record_datums = record_datums
        self.run_id = run_id or folder.path.name
        self.buffer: SampleBuffer = components.sample_buffer
        self.observers = RunObservers(
            loggers=components.loggers,
            plugins=plugins if plugins is not None else get_plugin_manager(),
            warn=display.warn,
        )
        self.parts = RunParts(resolved, components, folder, display, self.observers)
        self._stop = False

    def _lifecycle(self, summarize: Any) -> Lifecycle:
        return Lifecycle(
            plan=self.plan,
            folder=self.folder,
            display=self.display,
            observers=self.observers,
            run_id=self.run_id,
            summarize=summarize,
        )


class SamplerRole(_Role):
    """The sampler side of a split run; see the module docstring."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tasks: list[Any] = []
        self._loaded_version = 0
        self._workdir = Path(tempfile.mkdtemp(prefix="releases-", dir=self.folder.path))
        self._trainer_thread = TrainerThread()  # exports to a [sampler], as in the loop
        self.producer = ProducerHalf(
            self.parts,
            buffer=self.buffer,
            run_id=self.run_id,
            trainer_call=self._trainer_thread.call,
        )
        self.lifecycle = self._lifecycle(self._summarize)

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
        self.folder.append(self.folder.queue, ticket.to_dict())
        self.display.info(f"batch {ticket.step} queued: {ticket.groups} groups")

    def _on_stop(self) -> None:
        self._stop = True
        self.display.warn("stopping: cancelling the step in flight, then cleaning up")
        self.producer.cancel()

    async def _follow_trainer(self) -> int:
        """Load the newest release when the trainer moved on; returns its trained step."""
        step, version = await asyncio.to_thread(self.shared.progress)
        if version != self._loaded_version:
            loaded = await asyncio.to_thread(
                load_release, self.shared.store, self.shared.prefix, self.c.trainer, self._workdir
            )
            self._loaded_version = loaded
            policy = self.producer.policy_sync()
            if policy is not None:
                await policy()
            self.display.info(f"loaded policy version {loaded} (trainer at step {step})")
        return step

    async def _newest_release(self) -> int:
        """Load the newest release into the sampler (and its servers); its weight version."""
        await self._follow_trainer()
        return self._loaded_version

    def _node_agent(self) -> NodeAgent | None:
        section = self.plan.scheduler
        if not section.nodes:
            return None
        rollouts = self.producer.rollouts
        return NodeAgent(
            shared=self.shared,
            pool=rollouts.sampler if rollouts is not None else None,
            nodes=node_urls(section),
            load_release=self._newest_release,
            poll_s=section.poll_s,
            info=self.display.info,
        )

    async def _await_nodes_returned(self, agent: Any, nodes: asyncio.Future[None]) -> None:
        """With convertible nodes the trainer may still convert one after the last batch is
        produced (and returns it after the last step): keep answering until it has trained
        ``[run].steps`` and no node is lent, or the agent fails."""
        steps = self.plan.run.steps
        told = False
        while not nodes.done():
            step, _ = await asyncio.to_thread(self.shared.progress)
            if step >= steps and not agent.lent:
                return
            if not told:
                self.display.info(
                    "sampler: every batch is produced; answering the trainer's node requests"
                    f" until it has trained step {steps} and returned its node"
                )
                told = True
            await asyncio.wait({nodes}, timeout=self.plan.scheduler.poll_s)
        nodes.result()

    async def _watch(self) -> None:
        while True:
            step = await self._follow_trainer()
            assert self.producer.gate is not None
            self.producer.gate.trained(step)
            await asyncio.sleep(self.plan.scheduler.poll_s)

    def _summarize(self, status: str, state: LoopState) -> dict[str, Any]:
        return {
            "role": "sampler",
            "last_batch": self.shared.last_step(),
            "weight_version": self._loaded_version,
        }

    async def run(self) -> RunResult:
        rollouts = contextlib.AsyncExitStack()
        try:
            state = self._initial_state()
            runner, builder = await self.producer.open(rollouts)
            policy = self.producer.policy_sync()
            if policy is not None:
                await policy()
            trained = await self._follow_trainer()
            agent = self._node_agent()
        except BaseException:
            await rollouts.aclose()
            self.observers.close_loggers()
            raise
        life = self.lifecycle
        life.begin(state)
        watcher: asyncio.Task[None] | None = None
        nodes = asyncio.ensure_future(agent.run()) if agent is not None else None
        try:
            with life.stop_signals(self._on_stop, self.producer.cancel):
                try:
                    if state.step < self.plan.run.steps:
                        self.producer.start(
                            state,
                            self.tasks,
                            runner,
                            builder,
                            trained=trained,
                            on_ticket=self._on_ticket,
                        )
                        watcher = asyncio.ensure_future(self._watch())
                        assert self.producer.task is not None
                        with contextlib.suppress(asyncio.CancelledError):
                            await asyncio.wait(
                                {self.producer.task, watcher},
                                return_when=asyncio.FIRST_COMPLETED,
                            )
                        if watcher.done() and not watcher.cancelled():
                            # A release that cannot be loaded: the gate would never open again.
                            raise watcher.exception() or RuntimeError("the release watcher ended")
                    if nodes is not None:
                        # The trainer converts its node back after the last step: stay to answer.
                        await self._await_nodes_returned(agent, nodes)
                finally:
                    for task in (watcher, nodes):
                        if task is not None:
                            task.cancel()
                            with contextlib.suppress(asyncio.CancelledError):
                                await task
                    await self.producer.stop()
                    await rollouts.aclose()
                    self._trainer_thread.shutdown()
                    await asyncio.to_thread(self.buffer.close)
                failure = self.producer.queue.failure()
                if failure is not None:
                    raise failure
                status = "interrupted" if life.stop_code is not None else "finished"
                summary = life.summary(status)
                self.display.info(
                    f"sampler {status}: batches up to {summary['last_batch']} produced"
                )
                result = life.finish(status, life.stop_code or 0, summary, show=False)
        except BaseException as exc:
            life.crashed(exc)
            raise
        finally:
            life.close()
        result.step = summary["last_batch"]
        return result


class TrainerRole(_Role):
    """The trainer side of a split run, one incarnation at a time; see the module docstring.

    Implements the scheduler's trainer lifecycle (``start``, ``train_round``, ``stop``).
    With ``incarnation``, it is that one incarnation as a job of its own
    (:class:`~rllm_core.training.island.IslandIncarnation`); with ``[scheduler].launcher`` other
    than ``in-process``, it only schedules, and launches each incarnation as such a job
    through the launcher it names (built in, or a plugin's, built here with the run's object
    store: :func:`~rllm_core.training.island.build_launcher`; ``overrides``: the ``--set``
    items the jobs get).
    """

    def __init__(
        self,
        *,
        incarnation: int | None = None,
        overrides: Sequence[str] = (),
        node_class: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.island_incarnation = incarnation
        self.overrides = list(overrides)
        self.node_class = node_class
        self._converting: ConvertingTrainer | None = None
        self._island: IslandTrainer | None = None
        self._launcher: TrainerLauncher | None = None
        if incarnation is None and self.plan.scheduler.launches:
            # Built before the run starts, so that a launcher that cannot be built refuses it.
            self._launcher = build_launcher(
                self.resolved, self.shared.store, logs=self.folder.path / "island"
            )
        self._job: IslandIncarnation | None = None
        self.state: LoopState | None = None
        # A round ends whole: its release and progress follow it.
        self.trainer = TrainerHalf(
            self.parts, buffer=self.buffer, record_datums=self.record_datums, interrupts=False
        )
        self.lifecycle = self._lifecycle(self._summarize)
        self._incarnation = 0
        self._trainer_open = True
        self._workdir = Path(tempfile.mkdtemp(prefix="cuts-", dir=self.folder.path))
        self._cut_step = -1
        self._published: int | None = None
        self._running = False
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
        tasks = list(self.c.tasks.tasks("train"))
        ref = await asyncio.to_thread(latest_cut, self.shared.store, self.shared.prefix)
        if ref is None:
            seed_rngs(self.plan.run.seed)
            state = LoopState(step=0, data=DataOrder(size=len(tasks), seed=self.plan.run.seed))
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
        self.lifecycle.state = state
        self.trainer.step_ended = time.monotonic()
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
        self._running = False  # until the step is through: a failure ends the incarnation
        self.observers.step_start(state.step + 1)
        await self.trainer.train_ticket(state, ticket, trainer_wait_s=0.0)
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

    # ------------------------------------------------------------------ run

    def _on_stop(self) -> None:
        self._stop = True
        self.trainer.stopping = True
        self.display.warn("stopping: the trainer cuts after the step in flight")
        signals = self.lifecycle.signals
        received = signals.received if signals is not None else None
        trigger = "preempt" if received == signal.SIGTERM else "manual"
        if self._controller is not None:
            self._controller.request_stop(trigger)
        if self._job is not None:
            self._job.request_stop(trigger)

    def _summarize(self, status: str, state: LoopState) -> dict[str, Any]:
        if self._island is not None:
            return {"role": "trainer", "incarnation": self._island.incarnation}
        summary = self.trainer.summarize(status, state) | {"role": "trainer"}
        if self._job is not None:
            summary |= {"incarnation": self._job.incarnation, "ended": self._job.ended}
        return summary

    def _lifecycle_of_run(self) -> Any:
        """This process's trainer lifecycle: itself, or launched jobs (the class docstring)."""
        section = self.plan.scheduler
        if not section.launches:
            return self
        assert self._launcher is not None
        self._island = IslandTrainer(
            launcher=self._launcher,
            shared=self.shared,
            command=CommandFile(
                incarnation=0,
                run=self.shared.name,
                plan_path=str(Path(self.resolved.path).resolve()),
                plan=Path(self.resolved.path).read_text(encoding="utf-8"),
                overrides=self.overrides,
                cwd=str(Path.cwd()),
            ),
            steps=self.plan.run.steps,
            ready_timeout_s=section.ready_timeout_s or DEFAULT_READY_TIMEOUT_S,
            poll_s=section.poll_s,
        )
        if not section.nodes:
            return self._island
        converter = StoreNodeConverter(
            shared=self.shared, island=self._island, poll_s=section.poll_s
        )
        self._converting = ConvertingTrainer(
            node_pool(section, converter, only_class=self.node_class)
        )
        return self._converting

    async def run(self) -> RunResult:
        if self.island_incarnation is not None:
            return await self._run_job(self.island_incarnation)
        settings = SchedulerSettings.from_plan(self.plan)
        lifecycle = self._lifecycle_of_run()
        self._controller = Controller(
            lifecycle=lifecycle,
            settings=settings,
            store=self.shared.store,
            prefix=self.shared.key("scheduler"),
            backlog=self._backlog,
            data_ended=self._data_ended,
            on_decision=lambda decision: self.display.info(f"scheduler: {decision}"),
        )
        if self._island is not None:
            self._island.record = self._controller.record_event
        if self._converting is not None:
            self._converting.record = self._controller.record_event
            converter = self._converting.pool.converter
            assert isinstance(converter, StoreNodeConverter)
            names = [node.name for node in self._converting.pool.nodes]
            for node in await converter.reclaim(names):
                self.display.warn(
                    f"node {node} was still lent to a trainer incarnation of an earlier"
                    " scheduler; it samples again"
                )
        life = self.lifecycle
        life.begin(life.state)
        status, exit_code, failure = "finished", 0, None
        try:
            with life.stop_signals(self._on_stop):
                await self._controller.run()
                if life.stop_code is not None:
                    status, exit_code = "interrupted", life.stop_code
        except SchedulerGaveUp as exc:
            failure = exc
            status, exit_code = "failed", exc.exit_code
        except BaseException as exc:
            life.crashed(exc)
            raise
        finally:
            if self._island is not None:
                await self._island.aclose()
            if self._launcher is not None:
                await close_launcher(self._launcher)
            self.trainer.shutdown()
            await asyncio.to_thread(self.buffer.close)
            life.close()
        summary = life.summary(status)
        if failure is not None:
            summary["reason"] = str(failure)
        return life.finish(status, exit_code, summary, failure)

    async def _run_job(self, incarnation: int) -> RunResult:
        """Run one incarnation as a job of its own, until the scheduler stops it."""
        self._job = IslandIncarnation(self, incarnation)
        life = self.lifecycle
        life.begin(life.state)
        try:
            with life.stop_signals(self._on_stop):
                await self._job.run()
        except BaseException as exc:
            life.crashed(exc)
            raise
        finally:
            self.trainer.shutdown()
            await asyncio.to_thread(self.buffer.close)
            life.close()
        status = "interrupted" if self._job.ended in ("manual", "preempt") else "finished"
        return life.finish(status, 0, life.summary(status))

    def _backlog(self) -> int:
        """Groups waiting after the running incarnation's step (a launched one's: the last its
        heartbeat reported) or, with none running, after the newest cut (what a failed one
        trained past it is trained again)."""
        if self._island is not None and self._island.job is not None:
            step = self._island.step
        elif self.state is not None and self._running:
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
