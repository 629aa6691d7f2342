"""Metrics lines of steps that scored and trained nothing, for tests of the timing and
system figures ``step_metrics`` adds."""

from __future__ import annotations

from typing import Any

from rllm_core.run.metrics import step_metrics


def empty_step_metrics(*, step: int, rollout_s: float, **timings: Any) -> dict:
    """``step_metrics`` of a step with no episodes, failures, datums or train results;
    ``timings`` holds ``train_s``, ``step_s``, ``weight_version`` and any optional figure."""
    return step_metrics(
        step=step,
        episodes=[],
        infra_failures=0,
        retries=0,
        report={},
        datums=[],
        train={},
        rollout_s=rollout_s,
        **timings,
    )
