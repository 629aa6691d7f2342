"""What ``plan check`` refuses of ``[gateway].workers`` above 1 in a run.

A run with ``workers = N`` starts N gateway processes behind a session-sharding front
(:mod:`rllm_core.rollout.gateway_workers`); each sends its sessions' model calls to the plan's
sampler through a client of its own. That is refused, with the reason, when:

- the plan has no ``[sampler]``: the run samples from the trainer backend's own sampler, which
  lives in the run's process (the torch backend's model, a managed backend's client session)
  and cannot be reached from other processes;
- the ``[sampler]``'s component is not ``shared`` (its spec trait, a
  :class:`~rllm_core.ports.SharedPool`): it offers no client for other processes;
- the plan has convertible nodes (``[scheduler].nodes``): lending a node drains its server on
  the run's own client, and the workers' clients would keep sending to it.

Each hint says what to do: ``workers = 1``, or what would make the plan's workers possible.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rllm_core.errors import PlanIssue
from rllm_core.plan.schema import Plan

__all__ = ["gateway_issues"]


def gateway_issues(plan: Plan, components: Mapping[str, Any], path: str) -> list[PlanIssue]:
    """The issues of ``plan``'s ``[gateway].workers`` against the sampler its run would use;
    ``components`` maps a section (``[sampler]``, ``[trainer]``) to its resolved component."""
    workers = plan.gateway.workers
    if workers == 1:
        return []
    sampler = components.get("[sampler]")
    keep_one = "set [gateway] workers = 1 (or remove the key)"
    if sampler is None:
        trainer = components.get("[trainer]")
        owner = f"trainer backend {trainer.name!r}" if trainer is not None else "the trainer"
        message = (
            f"[gateway] workers = {workers} asks for {workers} gateway processes, but the run"
            f" samples from the sampler of {owner} (no [sampler] section), which lives in the"
            " run's process and cannot be reached from other gateway processes"
        )
        hint = f"{keep_one}, or add a [sampler] whose model servers other processes can reach"
        hint += ' (name = "vllm")'
    elif not sampler.spec.trait("shared"):
        message = (
            f"[gateway] workers = {workers} asks for {workers} gateway processes, but sampler"
            f" {sampler.name!r} offers no client for other processes (its spec is not"
            " 'shared', a rllm_core.ports.SharedPool)"
        )
        hint = f'{keep_one}, or use a sampler that is shared (name = "vllm")'
    elif plan.scheduler.nodes:
        message = (
            f"[gateway] workers = {workers} cannot go with convertible nodes ([scheduler]"
            " nodes): lending a node drains its server on the run's own sampler, while each"
            " gateway worker sends through a client of its own that would keep using it"
        )
        hint = f"{keep_one}, or remove [scheduler] nodes"
    else:
        return []
    return [
        PlanIssue(
            path=path, section="gateway", key="workers", value=workers, message=message, hint=hint
        )
    ]
