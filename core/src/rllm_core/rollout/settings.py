"""How a rollout batch runs: group size, concurrency, retries and deadlines."""

from __future__ import annotations

from dataclasses import dataclass

from rllm_core.types import SamplingParams

__all__ = ["RolloutSettings"]


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
    """

    group_size: int
    max_concurrency: int
    max_infra_retries: int
    enforced: SamplingParams | None = None
    deadline_margin_s: float = 60.0
    close_timeout_s: float = 30.0
    cancel_timeout_s: float = 30.0
    retry_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {self.group_size}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        if self.max_infra_retries < 0:
            raise ValueError(f"max_infra_retries must be 0 or more, got {self.max_infra_retries}")
        for name in ("deadline_margin_s", "close_timeout_s", "cancel_timeout_s", "retry_delay_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"{name} must be 0 or more seconds, got {value}")
