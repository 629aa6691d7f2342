"""Overlong handling and the length penalty (``[algorithm.overlong]``, ``length_penalty``):
the formulas against hand-computed values and verl's overlong buffer, the datum builder's
masking and shaped advantages, the metrics, ``plan check`` and one run through the loop."""

from __future__ import annotations

import asyncio
import io
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from reference.run_fakes import TOY, FakeTrainer
from rich.console import Console
from rllm_core.algorithms import DatumBuilder
from rllm_core.algorithms.shaping import (
    RewardShaping,
    longest_call,
    sampled_tokens,
    soft_overlong_penalty,
    truncated,
)
from rllm_core.cli.run_display import PlainDisplay
from rllm_core.errors import PlanError
from rllm_core.plan import ResolvedPlan
from rllm_core.plan.load import parse_plan
from rllm_core.plan.resolve import resolve_plan
from rllm_core.plugins import PluginManager
from rllm_core.ports import AdvantageResult
from rllm_core.run.components import Components
from rllm_core.run.folder import RunFolder
from rllm_core.run.metric_names import (
    LENGTH_PENALTY_MEAN,
    OVERLONG_MASKED,
    OVERLONG_PENALTY_MEAN,
    SAMPLES_TRUNCATED,
)
from rllm_core.run.metrics import episode_record, rollout_metrics
from rllm_core.storage.memory_buffer import MemorySampleBuffer
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.training.loop import TrainingLoop
from rllm_core.types import Episode, Grade, HarnessOutcome, Step, Task, Trajectory

PLUGINS = PluginManager()


class GroupMean:
    """``A = r - mean(group)`` (Dr. GRPO's advantage)."""

    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult:
        return AdvantageResult(advantages=[[r - math.fsum(g) / len(g) for r in g] for g in rewards])


GRPO = GroupMean()

# ---------------------------------------------------------------- the formulas


@pytest.mark.parametrize(
    ("length", "factor", "expected"),
    [
        (0, 1.0, 0.0),
        (16, 1.0, 0.0),  # exactly max_tokens - buffer_tokens: no penalty yet
        (17, 1.0, -0.25),
        (18, 1.0, -0.5),
        (20, 1.0, -1.0),  # at the limit: -penalty_factor
        (19, 0.5, -0.375),
    ],
)
def test_soft_penalty_by_hand(length, factor, expected):
    got = soft_overlong_penalty(length, max_tokens=20, buffer_tokens=4, penalty_factor=factor)
    assert got == expected


def verl_overlong_reward(
    valid_response_length: int, max_resp_len: int, overlong_buffer_len: int, factor: float
) -> float:
    """verl's DAPO reward manager (``overlong_buffer``), restated from its published formula:
    ``expected_len = max_resp_len - overlong_buffer_len``, ``exceed_len = valid_response_length
    - expected_len``, ``overlong_reward = min(-exceed_len / overlong_buffer_len *
    overlong_penalty_factor, 0)``, added to the score."""
    expected_len = max_resp_len - overlong_buffer_len
    exceed_len = valid_response_length - expected_len
    return min(-exceed_len / overlong_buffer_len * factor, 0)


@pytest.mark.parametrize(("max_tokens", "buffer_tokens"), [(20, 4), (512, 128), (7, 6)])
@pytest.mark.parametrize("factor", [1.0, 0.25, 3.0])
def test_soft_penalty_matches_verls_overlong_buffer(max_tokens, buffer_tokens, factor):
    for length in range(max_tokens + 1):
        ours = soft_overlong_penalty(
            length, max_tokens=max_tokens, buffer_tokens=buffer_tokens, penalty_factor=factor
        )
        reference = verl_overlong_reward(length, max_tokens, buffer_tokens, factor)
        assert math.isclose(ours, reference, rel_tol=1e-12, abs_tol=1e-15), length


def step(trace_id: str, prompt: list[int], completion: list[int], finish: str = "stop") -> Step:
    return Step(
        trace_id=trace_id,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-0.5] * len(completion),
        finish_reason=finish,
    )


def episode(
    episode_id: str, reward: float, *completions: tuple[int, str], group: str = "g"
) -> Episode:
    """An episode of one lineage whose model calls sampled ``(tokens, finish_reason)`` each;
    every call extends the previous one, so the episode is one datum."""
    steps, prompt = [], [1, 2]
    for turn, (length, finish) in enumerate(completions):
        completion = [10 + turn] * length
        steps.append(step(f"{episode_id}-{turn}", list(prompt), completion, finish))
        prompt = [*prompt, *completion, 3]
    return Episode(
        episode_id=episode_id,
        task_id=group,
        group_id=group,
        session_id=f"s-{episode_id}",
        trajectories=(Trajectory(lineage_id="main", steps=tuple(steps)),),
        reward=reward,
    )


def test_an_episode_is_truncated_when_any_call_stopped_at_the_limit():
    assert not truncated(episode("a", 1.0, (3, "stop"), (5, "stop")))
    assert truncated(episode("b", 1.0, (20, "length"), (5, "stop")))
    assert truncated(episode("c", 1.0, (3, "stop"), (20, "length")))


def test_multi_turn_soft_penalty_uses_the_longest_call_and_length_penalty_every_token():
    shaping = RewardShaping(
        max_tokens=20, overlong="soft", buffer_tokens=4, penalty_factor=1.0, length_penalty=0.5
    )
    ep = episode("a", 1.0, (3, "stop"), (18, "stop"), (5, "stop"))
    assert (longest_call(ep), sampled_tokens(ep)) == (18, 26)
    shaped = shaping.shape(ep)
    assert shaped.overlong_penalty == -0.5  # (16 - 18) / 4
    assert shaped.length_penalty == -0.5 * 26 / 20
    assert shaped.reward == pytest.approx(1.0 - 0.5 - 0.65)
    assert (shaped.raw, shaped.truncated, shaped.masked) == (1.0, False, False)


def test_mask_keeps_the_reward_and_marks_only_truncated_episodes():
    shaping = RewardShaping(max_tokens=20, overlong="mask")
    cut = shaping.shape(episode("a", 1.0, (20, "length")))
    full = shaping.shape(episode("b", 1.0, (20, "stop")))
    assert (cut.reward, cut.masked, full.reward, full.masked) == (1.0, True, 1.0, False)


# ---------------------------------------------------------------- the datum builder


def mixed_groups() -> list[list[Episode]]:
    """Two groups: in each, one truncated episode (one of them only in its second call)."""
    return [
        [
            episode("a", 1.0, (4, "stop")),
            episode("b", 0.0, (20, "length")),
            episode("c", 1.0, (6, "stop"), (5, "stop")),
        ],
        [
            episode("d", 0.0, (3, "stop"), (20, "length"), group="h"),
            episode("e", 1.0, (2, "stop"), group="h"),
        ],
    ]


def test_overlong_masking_removes_exactly_the_truncated_samples_tokens():
    plain = DatumBuilder(GRPO).build(mixed_groups())
    masked = DatumBuilder(GRPO, shaping=RewardShaping(max_tokens=20, overlong="mask")).build(
        mixed_groups()
    )
    assert len(plain.samples) == len(masked.samples) == 5
    for before, after in zip(plain.samples, masked.samples, strict=True):
        assert after.episode_id == before.episode_id
        if after.episode_id in ("b", "d"):
            assert any(before.datum.action_mask)
            assert not any(after.datum.action_mask)
            assert after.datum.token_ids == before.datum.token_ids
            assert "length" in after.datum.metadata["finish_reasons"]
            # Everything but the mask is as before, advantages included: the truncated
            # episodes still take part in their group's baseline.
            rest = {f: getattr(after.datum, f) for f in ("logprobs", "advantages", "metadata")}
            assert rest == {f: getattr(before.datum, f) for f in rest}
            assert after.reward == before.reward
        else:
            assert after == before
    assert masked.report.metrics()[OVERLONG_MASKED] == 2.0
    assert OVERLONG_PENALTY_MEAN not in masked.report.metrics()


def test_soft_shaping_feeds_the_shaped_rewards_to_the_estimator_and_reports_the_raw_ones():
    shaping = RewardShaping(max_tokens=20, overlong="soft", buffer_tokens=4, length_penalty=0.1)
    batch = DatumBuilder(GRPO, shaping=shaping).build(mixed_groups())
    shaped = {e.episode_id: shaping.shape(e) for g in mixed_groups() for e in g}
    expected = GRPO.compute(
        [[shaped[e.episode_id].reward for e in group] for group in mixed_groups()]
    ).advantages
    by_episode = {s.episode_id: s.datum.metadata["advantage"] for s in batch.samples}
    assert [by_episode[k] for k in "abc"] == pytest.approx(expected[0])
    assert [by_episode[k] for k in "de"] == pytest.approx(expected[1])
    assert all(any(s.datum.action_mask) for s in batch.samples)
    metrics = batch.report.metrics()
    # raw rewards: 1, 0, 1, 0, 1
    assert metrics["reward_avg"] == pytest.approx(0.6)
    # b and d sampled 20 tokens in one call: -1.0 each; the others stay below 16 tokens.
    assert metrics[OVERLONG_PENALTY_MEAN] == pytest.approx(-2.0 / 5)
    tokens = [4, 20, 11, 23, 2]
    assert metrics[LENGTH_PENALTY_MEAN] == pytest.approx(-0.1 * sum(tokens) / 20 / 5)
    assert OVERLONG_MASKED not in metrics


def test_equal_raw_rewards_stay_a_zero_variance_group_under_shaping():
    group = [episode("a", 1.0, (4, "stop")), episode("b", 1.0, (20, "length"))]
    shaping = RewardShaping(max_tokens=20, overlong="soft", buffer_tokens=4)
    batch = DatumBuilder(GRPO, drop_zero_variance_groups=True, shaping=shaping).build([group])
    assert (batch.report.zero_variance_groups, batch.report.dropped_groups) == (1, 1)
    assert batch.samples == ()


def test_inactive_shaping_changes_nothing():
    plain = DatumBuilder(GRPO).build(mixed_groups())
    off = DatumBuilder(GRPO, shaping=RewardShaping(max_tokens=20)).build(mixed_groups())
    assert off.samples == plain.samples
    assert off.report.metrics() == plain.report.metrics()


def test_truncated_episodes_are_counted_and_recorded_with_both_rewards():
    episodes = [e for g in mixed_groups() for e in g]
    line = rollout_metrics(episodes=episodes, infra_failures=0, retries=0, report={}, rollout_s=1.0)
    assert line[SAMPLES_TRUNCATED] == 2.0
    shaping = RewardShaping(max_tokens=20, overlong="soft", buffer_tokens=4)
    plain = episode_record(3, episodes[1])
    assert (plain["reward"], plain["truncated"]) == (0.0, True)
    assert "shaped_reward" not in plain
    record = episode_record(3, episodes[1], shaping)
    assert (record["reward"], record["shaped_reward"], record["overlong_masked"]) == (
        0.0,
        -1.0,
        False,
    )


# ---------------------------------------------------------------- plan check


def check(algorithm: dict[str, Any], max_tokens: int = 64) -> None:
    plan = parse_plan({"algorithm": algorithm, "sampling": {"max_tokens": max_tokens}})
    resolve_plan(plan, manager=PluginManager(), path="plan.toml")


def test_plan_check_refuses_a_buffer_as_long_as_the_limit():
    with pytest.raises(PlanError) as refused:
        check({"overlong": {"mode": "soft", "buffer_tokens": 64}})
    text = str(refused.value)
    assert "[algorithm.overlong]" in text and "buffer_tokens = 64" in text
    assert "[sampling] max_tokens = 64" in text
    check({"overlong": {"mode": "soft", "buffer_tokens": 63}})


def test_plan_check_refuses_penalty_factors_nothing_reads():
    with pytest.raises(PlanError, match="penalty_factor is only read by mode 'soft'"):
        check({"overlong": {"mode": "mask", "penalty_factor": 0.5}})
    with pytest.raises(PlanError, match="penalty_factor = 0 never changes a reward"):
        check({"overlong": {"mode": "soft", "buffer_tokens": 8, "penalty_factor": 0.0}})
    check({"overlong": {"mode": "mask"}, "length_penalty": 0.1})


# ---------------------------------------------------------------- through the training loop

MAX_TOKENS, STEPS = 6, 2


class CountingSource:
    """Four tasks, each graded 0 and 1 in turn, so every group of two has a signal."""

    def __init__(self) -> None:
        self.graded: Counter[str] = Counter()

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task(task_id=f"t{i}", instruction=f"What is {i} + 2?") for i in range(4)]

    async def grade(self, task: Task, outcome: HarnessOutcome, sandbox: Any) -> Grade:
        self.graded[task.task_id] += 1
        return Grade(reward=float(self.graded[task.task_id] % 2))


class LongWinded(FakeTrainer):
    """Every other reply runs past ``max_tokens`` (no stop token in reach)."""

    def sampler(self) -> ScriptedSampler:
        replies = itertools.cycle(["4", "4" * (MAX_TOKENS + 4)])
        return ScriptedSampler(lambda request: next(replies), renderer=TOY)


def run_loop(tmp_path, algorithm: dict[str, Any]) -> tuple[LongWinded, RunFolder]:
    plan = parse_plan(
        {
            "run": {"steps": STEPS, "seed": 3},
            "algorithm": {"batch_size": 2, "group_size": 2, **algorithm},
            "sampling": {"max_tokens": MAX_TOKENS},
            "rollout": {"max_infra_retries": 0},
        },
        path="plan.toml",
    )
    trainer = LongWinded()
    components = Components(
        trainer=trainer,
        renderer=TOY,
        harness=PLUGINS.get("harness", "single-turn").build({"max_retries": 0}),
        tasks=CountingSource(),
        trace_store=PLUGINS.get("trace_store", "memory").build({}),
        loss=object(),
        advantage=PLUGINS.get("advantage_estimator", "grpo").build({}),
        sample_buffer=MemorySampleBuffer(),
    )
    folder = RunFolder.create(tmp_path, "r")
    loop = TrainingLoop(
        resolved=ResolvedPlan(path="plan.toml", plan=plan),
        components=components,
        folder=folder,
        display=PlainDisplay(Console(file=io.StringIO(), width=200), STEPS),
    )
    result = asyncio.run(loop.run())
    assert (result.status, result.step) == ("finished", STEPS)
    return trainer, folder


def test_a_run_masks_truncated_episodes_and_counts_them(tmp_path):
    trainer, folder = run_loop(tmp_path, {"overlong": {"mode": "mask"}})
    datums = [d for name, args in trainer.calls if name == "forward_backward" for d in args[0]]
    cut = [d for d in datums if "length" in d.metadata["finish_reasons"]]
    assert 0 < len(cut) < len(datums)
    for datum in datums:
        assert any(datum.action_mask) == (datum not in cut)
    records = RunFolder.read_jsonl(folder.episodes)
    lines = RunFolder.read_jsonl(folder.metrics)
    for line in lines:
        step_records = [r for r in records if r["step"] == line["step"]]
        truncated_here = sum(r["truncated"] for r in step_records)
        assert line[SAMPLES_TRUNCATED] == line[OVERLONG_MASKED] == truncated_here
    assert all(r["overlong_masked"] == r["truncated"] for r in records)
    assert all(r["shaped_reward"] == r["reward"] for r in records)


def test_a_run_with_soft_punishment_records_shaped_rewards(tmp_path):
    _, folder = run_loop(
        tmp_path, {"overlong": {"mode": "soft", "buffer_tokens": 2}, "length_penalty": 0.5}
    )
    records = RunFolder.read_jsonl(folder.episodes)
    for r in records:
        tokens = r["completion_tokens"]
        soft = min(0.0, ((MAX_TOKENS - 2) - tokens) / 2)
        expected = r["reward"] + soft - 0.5 * tokens / MAX_TOKENS
        assert r["shaped_reward"] == pytest.approx(expected)
        assert r["truncated"] == (tokens == MAX_TOKENS)
    assert any(r["truncated"] for r in records)
    lines = RunFolder.read_jsonl(folder.metrics)
    assert all(line[OVERLONG_PENALTY_MEAN] < 0 for line in lines)
    assert all(line[LENGTH_PENALTY_MEAN] < 0 for line in lines)
