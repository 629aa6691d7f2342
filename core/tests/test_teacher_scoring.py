"""TeacherScoring: a built batch's advantages replaced with per-token ones from a teacher's
logprobs, the distillation metrics over action tokens, and the contract checks."""

from __future__ import annotations

import pytest
from rllm_core.algorithms import DatumBuilder
from rllm_core.algorithms.distill import TeacherScoring
from rllm_core.ports import AdvantageResult
from rllm_core.types import Episode, Step, Trajectory

# Prompt [1, 2], completion [3, 4] (-0.5, -1.0), observation [5], completion [6] (-2.0).
STEPS = (
    Step(trace_id="a", prompt_token_ids=[1, 2], completion_token_ids=[3, 4], logprobs=[-0.5, -1.0]),
    Step(trace_id="b", prompt_token_ids=[1, 2, 3, 4, 5], completion_token_ids=[6], logprobs=[-2.0]),
)
TEACHER = [0.0, -9.0, -0.25, -3.0, -7.0, -1.5]


class Zero:
    def compute(self, rewards):
        return AdvantageResult(advantages=[[0.0] * len(group) for group in rewards])


class TeacherMinusStudent(Zero):
    def token_advantages(self, datums, teacher_logprobs):
        return [
            [t - s if a else 0.0 for t, s, a in zip(row, d.logprobs, d.action_mask, strict=True)]
            for d, row in zip(datums, teacher_logprobs, strict=True)
        ]


class Leaky(Zero):
    def token_advantages(self, datums, teacher_logprobs):
        return [[1.0] * len(d.token_ids) for d in datums]


class Scorer:
    def __init__(self, rows):
        self.rows = rows
        self.calls = 0

    def compute_logprobs(self, datums):
        self.calls += 1
        return [list(self.rows) for _ in datums]


def batch():
    episode = Episode(
        episode_id="e",
        group_id="g",
        task_id="t",
        session_id="s",
        reward=1.0,
        trajectories=(Trajectory(lineage_id="l", steps=STEPS),),
    )
    return DatumBuilder(Zero()).build([[episode]])


def test_advantages_and_metrics_cover_the_sampled_tokens_only():
    scorer = Scorer(TEACHER)
    scored, metrics = TeacherScoring(TeacherMinusStudent(), scorer).score(batch())
    (datum,) = scored.datums
    assert datum.observation_mask == [False, False, False, False, True, False]
    assert datum.advantages == [0.0, 0.0, 0.25, -2.0, 0.0, 0.5]
    assert scorer.calls == 1
    # student - teacher over the 3 sampled tokens: (-0.25 + 2.0 - 0.5) / 3
    assert metrics["distill/reverse_kl"] == pytest.approx(1.25 / 3)
    assert metrics["distill/teacher_logprob_mean"] == pytest.approx(-4.75 / 3)


def test_a_teacher_of_another_length_is_refused():
    with pytest.raises(ValueError, match="teacher returned logprobs of lengths"):
        TeacherScoring(TeacherMinusStudent(), Scorer(TEACHER[:-1])).score(batch())


def test_an_advantage_off_the_action_mask_is_refused():
    with pytest.raises(ValueError, match="and 0 off the action mask"):
        TeacherScoring(Leaky(), Scorer(TEACHER)).score(batch())
