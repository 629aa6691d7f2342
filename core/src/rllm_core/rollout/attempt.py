"""One attempt at one rollout: sandbox, harness, grade, traces -> an :class:`Episode`."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time

import msgspec

from rllm_core.algorithms import (
    count_history_breaks,
    count_incomplete_chains,
    count_tool_calls,
    trajectories_from_traces,
)
from rllm_core.numerics import inherited_environment
from rllm_core.ports.agents import Harness, TaskSource
from rllm_core.ports.sandboxes import EndsProcesses, Sandbox, SandboxBackend, task_for_backend
from rllm_core.ports.storage import TraceStore
from rllm_core.rollout.classify import (
    InfraError,
    classify_exception,
    infra_outcome,
    no_model_call,
)
from rllm_core.rollout.gateway import SessionGateway
from rllm_core.rollout.network import agent_endpoint, sandbox_spec
from rllm_core.rollout.settings import RolloutSettings
from rllm_core.types import (
    Episode,
    Grade,
    HarnessOutcome,
    SandboxSpec,
    Task,
    Termination,
    TraceCounts,
)

__all__ = ["AttemptRunner", "close_sandbox"]

log = logging.getLogger("rllm_core.rollout")

_UNFENCED_WARNED: set[str] = set()


async def close_sandbox(sandbox: Sandbox, timeout_s: float, session_id: str) -> None:
    """Close ``sandbox`` within ``timeout_s``; a failure is logged, never raised, so it cannot
    hide what ended the attempt."""
    try:
        await asyncio.wait_for(sandbox.close(), timeout_s)
    except TimeoutError:
        log.warning(
            "closing the sandbox of session %s took over %g s; abandoned it (the backend"
            " reclaims it at the end of its lifetime)",
            session_id,
            timeout_s,
        )
    except Exception as exc:
        log.warning("closing the sandbox of session %s failed: %s", session_id, exc)


class AttemptRunner:
    """Runs single attempts for :class:`~rllm_core.rollout.RolloutRunner`.

    :meth:`run` returns the scored episode or raises :class:`InfraError` for an
    infrastructure failure whose reason ``settings.mask`` names (see
    :mod:`rllm_core.rollout.classify`). An infrastructure reason the mask leaves out is scored
    as the policy's failure: reward 0 (no grade exists), the error in the metadata's
    ``harness.error``. With ``no_model_call`` left out, an episode without a model call is
    not told apart: it keeps the harness's termination and is graded as any other.
    Any other exception (a
    bug in a harness or task source, ``SandboxAuthError``) propagates unchanged. Whatever
    happens, including cancellation, the sandbox is closed and the gateway forgets the
    session's live state; its traces stay in the trace store.
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
    ) -> None:
        self.task_source = task_source
        self.harness = harness
        self.sandbox_backend = sandbox_backend
        self.gateway = gateway
        self.trace_store = trace_store
        self.settings = settings

    async def run(
        self, task: Task, *, step: int, index: int, attempt: int, session_id: str
    ) -> Episode:
        began = time.monotonic()
        task = task_for_backend(task, self.sandbox_backend)
        self.gateway.configure_session(session_id, enforced=self.settings.enforced)
        sandbox: Sandbox | None = None
        outcome: HarnessOutcome | None = None
        try:
            try:
                sandbox = await self._create(task, session_id)
                await self._prepare(task, sandbox)
                if isinstance(sandbox, EndsProcesses):
                    await sandbox.mark_processes()
                outcome = await self._play(task, session_id, sandbox)
                await self._end_agent(sandbox)
                if Termination.NO_MODEL_CALL in self.settings.mask:
                    outcome = no_model_call(outcome, self.trace_store.session(session_id))
                failure = infra_outcome(outcome)
                if failure is not None:
                    raise failure
                grade = await self._grade(task, outcome, sandbox)
            except InfraError as failure:
                if self._masked(failure.termination):
                    raise
                termination, error = failure.termination, str(failure)
            except Exception as exc:
                termination = classify_exception(exc)
                if termination is None:
                    raise
                error = f"{type(exc).__name__}: {exc}"
                if self._masked(termination):
                    raise InfraError(error, termination=termination) from exc
            else:
                termination, error = outcome.termination, None
            if error is not None:
                # An unmasked infrastructure reason: the policy's failure, reward 0.
                grade = Grade(reward=0.0)
                metadata = dict(outcome.metadata) if outcome is not None else {}
                outcome = HarnessOutcome(
                    termination=termination,
                    turns=outcome.turns if outcome is not None else 0,
                    metadata=metadata | {"error": error},
                )
            return self._episode(
                task,
                outcome,
                grade,
                step=step,
                index=index,
                attempt=attempt,
                session_id=session_id,
                began=began,
            )
        finally:
            if sandbox is not None:
                await close_sandbox(sandbox, self.settings.close_timeout_s, session_id)
            self.gateway.release_session(session_id)

    def _masked(self, termination: Termination) -> bool:
        """Whether an attempt that failed with ``termination`` is masked (retried, excluded)
        rather than scored: always for a model server failure (``model_error``)."""
        return not termination.is_infrastructure or termination in self.settings.mask

    def _episode(
        self,
        task: Task,
        outcome: HarnessOutcome,
        grade: Grade,
        *,
        step: int,
        index: int,
        attempt: int,
        session_id: str,
        began: float,
    ) -> Episode:
        traces = self.trace_store.session(session_id)
        denied = self.gateway.denied(session_id)
        if denied:
            log.warning(
                "session %s (task %r): the gateway refused %d request(s) beyond its"
                " token's reach; the 'denied' lines of rllm_core.gateway name each",
                session_id,
                task.task_id,
                denied,
            )
        tool_calls, tool_calls_invalid = count_tool_calls(traces)
        return Episode(
            episode_id=session_id,
            task_id=task.task_id,
            group_id=f"{step}-{task.task_id}",
            session_id=session_id,
            trajectories=trajectories_from_traces(traces),
            reward=float(grade.reward),
            termination=outcome.termination,
            signals=dict(grade.signals),
            trace_counts=TraceCounts(
                incomplete_chains=count_incomplete_chains(traces),
                history_breaks=count_history_breaks(traces),
                tool_calls=tool_calls,
                tool_calls_invalid=tool_calls_invalid,
            ),
            denied=denied,
            metadata={
                "harness": dict(outcome.metadata),
                "turns": outcome.turns,
                "answer": outcome.answer,
                "step": step,
                "index": index,
                "attempt": attempt,
                "duration_s": time.monotonic() - began,
            },
        )

    def _spec(self, task: Task, session_id: str) -> SandboxSpec | None:
        """The task's environment with the network the harness needs (see
        :mod:`rllm_core.rollout.network`)."""
        if task.environment is None:
            return None
        return sandbox_spec(task.environment, self.harness, self.gateway.endpoint(session_id))

    async def _create(self, task: Task, session_id: str) -> Sandbox | None:
        spec = self._spec(task, session_id)
        if spec is None:
            return None
        if self.sandbox_backend is None:
            raise ValueError(
                f"task {task.task_id!r} needs a sandbox (it has an environment) but no sandbox"
                " backend is configured; add a [sandbox] section to the plan"
            )
        inherited = inherited_environment()
        if inherited:
            spec = msgspec.structs.replace(spec, env=inherited | spec.env)
        return await self.sandbox_backend.create(spec)

    async def _prepare(self, task: Task, sandbox: Sandbox | None) -> None:
        """The source's own ``prepare(task, sandbox)`` coroutine when it has one (see
        :class:`~rllm_core.ports.agents.TaskSource`); without it the sandbox stays as the
        backend created it."""
        prepare = getattr(self.task_source, "prepare", None)
        if prepare is not None and inspect.iscoroutinefunction(prepare):
            await prepare(task, sandbox)

    async def _play(self, task: Task, session_id: str, sandbox: Sandbox | None) -> HarnessOutcome:
        deadline_s = task.agent_timeout_s + self.settings.deadline_margin_s
        llm = self.gateway.endpoint(session_id)
        spec = self._spec(task, session_id)
        if spec is not None:
            llm = agent_endpoint(spec, sandbox, llm)
        try:
            async with asyncio.timeout(deadline_s) as scope:
                return await self.harness.run(task, llm, sandbox)
        except TimeoutError:
            if not scope.expired():
                raise
        return HarnessOutcome(
            termination=Termination.TIMEOUT,
            metadata={
                "error": f"the harness ran past its {deadline_s:g} s deadline (the task's"
                f" agent timeout plus {self.settings.deadline_margin_s:g} s) and was"
                " cancelled"
            },
        )

    async def _end_agent(self, sandbox: Sandbox | None) -> None:
        """Kill what the agent left running, so that nothing of it runs beside the verifier
        (see :class:`~rllm_core.ports.EndsProcesses`)."""
        if sandbox is None:
            return
        if isinstance(sandbox, EndsProcesses):
            killed = await sandbox.end_processes()
            if killed:
                log.debug("killed %d process(es) the agent left running", killed)
            return
        kind = type(sandbox).__qualname__
        if kind not in _UNFENCED_WARNED:
            _UNFENCED_WARNED.add(kind)
            log.warning(
                "sandboxes of type %s cannot end the processes an agent leaves running"
                " (no mark_processes / end_processes), so one could rewrite the reward while"
                " the verifier runs; use a backend that implements"
                " rllm_core.ports.EndsProcesses",
                kind,
            )

    async def _grade(self, task: Task, outcome: HarnessOutcome, sandbox: Sandbox | None) -> Grade:
        deadline_s = task.verifier_timeout_s + self.settings.deadline_margin_s
        try:
            async with asyncio.timeout(deadline_s) as scope:
                return await self.task_source.grade(task, outcome, sandbox)
        except TimeoutError:
            if not scope.expired():
                raise
        raise InfraError(
            f"grading task {task.task_id!r} ran past its {deadline_s:g} s deadline (the task's"
            f" verifier timeout plus {self.settings.deadline_margin_s:g} s)",
            termination=Termination.VERIFIER_TIMEOUT,
        )
