"""Traces -> trajectories -> datums: the prefix merge.

A trajectory is the ordered steps of one lineage. Consecutive steps whose prompt extends what
came before are one sequence for training, so they merge into one :class:`~rllm_core.types.Datum`
with the tokens ``[prompt0, completion0, delta1, completion1, ...]``:

- step ``k`` extends the current datum when its prompt starts with every token of the datum so
  far; the rest of its prompt is ``delta_k``, the environment's reply (tool or terminal output);
- a step that does not extend (a reset, a compacted context, a fork) closes the datum and
  starts a new one with its full prompt.

Masks and per-token values, by kind of token:

- the datum's first prompt: in neither mask, logprob 0.0, advantage 0.0;
- a prompt delta: ``observation_mask``, logprob 0.0, advantage 0.0;
- a completion: ``action_mask``, the sampler's logprob, the trajectory's advantage.

The rule looks at tokens only: a completion cut off by ``finish_reason="length"`` and bridged
into the next prompt is a plain extension when the next prompt starts with the datum's tokens.
Pure Python over lists; no torch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rllm_core.types import HISTORY_REASONS, Datum, Step, Trace, Trajectory

__all__ = [
    "HISTORY_BREAK_REASONS",
    "count_history_breaks",
    "count_incomplete_chains",
    "count_tool_calls",
    "merge_trajectory",
    "trajectories_from_traces",
]

logger = logging.getLogger("rllm_core.algorithms")

HISTORY_BREAK_REASONS = HISTORY_REASONS
"""The ``reset_reason`` values of a call whose messages rewrote the lineage's history (see
:mod:`rllm_core.gateway.history`)."""


class _Segment:
    """The datum being built: parallel per-token lists plus the steps that made them."""

    __slots__ = ("action", "advantages", "logprobs", "observation", "steps", "tokens")

    def __init__(self, prompt: list[int]) -> None:
        self.tokens: list[int] = list(prompt)
        self.logprobs: list[float] = [0.0] * len(prompt)
        self.advantages: list[float] = [0.0] * len(prompt)
        self.action: list[bool] = [False] * len(prompt)
        self.observation: list[bool] = [False] * len(prompt)
        self.steps: list[Step] = []

    def extended_by(self, prompt: list[int]) -> bool:
        n = len(self.tokens)
        return len(prompt) >= n and prompt[:n] == self.tokens

    def add_observation(self, delta: list[int]) -> None:
        self.tokens.extend(delta)
        self.logprobs.extend([0.0] * len(delta))
        self.advantages.extend([0.0] * len(delta))
        self.action.extend([False] * len(delta))
        self.observation.extend([True] * len(delta))

    def add_completion(self, step: Step, advantage: float) -> None:
        n = len(step.completion_token_ids)
        self.tokens.extend(step.completion_token_ids)
        self.logprobs.extend(float(value) for value in step.logprobs)
        self.advantages.extend([advantage] * n)
        self.action.extend([True] * n)
        self.observation.extend([False] * n)
        self.steps.append(step)

    def datum(self, lineage_id: str, segment: int, metadata: Mapping[str, Any]) -> Datum:
        versions = [step.weight_version for step in self.steps]
        return Datum(
            token_ids=self.tokens,
            logprobs=self.logprobs,
            advantages=self.advantages,
            action_mask=self.action,
            observation_mask=self.observation,
            metadata={
                **metadata,
                "lineage_id": lineage_id,
                "segment": segment,
                "trace_ids": [step.trace_id for step in self.steps],
                "steps": len(self.steps),
                "min_weight_version": min(versions),
                "max_weight_version": max(versions),
                "finish_reasons": [step.finish_reason for step in self.steps],
            },
        )


def merge_trajectory(
    trajectory: Trajectory, advantage: float, *, metadata: Mapping[str, Any] | None = None
) -> list[Datum]:
    """Prefix-merge the steps of one trajectory into datums, in step order.

    Every completion token carries ``advantage`` and its step's sampler logprob; every other
    token carries 0.0 for both. The first prompt of each datum is in neither mask; each later
    prompt delta is in ``observation_mask``; completions are in ``action_mask``. An empty
    completion adds no token, and the next step may still extend the datum.

    Each datum's ``metadata`` holds ``metadata`` (the caller's provenance: episode, group,
    task) plus ``lineage_id``, ``segment`` (its index among this trajectory's datums),
    ``trace_ids`` and ``finish_reasons`` of its steps in order, ``steps`` (their number) and
    ``min_weight_version`` / ``max_weight_version``. A trajectory without steps gives ``[]``.

    Raises ``ValueError`` when ``advantage`` is not finite or a step's logprobs do not match
    its completion one for one.
    """
    advantage = float(advantage)
    if not math.isfinite(advantage):
        raise ValueError(
            f"advantage {advantage!r} for lineage {trajectory.lineage_id!r} is not finite;"
            " check the advantage estimator and the rewards it was given"
        )
    base = dict(metadata or {})
    datums: list[Datum] = []
    current: _Segment | None = None
    for step in trajectory.steps:
        if len(step.logprobs) != len(step.completion_token_ids):
            raise ValueError(
                f"step {step.trace_id!r} of lineage {trajectory.lineage_id!r} has"
                f" {len(step.logprobs)} logprobs for {len(step.completion_token_ids)} completion"
                " tokens; the sampler must return one logprob per sampled token"
            )
        prompt = step.prompt_token_ids
        if current is not None and current.extended_by(prompt):
            current.add_observation(prompt[len(current.tokens) :])
        else:
            if current is not None:
                datums.append(current.datum(trajectory.lineage_id, len(datums), base))
            current = _Segment(prompt)
        current.add_completion(step, advantage)
    if current is not None:
        datums.append(current.datum(trajectory.lineage_id, len(datums), base))
    return datums


def count_incomplete_chains(traces: Iterable[Trace]) -> int:
    """How many traces have a missing ancestor (an episode's
    ``trace_counts.incomplete_chains``, which the group report counts)."""
    return sum(1 for trace in traces if not trace.chain_complete)


def count_history_breaks(traces: Iterable[Trace]) -> dict[str, int]:
    """How many model calls broke their lineage's history, by reason (the traces'
    ``reset_reason`` among :data:`HISTORY_BREAK_REASONS`): an episode's
    ``trace_counts.history_breaks``, which the step's metrics count."""
    counts: dict[str, int] = {}
    for trace in traces:
        reason = trace.record.reset_reason
        if reason in HISTORY_BREAK_REASONS:
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def count_tool_calls(traces: Iterable[Trace]) -> tuple[int, int]:
    """The ``ok`` tool calls of the traces' replies (the last message of each
    ``messages_delta``) and how many traces carry the flag ``tool_call_invalid``: an
    episode's ``trace_counts.tool_calls`` and ``tool_calls_invalid``."""
    ok = invalid = 0
    for trace in traces:
        delta = trace.record.messages_delta
        if delta and delta[-1].role == "assistant":
            ok += len(delta[-1].tool_calls)
        if "tool_call_invalid" in trace.record.flags:
            invalid += 1
    return ok, invalid


def trajectories_from_traces(traces: Sequence[Trace]) -> tuple[Trajectory, ...]:
    """Rebuild a session's trajectories from its traces (full prompts already rebuilt).

    Traces are grouped by ``lineage_id``; trajectories come sorted by lineage id (as a
    string), steps by ``turn``, with ``created_at`` then ``trace_id`` breaking ties between
    forks, so the result does not depend on the order of ``traces``. A trace whose
    ``chain_complete`` is false holds a prompt that could not be proven and is never trained
    on: it is left out, and one WARNING names every trace left out. A lineage with no complete
    trace yields no trajectory. Each trajectory's ``reward`` is left at its default; the episode
    carries the reward.
    """
    lineages: dict[str, list[Trace]] = {}
    incomplete: list[Trace] = []
    for trace in traces:
        if trace.chain_complete:
            lineages.setdefault(trace.record.lineage_id, []).append(trace)
        else:
            incomplete.append(trace)
    if incomplete:
        incomplete.sort(key=lambda t: (t.record.session_id, t.record.lineage_id, t.record.turn))
        logger.warning(
            "left out %d trace(s) with a missing ancestor, never trained on: %s; check that the"
            " trace store received every record of these sessions",
            len(incomplete),
            ", ".join(
                f"{t.record.trace_id} (session {t.record.session_id},"
                f" lineage {t.record.lineage_id}, turn {t.record.turn})"
                for t in incomplete
            ),
        )
    trajectories: list[Trajectory] = []
    for lineage_id in sorted(lineages):
        ordered = sorted(
            lineages[lineage_id],
            key=lambda t: (t.record.turn, t.record.created_at, t.record.trace_id),
        )
        steps = tuple(
            Step(
                trace_id=t.record.trace_id,
                prompt_token_ids=list(t.prompt_token_ids),
                completion_token_ids=list(t.record.completion_token_ids),
                logprobs=list(t.record.logprobs),
                finish_reason=t.record.finish_reason,
                weight_version=t.record.weight_version,
            )
            for t in ordered
        )
        trajectories.append(Trajectory(lineage_id=lineage_id, steps=steps))
    return tuple(trajectories)
