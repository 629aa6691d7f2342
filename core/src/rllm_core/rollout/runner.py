"""The rollout runner: groups of concurrent rollouts per task, with infrastructure retries."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from rllm_core.ports.agents import Harness, TaskSource
from rllm_core.ports.sandboxes import SandboxBackend
from rllm_core.ports.storage import TraceStore
from rllm_core.rollout.attempt import AttemptRunner
from rllm_core.rollout.classify import InfraError
from rllm_core.rollout.failures import TooManyVerifierTimeouts
from rllm_core.rollout.gateway import SessionGateway
from rllm_core.rollout.gauge import Gauge
from rllm_core.rollout.records import EventKind, InfraFailure, RolloutBatch, RolloutEvent
from rllm_core.rollout.sessions import SessionKey
from rllm_core.rollout.settings import RolloutSettings
from rllm_core.types import Episode, Task, Termination

__all__ = ["RolloutRunner"]

log = logging.getLogger("rllm_core.rollout")


class _Progress:
    """Counters shared by the rollouts of one batch (one event loop, so no lock)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.retries = 0


class RolloutRunner:
    """Runs ``group_size`` rollouts of every task through the gateway and grades them.

    One rollout attempt: a gateway session ``{run_id}-s{step}-{task_id}-{index}-a{attempt}``
    (made safe, see :class:`~rllm_core.rollout.sessions.SessionKey`) configured with
    ``settings.enforced``; a sandbox from ``sandbox_backend.create(task.environment)`` when the
    task has an environment (else ``None``), the task being what
    :func:`~rllm_core.ports.sandboxes.task_for_backend` makes of it for a backend that builds
    Dockerfiles; preparation (the source's ``prepare(task,
    sandbox)`` coroutine when it has one, else ``prepare_sandbox`` for Harbor tasks); the
    harness against ``gateway.endpoint(session)`` within ``task.agent_timeout_s +
    deadline_margin_s`` (past it the harness is cancelled and the episode ends ``timeout``);
    ``task_source.grade`` within ``task.verifier_timeout_s + deadline_margin_s``; the session's
    traces from ``trace_store`` rebuilt into trajectories. The sandbox is then closed and the
    gateway forgets the session; the trace store keeps its traces.

    The resulting :class:`~rllm_core.types.Episode` has ``episode_id == session_id``,
    ``group_id == f"{step}-{task_id}"``, the grade's reward and signals, the harness's
    termination, and metadata ``incomplete_chains``, ``harness`` (the outcome's metadata),
    ``turns``, ``answer``, ``step``, ``index``, ``attempt`` and ``duration_s``.

    Failures are classified by :mod:`rllm_core.rollout.classify`. An infrastructure failure
    whose reason ``settings.mask`` names (all of them by default) is retried with a fresh
    session and sandbox up to ``max_infra_retries`` times, then the rollout is excluded and
    recorded in ``RolloutBatch.infra_failures``; it is never scored. One the mask leaves out
    is scored as the policy's failure at once (see
    :class:`~rllm_core.rollout.attempt.AttemptRunner`).
    Scored terminations get whatever ``task_source.grade`` returns for their outcome: the runner
    never substitutes a reward (the ``jsonl`` source scores a missing answer as an empty reply,
    a Harbor verifier grades the sandbox as the agent left it). Any other exception from a
    harness or a task source is a bug: it cancels the batch and propagates.

    ``max_concurrency`` bounds the attempts in flight over every batch the runner is running
    at once (the async pipeline runs batches side by side). When ``run`` is
    cancelled, every in-flight rollout is cancelled, sandboxes are closed (each within
    ``close_timeout_s``), and ``CancelledError`` is raised once they are done or after
    ``cancel_timeout_s``, whichever comes first. ``running`` counts the attempts holding one of
    those ``max_concurrency`` places now (and its mean over time).

    ``settings.max_verifier_timeouts`` caps the attempts that end ``verifier_timeout`` (masked
    or scored) over the runner's life, every batch together: one more raises
    :class:`~rllm_core.rollout.TooManyVerifierTimeouts` (naming each task and its count),
    which cancels the batch like any other error.

    ``on_event`` receives a :class:`~rllm_core.rollout.RolloutEvent` for every attempt started,
    rollout finished, attempt retried and rollout failed; an exception it raises is logged and
    ignored.
    """

    def __init__(
        self,
        *,
        task_source: TaskSource,
        harness: Harness,
        sandbox_backend: SandboxBackend | None,
        gateway: SessionGateway,
        trace_store: TraceStore,
        settings: RolloutSettings,
        run_id: str,
        on_event: Callable[[RolloutEvent], None] | None = None,
    ) -> None:
        if not run_id:
            raise ValueError("run_id is empty; pass the run's id (it prefixes every session id)")
        self.settings = settings
        self.run_id = run_id
        self.on_event = on_event
        self.gateway = gateway
        self.trace_store = trace_store
        self._limit: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self.running = Gauge()
        self._verifier_timeouts: dict[str, int] = {}
        self._attempts = AttemptRunner(
            task_source=task_source,
            harness=harness,
            sandbox_backend=sandbox_backend,
            gateway=gateway,
            trace_store=trace_store,
            settings=settings,
        )

    async def run(
        self,
        tasks: Sequence[Task],
        *,
        step: int,
        admit: Callable[[int], Awaitable[None]] | None = None,
    ) -> RolloutBatch:
        """Roll out every task ``group_size`` times; ``groups`` follows the order of
        ``tasks``. ``admit(i)`` is awaited before the rollouts of ``tasks[i]`` start, in order
        (the async pipeline dispatches group by group). Raises ``ValueError`` when two tasks
        share an id (their groups and sessions would collide)."""
        seen: set[str] = set()
        for task in tasks:
            if task.task_id in seen:
                raise ValueError(
                    f"task id {task.task_id!r} appears twice in the batch; pass each task once"
                    " and raise group_size for more rollouts of it"
                )
            seen.add(task.task_id)
        began = time.monotonic()
        size = self.settings.group_size
        if not tasks:
            return RolloutBatch(groups=[], wall_s=time.monotonic() - began)
        progress = _Progress(total=len(tasks) * size)
        limit = self._concurrency()
        jobs: list[asyncio.Task[Episode | InfraFailure]] = []
        try:
            for position, task in enumerate(tasks):
                if admit is not None:
                    await admit(position)
                jobs.extend(
                    asyncio.create_task(
                        self._rollout(task, index, step, limit, progress),
                        name=f"rollout {task.task_id}#{index}",
                    )
                    for index in range(size)
                )
            results = await asyncio.gather(*jobs)
        except BaseException:
            await self._cancel(jobs)
            raise
        groups: list[list[Episode]] = [[] for _ in tasks]
        failures: list[InfraFailure] = []
        for position, result in enumerate(results):
            if isinstance(result, Episode):
                groups[position // size].append(result)
            else:
                failures.append(result)
        return RolloutBatch(
            groups=groups,
            infra_failures=failures,
            retries=progress.retries,
            wall_s=time.monotonic() - began,
            episodes_done=sum(len(group) for group in groups),
        )

    def _concurrency(self) -> asyncio.Semaphore:
        """The semaphore every batch on the running loop shares."""
        loop = asyncio.get_running_loop()
        if self._limit is None or self._limit[0] is not loop:
            self._limit = (loop, asyncio.Semaphore(self.settings.max_concurrency))
        return self._limit[1]

    async def _cancel(self, jobs: list[asyncio.Task[Any]]) -> None:
        for job in jobs:
            job.cancel()
        done, pending = await asyncio.wait(jobs, timeout=self.settings.cancel_timeout_s)
        for job in done:
            if not job.cancelled():
                job.exception()  # retrieved so that asyncio does not report it as lost
        if pending:
            log.warning(
                "%d rollout(s) did not finish cleaning up within %g s of the cancellation;"
                " their sandboxes may outlive the run until the backend reclaims them",
                len(pending),
                self.settings.cancel_timeout_s,
            )

    async def _rollout(
        self,
        task: Task,
        index: int,
        step: int,
        limit: asyncio.Semaphore,
        progress: _Progress,
    ) -> Episode | InfraFailure:
        last = self.settings.max_infra_retries
        for attempt in range(last + 1):
            session_id = SessionKey(self.run_id, step, task.task_id, index, attempt).encode()

            def emit(kind: EventKind, **fields: Any) -> None:
                self._emit(
                    RolloutEvent(
                        kind=kind,
                        task_id=task.task_id,
                        index=index,
                        attempt=attempt,  # noqa: B023 - called only within this iteration
                        session_id=session_id,  # noqa: B023 - likewise
                        step=step,
                        done=progress.done,
                        total=progress.total,
                        **fields,
                    )
                )

            async with limit:
                emit("started")
                self.running.add(1)
                try:
                    episode = await self._attempts.run(
                        task, step=step, index=index, attempt=attempt, session_id=session_id
                    )
                except InfraError as failure:
                    error = str(failure)
                    termination = failure.termination
                    self._count_verifier_timeout(task, termination)
                else:
                    self._count_verifier_timeout(task, episode.termination)
                    progress.done += 1
                    emit("finished", reward=episode.reward, termination=episode.termination)
                    return episode
                finally:
                    self.running.add(-1)
            if attempt < last:
                progress.retries += 1
                log.warning(
                    "rollout %s of task %s failed on infrastructure (%s), retrying (%d/%d): %s",
                    session_id,
                    task.task_id,
                    termination,
                    attempt + 1,
                    last,
                    error,
                )
                emit("retried", termination=termination, error=error)
                if self.settings.retry_delay_s > 0:
                    await asyncio.sleep(self.settings.retry_delay_s)
                continue
            progress.done += 1
            log.warning(
                "rollout %s of task %s excluded after %d attempt(s) failed on infrastructure"
                " (%s): %s",
                session_id,
                task.task_id,
                last + 1,
                termination,
                error,
            )
            emit("failed", termination=termination, error=error)
            return InfraFailure(
                task_id=task.task_id,
                index=index,
                attempt=attempt,
                termination=termination,
                error=error,
                session_id=session_id,
            )
        raise AssertionError("unreachable: the last attempt returns")

    def _count_verifier_timeout(self, task: Task, termination: Termination) -> None:
        """Count a ``verifier_timeout`` attempt; raise :class:`TooManyVerifierTimeouts` past
        ``settings.max_verifier_timeouts``."""
        if termination is not Termination.VERIFIER_TIMEOUT:
            return
        counts = self._verifier_timeouts
        counts[task.task_id] = counts.get(task.task_id, 0) + 1
        limit = self.settings.max_verifier_timeouts
        if limit is not None and sum(counts.values()) > limit:
            raise TooManyVerifierTimeouts(timeouts=counts, limit=limit)

    def _emit(self, event: RolloutEvent) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(event)
        except Exception:
            log.exception("the rollout event handler failed on a %s event; ignored", event.kind)
