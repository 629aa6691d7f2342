"""A ``RolloutRunner`` on a real ``Gateway`` over the toy renderer, as rollout tests open it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from reference.toy_renderer import ToyChatRenderer
from rllm_core.gateway.server import Gateway
from rllm_core.rollout import RolloutEvent, RolloutRunner, RolloutSettings
from rllm_core.testing.samplers import ScriptedSampler


@asynccontextmanager
async def gateway_runner(
    *,
    renderer: ToyChatRenderer,
    source: Any,
    harness: Any,
    backend: Any,
    store: Any,
    settings: RolloutSettings,
    sampler: ScriptedSampler | None = None,
    run_id: str = "run-1",
    on_event: Callable[[RolloutEvent], None] | None = None,
) -> AsyncIterator[tuple[RolloutRunner, Gateway]]:
    """The runner and its gateway, open for the ``async with`` block; the sampler answers
    ``x`` to every request unless given."""
    sampler = sampler if sampler is not None else ScriptedSampler(lambda r: "x", renderer=renderer)
    async with Gateway(renderer=renderer, sampler=sampler, trace_store=store) as gateway:
        runner = RolloutRunner(
            task_source=source,
            harness=harness,
            sandbox_backend=backend,
            gateway=gateway,
            trace_store=store,
            settings=settings,
            run_id=run_id,
            on_event=on_event,
        )
        yield runner, gateway
