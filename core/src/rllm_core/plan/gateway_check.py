"""What ``plan check`` refuses of ``[gateway].workers``: any value above 1 in a run.

Several gateway processes behind a session-sharding front (``rllm-core gateway serve
--workers N``, :mod:`rllm_core.gateway.shards`) can only serve a sampler they reach over HTTP,
each building its own client of it. So ``workers > 1`` is refused, with the reason that fits
the plan's sampler:

- no ``[sampler]``: the run samples from the trainer backend's own sampler, which lives in the
  run's process (the torch backend's model, a managed backend's client session) and cannot be
  shared with other processes;
- a ``[sampler]`` (the vLLM servers of ``sampler:vllm``): the servers could be shared, but a
  run does not start gateway worker processes yet. Its rollouts configure (seed, enforced
  ``[sampling]``), open and release sessions and read their traces through the gateway object
  in the run's process, and the policy sync switches the sampler's served adapter in that
  process only.

Each hint says what to do: ``workers = 1`` for the run, and ``gateway serve --workers N`` for
sharding a gateway over vLLM servers outside a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rllm_core.errors import PlanIssue
from rllm_core.plan.schema import Plan

__all__ = ["gateway_issues"]

_OUTSIDE_A_RUN = (
    "`rllm-core gateway serve --workers N --upstream URL` shards a gateway over vLLM servers"
    " outside a run"
)


def gateway_issues(plan: Plan, components: Mapping[str, Any], path: str) -> list[PlanIssue]:
    """The issues of ``plan``'s ``[gateway].workers`` against the sampler its run would use;
    ``components`` maps a section (``[sampler]``, ``[trainer]``) to its resolved component."""
    workers = plan.gateway.workers
    if workers == 1:
        return []
    sampler = components.get("[sampler]")
    if sampler is None:
        trainer = components.get("[trainer]")
        owner = f"trainer backend {trainer.name!r}" if trainer is not None else "the trainer"
        message = (
            f"[gateway] workers = {workers} asks for {workers} gateway processes, but the run"
            f" samples from the sampler of {owner} (no [sampler] section), which lives in the"
            " run's process and cannot be shared with other gateway processes"
        )
        hint = (
            "set [gateway] workers = 1 (or remove the key); a vLLM [sampler] is reachable over"
            f" HTTP, but a run does not start gateway worker processes yet; {_OUTSIDE_A_RUN}"
        )
    else:
        message = (
            f"[gateway] workers = {workers} asks for {workers} gateway processes; sampler"
            f" {sampler.name!r} is reachable over HTTP, but a run does not start gateway worker"
            " processes yet: its rollouts open, seed and release sessions and read their"
            " traces through the one gateway in the run's process"
        )
        hint = f"set [gateway] workers = 1 (or remove the key); {_OUTSIDE_A_RUN}"
    return [
        PlanIssue(
            path=path, section="gateway", key="workers", value=workers, message=message, hint=hint
        )
    ]
