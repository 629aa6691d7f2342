"""History breaks (an agent truncating or summarizing its context) counted per episode from the
traces and summed by reason into the step's metrics."""

from __future__ import annotations

from rllm_core.algorithms import (
    HISTORY_BREAK_REASONS,
    count_history_breaks,
)
from rllm_core.run.metrics import rollout_metrics
from rllm_core.types import Episode, Trace, TraceCounts, TraceRecord


def _trace(turn: int, reason: str | None, lineage: str = "main") -> Trace:
    record = TraceRecord(
        trace_id=f"t{lineage}{turn}",
        session_id="s",
        lineage_id=lineage,
        turn=turn,
        prompt_delta_token_ids=[1, 2],
        completion_token_ids=[3],
        logprobs=[-0.5],
        reset_reason=reason,
    )
    return Trace(record=record, prompt_token_ids=[1, 2])


def _episode(breaks: dict[str, int] | None) -> Episode:
    counts = TraceCounts() if breaks is None else TraceCounts(history_breaks=breaks)
    return Episode(
        episode_id="e",
        task_id="t",
        group_id="g",
        session_id="s",
        trajectories=(),
        reward=1.0,
        trace_counts=counts,
    )


def test_only_history_reasons_are_counted_by_reason():
    traces = [
        _trace(0, None),
        _trace(1, "history_summarized"),
        _trace(2, None),
        _trace(3, "history_truncated"),
        _trace(4, "history_summarized"),
        _trace(0, "tools_changed", lineage="other"),
        _trace(1, "empty_delta", lineage="other"),
    ]
    assert count_history_breaks(traces) == {"history_summarized": 2, "history_truncated": 1}
    assert count_history_breaks([_trace(0, None)]) == {}


def test_step_metrics_sum_each_reason_over_the_episodes_and_report_zero_for_the_rest():
    episodes = [
        _episode({"history_summarized": 2}),
        _episode({"history_summarized": 1, "history_edited": 1}),
        _episode(None),  # an episode recorded before the key existed
    ]
    line = rollout_metrics(episodes=episodes, infra_failures=0, retries=0, report={}, rollout_s=1.0)
    assert line["resets/history_summarized"] == 3.0
    assert line["resets/history_edited"] == 1.0
    assert line["resets/history_truncated"] == 0.0
    assert {f"resets/{reason}" for reason in HISTORY_BREAK_REASONS} <= set(line)
