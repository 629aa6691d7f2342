"""How a rollout batch runs: group size, concurrency, retries and deadlines."""

from __future__ import annotations

from dataclasses import dataclass, field

from rllm_core.types import DEFAULT_MASK, SamplingParams, Termination

__all__ = ["RolloutSettings", "known_mask_reasons"]


@dataclass(frozen=True)
class RolloutSettings:
    """Settings of :class:`~rllm_core.rollout.RolloutRunner`.

    - ``group_size``: rollouts per task (one group per task).
    - ``max_concurrency``: rollouts in flight at once over the whole batch.
    - ``max_infra_retries``: extra attempts after an infrastructure failure; a rollout runs at
      most ``1 + max_infra_retries`` times before it is excluded.
    - ``enforced``: sampling settings every session enforces (``gateway.configure_session``);
      ``None`` leaves them to the harness's requests.
    - ``deadline_margin_s``: added to ``task.agent_timeout_s`` for the harness's overall
      deadline, and to ``task.verifier_timeout_s`` for grading's.
    - ``close_timeout_s``: how long closing one sandbox may take before it is abandoned.
    - ``cancel_timeout_s``: after a cancellation, how long ``run`` waits for in-flight
      rollouts to clean up before it raises anyway.
    - ``retry_delay_s``: pause before a retried attempt.
    - ``mask``: the infrastructure reasons (:data:`~rllm_core.types.DEFAULT_MASK`, all of
      them by default) whose attempts are masked: retried, then excluded. An attempt that
      ends with an infrastructure reason left out of it is scored as the policy's failure,
      not retried (see :class:`~rllm_core.rollout.attempt.AttemptRunner`).
    - ``max_verifier_timeouts``: stop (raise
      :class:`~rllm_core.rollout.TooManyVerifierTimeouts`) once more attempts than this ended
      ``verifier_timeout`` over the runner's life; ``None``: no limit.
    """

    group_size: int
    max_concurrency: int
    max_infra_retries: int
    enforced: SamplingParams | None = None
    deadline_margin_s: float = 60.0
    close_timeout_s: float = 30.0
    cancel_timeout_s: float = 30.0
    retry_delay_s: float = 0.0
    mask: frozenset[Termination] = field(default=DEFAULT_MASK)
    max_verifier_timeouts: int | None = None

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {self.group_size}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        if self.max_infra_retries < 0:
            raise ValueError(f"max_infra_retries must be 0 or more, got {self.max_infra_retries}")
        policy = sorted(str(reason) for reason in self.mask if not reason.is_infrastructure)
        if policy:
            raise ValueError(
                f"mask holds {', '.join(policy)}, the policy's own reason(s), which are always"
                f" scored; a mask names infrastructure reasons only: {known_mask_reasons()}"
            )
        if self.max_verifier_timeouts is not None and self.max_verifier_timeouts < 0:
            raise ValueError(
                f"max_verifier_timeouts must be 0 or more, got {self.max_verifier_timeouts}"
            )
        for name in ("deadline_margin_s", "close_timeout_s", "cancel_timeout_s", "retry_delay_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"{name} must be 0 or more seconds, got {value}")


def known_mask_reasons() -> str:
    """The reasons a mask may name, comma-separated, in declaration order."""
    return ", ".join(str(reason) for reason in Termination if reason.is_infrastructure)
