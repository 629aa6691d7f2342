"""Tool calls counted per episode from the traces (the replies' well-formed calls, the model
calls flagged ``tool_call_invalid``) and summed into the step's ``tools/calls`` and
``tools/invalid``."""

from __future__ import annotations

from rllm_core.algorithms import count_tool_calls
from rllm_core.run.metrics import rollout_metrics
from rllm_core.types import Episode, Message, ToolCall, Trace, TraceCounts, TraceRecord


def _trace(turn: int, calls: int, flags: tuple[str, ...] = ()) -> Trace:
    reply = Message(
        role="assistant",
        content="",
        tool_calls=tuple(ToolCall(id=f"c{n}", name="f", arguments="{}") for n in range(calls)),
    )
    record = TraceRecord(
        trace_id=f"t{turn}",
        session_id="s",
        lineage_id="main",
        turn=turn,
        prompt_delta_token_ids=[1],
        completion_token_ids=[2],
        logprobs=[-0.5],
        messages_delta=(Message(role="user", content="go"), reply),
        flags=flags,
    )
    return Trace(record=record, prompt_token_ids=[1])


def test_ok_calls_and_flagged_model_calls_are_counted_from_the_traces():
    traces = [
        _trace(0, 2),
        _trace(1, 0, ("tool_call_invalid",)),
        _trace(2, 1, ("tool_call_invalid", "tool_choice_unmet")),
        _trace(3, 0),
    ]
    assert count_tool_calls(traces) == (3, 2)
    assert count_tool_calls([]) == (0, 0)


def test_step_metrics_sum_them_over_the_episodes():
    episodes = [
        Episode(
            episode_id=f"e{n}",
            task_id="t",
            group_id="g",
            session_id=f"s{n}",
            trajectories=(),
            reward=0.0,
            trace_counts=TraceCounts(tool_calls=calls, tool_calls_invalid=invalid),
        )
        for n, (calls, invalid) in enumerate([(3, 1), (0, 2), (0, 0)])
    ]
    line = rollout_metrics(episodes=episodes, infra_failures=0, retries=0, report={}, rollout_s=1.0)
    assert (line["tools/calls"], line["tools/invalid"]) == (3.0, 3.0)
