"""Prefix merge, traces to trajectories, and the group builder, with hand-built token lists."""

from __future__ import annotations

import doctest
import itertools
import logging
import math
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rllm_core.algorithms import (
    DatumBuilder,
    count_incomplete_chains,
    merge_trajectory,
    trajectories_from_traces,
)
from rllm_core.ports import AdvantageEstimator, AdvantageResult
from rllm_core.types import (
    Episode,
    Step,
    Termination,
    Trace,
    TraceCounts,
    TraceRecord,
    Trajectory,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "algorithms" / "datums.md"

F, T = False, True


def step(
    trace_id: str,
    prompt: list[int],
    completion: list[int],
    logprobs: list[float] | None = None,
    *,
    finish: str = "stop",
    version: int = 0,
) -> Step:
    return Step(
        trace_id=trace_id,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-1.0] * len(completion) if logprobs is None else logprobs,
        finish_reason=finish,
        weight_version=version,
    )


def trajectory(*steps: Step, lineage: str = "main") -> Trajectory:
    return Trajectory(lineage_id=lineage, steps=steps)


# ------------------------------------------------------------------------------ prefix merge


def test_extending_steps_merge_into_one_datum_with_exact_masks():
    steps = (
        step("t0", [1, 2, 3], [10, 11], [-0.1, -0.2], version=3),
        step("t1", [1, 2, 3, 10, 11, 4, 5], [12, 13], [-0.3, -0.4], version=4),
        step("t2", [1, 2, 3, 10, 11, 4, 5, 12, 13, 6], [14], [-0.5], version=4, finish="length"),
    )
    [datum] = merge_trajectory(trajectory(*steps), 2.0)
    assert datum.token_ids == [1, 2, 3, 10, 11, 4, 5, 12, 13, 6, 14]
    assert datum.action_mask == [F, F, F, T, T, F, F, T, T, F, T]
    assert datum.observation_mask == [F, F, F, F, F, T, T, F, F, T, F]
    assert datum.logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3, -0.4, 0.0, -0.5]
    assert datum.advantages == [0.0, 0.0, 0.0, 2.0, 2.0, 0.0, 0.0, 2.0, 2.0, 0.0, 2.0]
    assert datum.metadata == {
        "lineage_id": "main",
        "segment": 0,
        "trace_ids": ["t0", "t1", "t2"],
        "steps": 3,
        "min_weight_version": 3,
        "max_weight_version": 4,
        "finish_reasons": ["stop", "stop", "length"],
    }


def test_non_extending_step_starts_a_new_datum_that_later_steps_join():
    steps = (
        step("t0", [1, 2], [10]),
        step("t1", [1, 3], [11]),  # diverges from [1, 2, 10]
        step("t2", [1, 3, 11, 7], [12]),  # extends the second datum
    )
    first, second = merge_trajectory(trajectory(*steps), 1.0)
    assert first.token_ids == [1, 2, 10]
    assert first.action_mask == [F, F, T]
    assert first.observation_mask == [F, F, F]
    assert second.token_ids == [1, 3, 11, 7, 12]
    assert second.action_mask == [F, F, T, F, T]
    assert second.observation_mask == [F, F, F, T, F]
    assert (first.metadata["segment"], second.metadata["segment"]) == (0, 1)
    assert (first.metadata["trace_ids"], second.metadata["trace_ids"]) == (["t0"], ["t1", "t2"])


def test_first_prompt_of_every_datum_is_in_neither_mask():
    steps = (step("t0", [5, 6, 7], [8]), step("t1", [9, 9, 9, 9], [8]))
    datums = merge_trajectory(trajectory(*steps), 1.0)
    assert [d.token_ids for d in datums] == [[5, 6, 7, 8], [9, 9, 9, 9, 8]]
    for datum in datums:
        prompt_length = len(datum.token_ids) - 1
        assert datum.action_mask[:prompt_length] == [F] * prompt_length
        assert datum.observation_mask[:prompt_length] == [F] * prompt_length


def test_a_prompt_shorter_than_the_datum_starts_a_new_one():
    # A retry of the same prompt (a fork) is a prefix of the datum but does not extend it.
    steps = (step("t0", [1, 2], [10]), step("t1", [1, 2], [11]))
    datums = merge_trajectory(trajectory(*steps), 1.0)
    assert [d.token_ids for d in datums] == [[1, 2, 10], [1, 2, 11]]


def test_prompt_equal_to_the_datum_extends_with_an_empty_delta():
    steps = (step("t0", [1, 2], [10]), step("t1", [1, 2, 10], [11]))
    [datum] = merge_trajectory(trajectory(*steps), 1.0)
    assert datum.token_ids == [1, 2, 10, 11]
    assert datum.action_mask == [F, F, T, T]
    assert datum.observation_mask == [F, F, F, F]


def test_length_truncated_completion_followed_by_an_extending_prompt_merges():
    # The renderer closed the cut-off turn with token 20 before the tool output [4].
    steps = (
        step("t0", [1, 2], [10, 11], [-0.5, -0.25], finish="length"),
        step("t1", [1, 2, 10, 11, 20, 4], [12], [-2.0]),
    )
    [datum] = merge_trajectory(trajectory(*steps), -1.5)
    assert datum.token_ids == [1, 2, 10, 11, 20, 4, 12]
    assert datum.action_mask == [F, F, T, T, F, F, T]
    assert datum.observation_mask == [F, F, F, F, T, T, F]
    assert datum.logprobs == [0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -2.0]
    assert datum.advantages == [0.0, 0.0, -1.5, -1.5, 0.0, 0.0, -1.5]
    assert datum.metadata["finish_reasons"] == ["length", "stop"]


def test_length_truncated_completion_that_the_next_prompt_rewrites_starts_a_new_datum():
    steps = (
        step("t0", [1, 2], [10, 11], finish="length"),
        step("t1", [1, 2, 10, 30, 4], [12]),  # token 11 was re-encoded as 30
    )
    datums = merge_trajectory(trajectory(*steps), 1.0)
    assert [d.token_ids for d in datums] == [[1, 2, 10, 11], [1, 2, 10, 30, 4, 12]]
    assert datums[1].action_mask == [F, F, F, F, F, T]
    assert datums[1].observation_mask == [F] * 6


def test_empty_completion_adds_no_token_and_can_be_extended():
    steps = (step("t0", [1, 2], [], []), step("t1", [1, 2, 3], [10], [-0.5]))
    [datum] = merge_trajectory(trajectory(*steps), 1.0)
    assert datum.token_ids == [1, 2, 3, 10]
    assert datum.action_mask == [F, F, F, T]
    assert datum.observation_mask == [F, F, T, F]
    assert datum.logprobs == [0.0, 0.0, 0.0, -0.5]
    assert datum.metadata["steps"] == 2


def test_single_empty_completion_gives_a_datum_without_action_tokens():
    [datum] = merge_trajectory(trajectory(step("t0", [1, 2], [], [])), 1.0)
    assert datum.token_ids == [1, 2]
    assert datum.action_mask == [F, F]
    assert datum.advantages == [0.0, 0.0]


def test_trajectory_without_steps_gives_no_datum():
    assert merge_trajectory(trajectory(), 1.0) == []


def test_caller_metadata_is_carried_on_every_datum():
    steps = (step("t0", [1], [2]), step("t1", [3], [4]))
    datums = merge_trajectory(trajectory(*steps), 1.0, metadata={"episode_id": "e-1"})
    assert [d.metadata["episode_id"] for d in datums] == ["e-1", "e-1"]


def test_logprob_count_mismatch_names_the_step():
    bad = step("t-bad", [1], [2, 3], [-1.0])
    with pytest.raises(ValueError, match=r"step 't-bad' of lineage 'main' has 1 logprobs for 2"):
        merge_trajectory(trajectory(bad), 1.0)


@pytest.mark.parametrize("advantage", [math.nan, math.inf])
def test_non_finite_advantage_is_refused(advantage):
    with pytest.raises(ValueError, match="is not finite"):
        merge_trajectory(trajectory(step("t0", [1], [2])), advantage)


chains = st.tuples(
    st.lists(st.integers(0, 50_000), max_size=6),
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 50_000), max_size=5),
            st.lists(st.integers(0, 50_000), max_size=5),
        ),
        min_size=1,
        max_size=8,
    ),
)


@settings(max_examples=200, deadline=None)
@given(chains)
def test_property_extending_chain_is_one_datum_of_its_completions(chain):
    first_prompt, turns = chain
    steps = []
    context = list(first_prompt)
    deltas: list[int] = []
    for index, (delta, completion) in enumerate(turns):
        if index:
            context += delta
            deltas += delta
        logprobs = [-(t % 7) / 8 for t in completion]
        steps.append(step(f"t{index}", list(context), completion, logprobs))
        context += completion
    [datum] = merge_trajectory(trajectory(*steps), 0.25)
    actions = [t for t, a in zip(datum.token_ids, datum.action_mask, strict=True) if a]
    observed = [t for t, o in zip(datum.token_ids, datum.observation_mask, strict=True) if o]
    assert actions == [t for _, completion in turns for t in completion]
    assert observed == deltas
    assert datum.token_ids == context
    for s in steps:
        assert datum.token_ids[: len(s.prompt_token_ids)] == s.prompt_token_ids
    assert [lp for lp, a in zip(datum.logprobs, datum.action_mask, strict=True) if a] == [
        lp for s in steps for lp in s.logprobs
    ]
    assert all(
        adv == (0.25 if a else 0.0)
        for adv, a in zip(datum.advantages, datum.action_mask, strict=True)
    )


# ------------------------------------------------------------------ traces to trajectories


def trace(
    trace_id: str,
    prompt: list[int],
    completion: list[int],
    *,
    lineage: str = "main",
    turn: int = 0,
    complete: bool = True,
    created_at: float = 0.0,
    version: int = 0,
) -> Trace:
    record = TraceRecord(
        trace_id=trace_id,
        session_id="s-1",
        lineage_id=lineage,
        turn=turn,
        parent_trace_id=None,
        prompt_delta_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-0.5] * len(completion),
        finish_reason="stop",
        weight_version=version,
        created_at=created_at,
    )
    return Trace(record=record, prompt_token_ids=prompt, chain_complete=complete)


SESSION = [
    trace("m0", [1, 2], [10], turn=0, version=1),
    trace("m1", [1, 2, 10, 3], [11], turn=1, version=2),
    # A fork at turn 2: "m2b" was made first, so it comes first and extends the chain.
    trace("m2a", [1, 2, 10, 3, 11, 4], [12], turn=2, created_at=6.0),
    trace("m2b", [1, 2, 10, 3, 11, 5], [13], turn=2, created_at=5.0),
    trace("s0", [7, 8], [20], lineage="sub", turn=0),
    trace("s1", [7, 8, 20, 9], [21], lineage="sub", turn=1),
]


def test_traces_group_by_lineage_and_order_by_turn():
    main, sub = trajectories_from_traces(SESSION)
    assert main.lineage_id == "main"
    assert [s.trace_id for s in main.steps] == ["m0", "m1", "m2b", "m2a"]
    assert main.steps[1] == Step(
        trace_id="m1",
        prompt_token_ids=[1, 2, 10, 3],
        completion_token_ids=[11],
        logprobs=[-0.5],
        finish_reason="stop",
        weight_version=2,
    )
    assert sub.lineage_id == "sub"
    assert [s.trace_id for s in sub.steps] == ["s0", "s1"]


def test_shuffled_traces_give_the_same_trajectories():
    expected = trajectories_from_traces(SESSION)
    for order in itertools.permutations(SESSION):
        assert trajectories_from_traces(list(order)) == expected


def test_two_lineages_make_separate_datums_even_when_tokens_line_up():
    # The sub-agent's prompt starts with the main datum's tokens; lineages still never merge.
    main = trajectory(step("m0", [1, 2], [10]))
    sub = trajectory(step("s0", [1, 2, 10, 5], [11]), lineage="sub")
    datums = [d for t in (main, sub) for d in merge_trajectory(t, 1.0)]
    assert [(d.metadata["lineage_id"], d.token_ids) for d in datums] == [
        ("main", [1, 2, 10]),
        ("sub", [1, 2, 10, 5, 11]),
    ]
    assert datums[1].observation_mask == [F, F, F, F, F]


def test_session_with_two_lineages_and_a_fork_merges_into_three_datums():
    datums = [d for t in trajectories_from_traces(SESSION) for d in merge_trajectory(t, 1.0)]
    assert [d.token_ids for d in datums] == [
        [1, 2, 10, 3, 11, 5, 13],
        [1, 2, 10, 3, 11, 4, 12],
        [7, 8, 20, 9, 21],
    ]
    assert [d.metadata["trace_ids"] for d in datums] == [["m0", "m1", "m2b"], ["m2a"], ["s0", "s1"]]


def test_traces_with_a_missing_ancestor_are_left_out_and_reported(caplog):
    traces = [
        trace("m0", [1, 2], [10], turn=0),
        trace("m2", [1, 2, 10, 3, 11, 4], [12], turn=2, complete=False),
        trace("m3", [1, 2, 10, 3, 11, 4, 12, 5], [13], turn=3, complete=False),
        trace("s1", [3, 4], [20], lineage="sub", turn=1, complete=False),
    ]
    with caplog.at_level(logging.WARNING, logger="rllm_core.algorithms"):
        [main] = trajectories_from_traces(traces)
    assert [s.trace_id for s in main.steps] == ["m0"]
    assert count_incomplete_chains(traces) == 3
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(
        "left out 3 trace(s) with a missing ancestor, never trained on: "
        "m2 (session s-1, lineage main, turn 2), m3 (session s-1, lineage main, turn 3), "
        "s1 (session s-1, lineage sub, turn 1);"
    )


def test_complete_traces_log_nothing(caplog):
    with caplog.at_level(logging.DEBUG, logger="rllm_core.algorithms"):
        trajectories_from_traces(SESSION)
    assert caplog.records == []
    assert count_incomplete_chains(SESSION) == 0


# ---------------------------------------------------------------------------- group builder


class MeanCentered:
    """``A = r - mean(group)``; records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[list[list[float]]] = []

    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult:
        self.calls.append([list(group) for group in rewards])
        out = [[r - sum(group) / len(group) for r in group] for group in rewards]
        flat = [a for group in out for a in group]
        return AdvantageResult(
            advantages=out,
            zero_variance_groups=sum(1 for g in rewards if len(set(g)) == 1),
            metrics={"max": max(flat, default=0.0)},
        )


def test_mean_centered_estimator_satisfies_the_port():
    assert isinstance(MeanCentered(), AdvantageEstimator)


def one_turn(episode_id: str, first_token: int = 1, *, version: int = 0) -> Trajectory:
    """Two extending steps: tokens [t, 10, 4, 11], one datum, two steps."""
    return trajectory(
        step(f"{episode_id}-0", [first_token], [10], version=version + 1),
        step(f"{episode_id}-1", [first_token, 10, 4], [11], version=version),
    )


def episode(
    episode_id: str,
    reward: float,
    *,
    group: str = "g-1",
    task: str = "t-1",
    termination: Termination = Termination.DONE,
    trajectories: tuple[Trajectory, ...] | None = None,
    incomplete: int = 0,
) -> Episode:
    return Episode(
        episode_id=episode_id,
        task_id=task,
        group_id=group,
        session_id=f"s-{episode_id}",
        trajectories=(one_turn(episode_id),) if trajectories is None else trajectories,
        reward=reward,
        termination=termination,
        trace_counts=TraceCounts(incomplete_chains=incomplete),
    )


def two_groups() -> list[list[Episode]]:
    return [
        [episode("a", 1.0), episode("b", 0.0)],
        [episode("c", 1.0, group="g-2", task="t-2"), episode("d", 1.0, group="g-2", task="t-2")],
    ]


def test_builder_merges_every_episode_with_its_advantage():
    batch = DatumBuilder(MeanCentered()).build(two_groups())
    assert [s.episode_id for s in batch.samples] == ["a", "b", "c", "d"]
    assert [s.group_id for s in batch.samples] == ["g-1", "g-1", "g-2", "g-2"]
    assert [s.reward for s in batch.samples] == [1.0, 0.0, 1.0, 1.0]
    assert [s.sequence for s in batch.samples] == [-1, -1, -1, -1]
    assert [d.advantages for d in batch.datums] == [
        [0.0, 0.5, 0.0, 0.5],
        [0.0, -0.5, 0.0, -0.5],
        [0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0],
    ]
    first = batch.datums[0]
    assert first.token_ids == [1, 10, 4, 11]
    assert first.metadata["episode_id"] == "a"
    assert first.metadata["task_id"] == "t-1"
    assert first.metadata["session_id"] == "s-a"
    assert first.metadata["advantage"] == 0.5
    assert first.metadata["reward"] == 1.0


def test_sample_weight_version_is_the_oldest_step():
    ep = episode("a", 1.0, trajectories=(one_turn("a", version=5),))
    [sample] = DatumBuilder(MeanCentered()).build([[ep, episode("b", 0.0)]]).samples[:1]
    assert sample.weight_version == 5
    assert sample.datum.metadata["max_weight_version"] == 6


def test_zero_variance_group_is_kept_by_default_and_counted():
    report = DatumBuilder(MeanCentered()).build(two_groups()).report
    assert (report.groups, report.zero_variance_groups, report.dropped_groups) == (2, 1, 0)
    assert (report.trajectories, report.steps, report.datums) == (4, 8, 4)
    assert report.steps_per_datum == 2.0


def test_zero_variance_group_is_dropped_when_asked_and_still_counted():
    estimator = MeanCentered()
    batch = DatumBuilder(estimator, drop_zero_variance_groups=True).build(two_groups())
    assert [s.episode_id for s in batch.samples] == ["a", "b"]
    report = batch.report
    assert (report.groups, report.zero_variance_groups, report.dropped_groups) == (2, 1, 1)
    assert (report.trajectories, report.steps, report.datums) == (2, 4, 2)
    # Rewards describe every scored episode, dropped groups included: (1 + 0 + 1 + 1) / 4.
    assert (report.episodes, report.reward_avg, report.reward_min, report.reward_max) == (
        4,
        0.75,
        0.0,
        1.0,
    )
    assert estimator.calls == [[[1.0, 0.0], [1.0, 1.0]]]


def test_single_episode_group_counts_as_zero_variance():
    report = DatumBuilder(MeanCentered(), drop_zero_variance_groups=True).build(
        [[episode("a", 0.7)]]
    )
    assert (report.report.zero_variance_groups, report.report.dropped_groups) == (1, 1)
    assert report.samples == ()


def test_infrastructure_episodes_are_excluded_before_advantages_and_counted():
    estimator = MeanCentered()
    groups = [
        [
            episode("a", 1.0),
            episode("x", 0.0, termination=Termination.SANDBOX_ERROR),
            episode("b", 0.0, termination=Termination.TIMEOUT),
        ],
        [
            episode("y", 0.0, group="g-2", termination=Termination.VERIFIER_ERROR),
            episode("z", 0.0, group="g-2", termination=Termination.SANDBOX_ERROR),
        ],
    ]
    batch = DatumBuilder(estimator).build(groups)
    # With "x" scored as 0 the mean would be 1/3; without it, 0.5.
    assert estimator.calls == [[[1.0, 0.0]]]
    assert [(s.episode_id, s.datum.metadata["advantage"]) for s in batch.samples] == [
        ("a", 0.5),
        ("b", -0.5),
    ]
    assert batch.report.infrastructure_episodes == 3
    # The group with no scored episode is not finalized.
    assert batch.report.groups == 1


def test_incomplete_chains_are_summed_from_episode_metadata():
    groups = [[episode("a", 1.0, incomplete=2), episode("b", 0.0, incomplete=1)]]
    assert DatumBuilder(MeanCentered()).build(groups).report.incomplete_chains == 3


def test_report_metrics_include_the_estimator_metrics():
    metrics = DatumBuilder(MeanCentered()).build(two_groups()).report.metrics()
    assert metrics["groups"] == 2.0
    assert metrics["datums"] == 4.0
    assert metrics["advantage/max"] == 0.5
    assert all(isinstance(v, float) for v in metrics.values())


def test_empty_input_gives_an_empty_report():
    estimator = MeanCentered()
    batch = DatumBuilder(estimator).build([])
    assert batch.samples == ()
    assert (batch.report.groups, batch.report.reward_avg, batch.report.steps_per_datum) == (
        0,
        0.0,
        0.0,
    )
    assert estimator.calls == []


def test_group_mixing_group_ids_is_refused():
    groups = [[episode("a", 1.0), episode("b", 0.0, group="g-9")]]
    with pytest.raises(ValueError, match=r"groups\[0\] mixes group ids 'g-1', 'g-9'"):
        DatumBuilder(MeanCentered()).build(groups)


def test_estimator_returning_another_shape_is_refused():
    class Short:
        def compute(self, rewards):
            return AdvantageResult(advantages=[[0.0]])

    with pytest.raises(ValueError, match=r"Short returned groups of sizes \[1\] for rewards"):
        DatumBuilder(Short()).build(two_groups())


def test_invalid_step_leaves_the_group_count_untouched():
    bad = trajectory(step("bad", [1], [2, 3], [-1.0]))
    builder = DatumBuilder(MeanCentered())
    with pytest.raises(ValueError, match="'bad'"):
        builder.build([[episode("a", 1.0), episode("b", 0.0, trajectories=(bad,))]])
    assert builder.groups_finalized == 0


def test_one_info_line_per_finalized_group_with_a_running_count(caplog):
    reset = trajectory(
        step("a-0", [1], [10]),
        step("a-1", [1, 10, 2], [11]),
        step("a-2", [5], [12]),  # a reset: second datum
    )
    single = trajectory(step("b-0", [1], [10]))
    builder = DatumBuilder(MeanCentered(), drop_zero_variance_groups=True)
    with caplog.at_level(logging.INFO, logger="rllm_core.algorithms"):
        builder.build(
            [
                [
                    episode("a", 1.0, trajectories=(reset,)),
                    episode("b", 0.0, trajectories=(single,)),
                    episode("x", 0.0, termination=Termination.VERIFIER_ERROR),
                ]
            ]
        )
        builder.build(
            [[episode("c", 0.25, group="g-2", task="t-2"), episode("d", 0.25, group="g-2")]]
        )
    assert [r.name for r in caplog.records] == ["rllm_core.algorithms"] * 2
    assert [r.levelno for r in caplog.records] == [logging.INFO] * 2
    assert [r.getMessage() for r in caplog.records] == [
        "groups=1 task=t-1 trajectories=2 steps=4 datums=3 steps/datum=1.33 reward_avg=0.500"
        " reward_min=0.000 reward_max=1.000 infra_excluded=1 zero_variance=no",
        "groups=2 task=t-2 trajectories=2 steps=4 datums=2 steps/datum=2.00 reward_avg=0.250"
        " reward_min=0.250 reward_max=0.250 infra_excluded=0 zero_variance=dropped",
    ]
    assert builder.groups_finalized == 2


# ------------------------------------------------------------------------------- the guide


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_guide_worked_example_is_true():
    section = _section("Prefix merge")
    test = doctest.DocTestParser().get_doctest(section, {}, "datums.md", str(DOC), 0)
    assert len(test.examples) >= 8
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test, out=lambda text: pytest.fail(text))
    assert runner.failures == 0


def test_guide_log_line_is_what_the_builder_logs(caplog):
    builder = DatumBuilder(MeanCentered())
    with caplog.at_level(logging.INFO, logger="rllm_core.algorithms"):
        builder.build([[episode("p", 1.0), episode("q", 0.0)]])
        builder.build([[episode("r", 1.0, group="g-2"), episode("s", 0.0, group="g-2")]])
        caplog.clear()
        reset = trajectory(
            step("u-0", [1], [10]), step("u-1", [1, 10, 2], [11]), step("u-2", [3], [12])
        )
        three_steps = trajectory(
            step("v-0", [1], [10]), step("v-1", [1, 10, 2], [11]), step("v-2", [1, 10, 2, 11], [12])
        )
        shapes = [reset, three_steps, three_steps, three_steps]
        builder.build(
            [
                [
                    episode(f"e{i}", float(i % 2 == 0), group="g-3", task="t-7", trajectories=(t,))
                    for i, t in enumerate(shapes)
                ]
            ]
        )
    # Third group; 4 trajectories of 3 steps; 2 + 1 + 1 + 1 datums; rewards 1, 0, 1, 0.
    [record] = caplog.records
    shown = re.search(r"```text\n(groups=\S+ task=t-7 .*)\n```", DOC.read_text(encoding="utf-8"))
    assert shown is not None
    assert record.getMessage() == shown.group(1)


def test_import_stays_torch_free():
    code = "import rllm_core.algorithms, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
