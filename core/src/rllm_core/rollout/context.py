"""The rollout context of a run or an evaluation: the gateway and the runner, opened together.

``rllm-core run`` and ``rllm-core eval`` roll out the same way::

    settings = rollout_settings(plan, group_size=4)
    async with open_rollouts(plan, components, settings=settings, run_id="run-1") as rollouts:
        batch = await rollouts.runner.run(tasks, step=1)

:func:`open_rollouts` starts a loopback :class:`~rllm_core.gateway.server.Gateway` as a task on
the running loop, on the one sampler of the context and ``components.renderer``, recording into
``components.trace_store``, in the plan's ``[gateway].token_mode``, refusing prompts over
``[gateway].max_prompt_tokens``, on ``[gateway].host`` and ``[gateway].port``. The sampler is
the plan's ``[sampler]`` (``components.sampler``) when it has one, kept on the trainer's policy by a
:class:`~rllm_core.rollout.policy_sync.PolicySync` (``RolloutContext.policy``) that has synced
once before the block starts (unless the caller syncs itself; a training run syncs again after
every optimizer step);
otherwise ``components.trainer.sampler()``. It then builds a
:class:`~rllm_core.rollout.RolloutRunner` on ``components.tasks``, ``components.harness`` and
``components.sandbox`` whose sessions are seeded from ``[run].seed``
(:class:`~rllm_core.rollout.seeding.SeededGateway`). With ``[gateway].workers`` above 1 the
sessions live on that many gateway processes behind a front on ``[gateway].host`` and
``[gateway].port`` instead (:mod:`rllm_core.rollout.gateway_workers`), each following the
policy the sampler serves. The gateway stops when the block exits, however it exits. A
gateway that cannot bind raises :class:`~rllm_core.rollout.gateway_address.GatewayBindError`
naming ``plan_path``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rllm_core.gateway.server import Gateway
from rllm_core.plan.schema import Plan
from rllm_core.ports import Sampler, SharedPool, TraceStore
from rllm_core.rollout.gateway import SessionGateway
from rllm_core.rollout.gateway_address import gateway_bind_error
from rllm_core.rollout.gateway_workers import (
    Component,
    GatewayWorkerError,
    follower,
    open_gateway_workers,
)
from rllm_core.rollout.policy_sync import PolicySync
from rllm_core.rollout.records import RolloutEvent
from rllm_core.rollout.runner import RolloutRunner
from rllm_core.rollout.seeding import SeededGateway
from rllm_core.rollout.settings import RolloutSettings
from rllm_core.types import SamplingParams, Termination

if TYPE_CHECKING:
    from rllm_core.run.components import Components

__all__ = ["RolloutContext", "open_rollouts", "rollout_settings"]

_Served = tuple[SessionGateway, TraceStore, Callable[[], dict[str, float]]]


@dataclass(frozen=True)
class RolloutContext:
    """An open rollout context: the ``gateway`` its sessions live on, the ``sampler`` behind
    it, the ``runner`` that rolls out through it, the ``traces`` a runner reads (the run's
    trace store, seen through the workers with ``[gateway].workers`` above 1) and, with a
    ``[sampler]``, the ``policy`` sync that keeps it on the trainer's weights."""

    gateway: SessionGateway
    sampler: Sampler
    runner: RolloutRunner
    traces: TraceStore
    policy: PolicySync | None = None
    calls: Callable[[], dict[str, float]] = dict
    """The gateway workers' ``gateway/calls/<i>`` since the last call (none with one
    gateway)."""


def rollout_settings(plan: Plan, *, group_size: int) -> RolloutSettings:
    """``group_size`` rollouts per task with the plan's ``[rollout]`` concurrency,
    infrastructure retries, mask and verifier-timeout cap, enforcing its ``[sampling]`` on
    every session."""
    sampling = plan.sampling
    return RolloutSettings(
        group_size=group_size,
        max_concurrency=plan.rollout.max_concurrency,
        max_infra_retries=plan.rollout.max_infra_retries,
        mask=frozenset(Termination(reason) for reason in plan.rollout.mask),
        max_verifier_timeouts=plan.rollout.max_verifier_timeouts,
        enforced=SamplingParams(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
        ),
    )


@asynccontextmanager
async def open_rollouts(
    plan: Plan,
    components: Components,
    *,
    settings: RolloutSettings,
    run_id: str,
    on_event: Callable[[RolloutEvent], None] | None = None,
    plan_path: str = "plan.toml",
    trainer_call: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None,
    sync: bool = True,
) -> AsyncIterator[RolloutContext]:
    """Open the rollout context of ``plan`` (see the module docstring); ``run_id`` prefixes
    every session id, ``on_event`` gets every rollout event, ``trainer_call`` runs the
    trainer's weight exports (a worker thread by default). With ``sync=False`` the caller makes
    the first sync itself (``RolloutContext.policy.sync()``) before any rollout. What the first
    sync raises (the sampler's error) propagates, after the gateway stopped."""
    policy: PolicySync | None = None
    sampler: Sampler
    if components.sampler is not None:
        sampler = components.sampler
        options = {"call": trainer_call} if trainer_call is not None else {}
        policy = PolicySync(components.trainer, components.sampler, **options)  # type: ignore[arg-type]
    else:
        sampler = components.trainer.sampler()
    async with _serving(plan, components, sampler, policy, plan_path) as served:
        gateway, traces, calls = served
        if policy is not None and sync:
            await policy.sync()
        runner = RolloutRunner(
            task_source=components.tasks,
            harness=components.harness,
            sandbox_backend=components.sandbox,
            gateway=SeededGateway(gateway, seed=plan.run.seed, run_id=run_id),
            trace_store=traces,
            settings=settings,
            run_id=run_id,
            on_event=on_event,
        )
        yield RolloutContext(
            gateway=gateway,
            sampler=sampler,
            runner=runner,
            traces=traces,
            policy=policy,
            calls=calls,
        )


@asynccontextmanager
async def _serving(
    plan: Plan,
    components: Components,
    sampler: Sampler,
    policy: PolicySync | None,
    plan_path: str,
) -> AsyncIterator[_Served]:
    """The gateway of the context: one in this process, or ``[gateway].workers`` processes
    (:mod:`rllm_core.rollout.gateway_workers`); yields it, the trace store its runner reads and
    the workers' figures."""
    settings = plan.gateway
    cumulative = settings.token_mode == "cumulative"
    if settings.workers > 1:
        async with _workers(plan, components, sampler, policy, plan_path) as served:
            yield served
        return
    gateway = Gateway(
        renderer=components.renderer,
        sampler=sampler,
        trace_store=components.trace_store,
        cumulative=cumulative,
        max_prompt_tokens=settings.max_prompt_tokens,
        host=settings.host,
        port=settings.port,
    )
    try:
        await gateway.astart()
    except OSError as exc:
        raise gateway_bind_error(
            exc, host=gateway.host, port=settings.port, plan_path=plan_path
        ) from None
    try:
        yield gateway, components.trace_store, dict
    finally:
        await gateway.astop()


@asynccontextmanager
async def _workers(
    plan: Plan,
    components: Components,
    sampler: Sampler,
    policy: PolicySync | None,
    plan_path: str,
) -> AsyncIterator[_Served]:
    settings = plan.gateway
    if not isinstance(sampler, SharedPool) or plan.renderer is None:
        raise GatewayWorkerError(
            f"{plan_path}: [gateway] workers = {settings.workers} needs a [sampler] other"
            f" processes can reach (a rllm_core.ports.SharedPool); {type(sampler).__name__} is"
            " not one: set workers = 1"
        )
    async with AsyncExitStack() as stack:
        try:
            sessions, _ = await stack.enter_async_context(
                open_gateway_workers(
                    settings.workers,
                    renderer=Component(plan.renderer.name, plan.renderer.options),
                    sampler=sampler,
                    sampler_name=plan.sampler.name if plan.sampler is not None else "",
                    store=components.trace_store,
                    cumulative=settings.token_mode == "cumulative",
                    max_prompt_tokens=settings.max_prompt_tokens,
                    host=settings.host,
                    port=settings.port,
                )
            )
        except OSError as exc:
            raise gateway_bind_error(
                exc, host=settings.host, port=settings.port, plan_path=plan_path
            ) from None
        if policy is not None:
            policy.followers.append(follower(sessions, sampler))
        yield sessions, sessions.traces, sessions.take_calls
