"""What a rollout batch produces: the batch, its infrastructure failures and live events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rllm_core.types import Episode, Termination

__all__ = ["EventKind", "InfraFailure", "RolloutBatch", "RolloutEvent"]

EventKind = Literal["started", "finished", "retried", "failed"]


@dataclass(frozen=True)
class InfraFailure:
    """A rollout excluded after its last attempt failed on infrastructure.

    ``index`` is the rollout's place in its group, ``attempt`` the last attempt (0-based, so
    ``attempt == max_infra_retries``), ``termination`` ``sandbox_error``, ``verifier_error``
    or ``model_error`` (the model server failed), ``error`` what went wrong.
    """

    task_id: str
    index: int
    attempt: int
    termination: Termination
    error: str
    session_id: str = ""


@dataclass
class RolloutBatch:
    """The result of :meth:`~rllm_core.rollout.RolloutRunner.run`.

    ``groups[k]`` holds the scored episodes of ``tasks[k]`` in rollout order (an empty list
    when every rollout of the task failed on infrastructure); infrastructure failures are in
    ``infra_failures`` and never in ``groups``. ``retries`` counts retried attempts,
    ``wall_s`` the batch's duration and ``episodes_done`` the scored episodes.
    """

    groups: list[list[Episode]]
    infra_failures: list[InfraFailure] = field(default_factory=list)
    retries: int = 0
    wall_s: float = 0.0
    episodes_done: int = 0


@dataclass(frozen=True)
class RolloutEvent:
    """One thing that happened to one rollout, for live displays.

    ``kind``: ``started`` (an attempt began), ``finished`` (scored; ``reward`` and
    ``termination`` set), ``retried`` (an attempt failed on infrastructure and will run again;
    ``termination`` and ``error`` set) or ``failed`` (excluded after its last attempt).
    ``done`` counts rollouts finished or failed so far in the batch (this one included),
    ``total`` the batch's rollouts (tasks times group size).
    """

    kind: EventKind
    task_id: str
    index: int
    attempt: int
    session_id: str
    step: int
    done: int
    total: int
    reward: float | None = None
    termination: Termination | None = None
    error: str | None = None
