"""Finished groups of episodes -> advantages -> datums and samples for the buffer.

:class:`DatumBuilder` takes the episodes of one or more task groups, leaves out the episodes
that ended for a masked reason (``mask``: retried, never scored), asks an advantage
estimator for one advantage per remaining episode, prefix-merges every trajectory with its
episode's advantage (:func:`~rllm_core.algorithms.datums.merge_trajectory`) and returns the
samples with a :class:`DatumReport`. Each finalized group logs one INFO line on the logger
``rllm_core.algorithms``, for example::

    groups=3 task=t-7 trajectories=4 steps=12 datums=5 steps/datum=2.40 reward_avg=0.500
    reward_min=0.000 reward_max=1.000 infra_excluded=0 zero_variance=no

(one line in the log). ``groups`` is the running count of groups this builder finalized;
``zero_variance`` is ``no``, ``kept`` or ``dropped``. Pure Python; no torch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rllm_core.algorithms.datums import merge_trajectory
from rllm_core.algorithms.shaping import RewardShaping, mask_actions
from rllm_core.ports.losses import AdvantageEstimator, AdvantageResult
from rllm_core.types import DEFAULT_MASK, Datum, Episode, Sample, Termination

__all__ = ["DatumBatch", "DatumBuilder", "DatumReport"]

logger = logging.getLogger("rllm_core.algorithms")


@dataclass(frozen=True, slots=True)
class DatumReport:
    """What one :meth:`DatumBuilder.build` call saw and produced.

    - ``groups``: groups finalized by this call (a group with no scored episode is not
      finalized); ``zero_variance_groups``: those whose scored rewards are all equal (a group
      of one included), counted whether or not they are dropped; ``dropped_groups``: those
      left out of the batch for it.
    - ``infrastructure_episodes``: episodes left out for a masked termination (the builder's
      ``mask``, ``[rollout].mask``);
      ``incomplete_chains``: traces left out of the episodes' trajectories for a missing
      ancestor (summed from ``Episode.trace_counts.incomplete_chains``).
    - ``episodes``, ``reward_avg``, ``reward_min``, ``reward_max``: over every scored episode
      of the finalized groups, dropped groups included (they describe the policy, not the
      batch); the reward statistics are 0.0 when there is none.
    - ``trajectories``, ``steps``, ``datums``, ``steps_per_datum``: over what the batch holds
      (dropped groups excluded); ``steps_per_datum`` is 0.0 without datums.
    - ``advantage_metrics``: the estimator's metrics for this call.
    - ``shaping_metrics``: the reward shaping's, under their own names
      (:meth:`~rllm_core.algorithms.shaping.RewardShaping.metrics`); empty without shaping.
    """

    groups: int = 0
    zero_variance_groups: int = 0
    dropped_groups: int = 0
    infrastructure_episodes: int = 0
    incomplete_chains: int = 0
    episodes: int = 0
    trajectories: int = 0
    steps: int = 0
    datums: int = 0
    steps_per_datum: float = 0.0
    reward_avg: float = 0.0
    reward_min: float = 0.0
    reward_max: float = 0.0
    advantage_metrics: Mapping[str, float] = field(default_factory=dict)
    shaping_metrics: Mapping[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Every figure as a float, the estimator's under ``advantage/<name>``, for loggers."""
        out = {
            name: float(getattr(self, name))
            for name in self.__dataclass_fields__
            if name not in ("advantage_metrics", "shaping_metrics")
        }
        out.update({f"advantage/{k}": float(v) for k, v in self.advantage_metrics.items()})
        out.update({k: float(v) for k, v in self.shaping_metrics.items()})
        return out


@dataclass(frozen=True, slots=True)
class DatumBatch:
    """The samples of one :meth:`DatumBuilder.build` call, in group, episode, trajectory and
    datum order, and its report. ``sequence`` is unset (-1): the buffer assigns it."""

    samples: tuple[Sample, ...]
    report: DatumReport

    @property
    def datums(self) -> tuple[Datum, ...]:
        return tuple(sample.datum for sample in self.samples)


@dataclass(slots=True)
class _Group:
    task_id: str
    group_id: str
    scored: list[Episode]
    infrastructure: int


def _stats(values: Sequence[float]) -> tuple[float, float, float]:
    if not values:
        return 0.0, 0.0, 0.0
    return math.fsum(values) / len(values), min(values), max(values)


def _all_equal(values: Sequence[float]) -> bool:
    return all(value == values[0] for value in values)


class DatumBuilder:
    """Turns finished task groups into training samples with one advantage estimator.

    ``groups[g]`` holds the finished episodes of one task group (every episode of it shares
    one ``group_id``). A call computes advantages over all its groups at once, so batch-wide
    estimators see the whole batch; groups with all-equal rewards take part in that
    computation and are then dropped when ``drop_zero_variance_groups`` is true.

    Each sample's ``weight_version`` is the smallest among its datum's steps (the oldest
    policy that contributed), ``reward`` its episode's reward. With an active ``shaping``
    the estimator sees the shaped rewards and the datums of masked episodes have no action
    (:mod:`rllm_core.algorithms.shaping`); ``reward`` stays the raw one. Each datum's
    metadata holds, besides what :func:`~rllm_core.algorithms.datums.merge_trajectory` records, the
    ``episode_id``, ``group_id``, ``task_id`` and ``session_id`` of its episode, its
    ``reward`` and its ``advantage``.

    Example::

        builder = DatumBuilder(estimator, drop_zero_variance_groups=True)
        batch = builder.build([episodes_of_task_a, episodes_of_task_b])
        buffer.append(batch.samples)
    """

    def __init__(
        self,
        estimator: AdvantageEstimator,
        *,
        drop_zero_variance_groups: bool = False,
        shaping: RewardShaping | None = None,
        mask: frozenset[Termination] = DEFAULT_MASK,
    ) -> None:
        self.estimator = estimator
        self.mask = mask
        self.drop_zero_variance_groups = drop_zero_variance_groups
        self.shaping = shaping if shaping is not None and shaping.active else None
        self._finalized = 0

    @property
    def groups_finalized(self) -> int:
        """Groups finalized by this builder so far, over every call."""
        return self._finalized

    def build(self, groups: Sequence[Sequence[Episode]]) -> DatumBatch:
        """Score, merge and report ``groups``; see the class docstring.

        Raises ``ValueError`` when a group mixes group ids or the estimator returns
        advantages of another shape than the rewards it was given.
        """
        prepared = [self._prepare(index, episodes) for index, episodes in enumerate(groups)]
        incomplete = sum(
            episode.trace_counts.incomplete_chains for episodes in groups for episode in episodes
        )
        finalized = [group for group in prepared if group.scored]
        raw = [[episode.reward for episode in group.scored] for group in finalized]
        shaped = (
            [[self.shaping.shape(e) for e in group.scored] for group in finalized]
            if self.shaping
            else []
        )
        rewards = [[s.reward for s in group] for group in shaped] if self.shaping else raw
        result = self.estimator.compute(rewards) if rewards else AdvantageResult(advantages=[])
        self._check_shape(rewards, result.advantages)

        # Merge every group before logging any, so an invalid step leaves the count untouched.
        outcomes = [
            self._merge(group, advantages)
            for group, advantages in zip(finalized, result.advantages, strict=True)
        ]
        samples: list[Sample] = []
        zero_variance = dropped = kept_trajectories = kept_steps = 0
        for group, outcome in zip(finalized, outcomes, strict=True):
            group_samples, trajectories, steps = outcome
            group_rewards = [episode.reward for episode in group.scored]
            flat = _all_equal(group_rewards)
            drop = flat and self.drop_zero_variance_groups
            self._finalized += 1
            self._log(group, trajectories, steps, len(group_samples), group_rewards, flat, drop)
            zero_variance += int(flat)
            if drop:
                dropped += 1
                continue
            samples.extend(group_samples)
            kept_trajectories += trajectories
            kept_steps += steps

        shaping_metrics: dict[str, float] = {}
        if self.shaping is not None:
            pairs = [
                (e, s)
                for group, shapes in zip(finalized, shaped, strict=True)
                for e, s in zip(group.scored, shapes, strict=True)
            ]
            samples, masked = mask_actions(samples, {e.episode_id for e, s in pairs if s.masked})
            shaping_metrics = self.shaping.metrics([s for _, s in pairs], masked=masked)
        all_rewards = [r for group_rewards in raw for r in group_rewards]
        reward_avg, reward_min, reward_max = _stats(all_rewards)
        report = DatumReport(
            groups=len(finalized),
            zero_variance_groups=zero_variance,
            dropped_groups=dropped,
            infrastructure_episodes=sum(group.infrastructure for group in prepared),
            incomplete_chains=incomplete,
            episodes=len(all_rewards),
            trajectories=kept_trajectories,
            steps=kept_steps,
            datums=len(samples),
            steps_per_datum=kept_steps / len(samples) if samples else 0.0,
            reward_avg=reward_avg,
            reward_min=reward_min,
            reward_max=reward_max,
            advantage_metrics=dict(result.metrics),
            shaping_metrics=shaping_metrics,
        )
        return DatumBatch(samples=tuple(samples), report=report)

    def _prepare(self, index: int, episodes: Sequence[Episode]) -> _Group:
        group_ids = sorted({episode.group_id for episode in episodes})
        if len(group_ids) > 1:
            raise ValueError(
                f"groups[{index}] mixes group ids {', '.join(map(repr, group_ids))}; pass the"
                " episodes of each task group as their own sequence"
            )
        scored = [e for e in episodes if e.termination not in self.mask]
        first = episodes[0] if episodes else None
        return _Group(
            task_id=first.task_id if first else "",
            group_id=first.group_id if first else "",
            scored=scored,
            infrastructure=len(episodes) - len(scored),
        )

    def _check_shape(self, rewards: list[list[float]], advantages: list[list[float]]) -> None:
        expected = [len(group) for group in rewards]
        got = [len(group) for group in advantages]
        if expected != got:
            raise ValueError(
                f"advantage estimator {type(self.estimator).__name__} returned groups of sizes"
                f" {got} for rewards of sizes {expected}; an estimator must return exactly one"
                " advantage per reward"
            )

    @classmethod
    def _merge(cls, group: _Group, advantages: Sequence[float]) -> tuple[list[Sample], int, int]:
        """The group's samples, trajectory count and step count."""
        samples: list[Sample] = []
        trajectories = steps = 0
        for episode, advantage in zip(group.scored, advantages, strict=True):
            trajectories += len(episode.trajectories)
            steps += sum(len(t.steps) for t in episode.trajectories)
            samples.extend(cls._samples(episode, float(advantage)))
        return samples, trajectories, steps

    @staticmethod
    def _samples(episode: Episode, advantage: float) -> list[Sample]:
        provenance = {
            "episode_id": episode.episode_id,
            "group_id": episode.group_id,
            "task_id": episode.task_id,
            "session_id": episode.session_id,
            "reward": episode.reward,
            "advantage": advantage,
        }
        return [
            Sample(
                datum=datum,
                group_id=episode.group_id,
                episode_id=episode.episode_id,
                weight_version=datum.metadata["min_weight_version"],
                reward=episode.reward,
            )
            for trajectory in episode.trajectories
            for datum in merge_trajectory(trajectory, advantage, metadata=provenance)
        ]

    def _log(
        self,
        group: _Group,
        trajectories: int,
        steps: int,
        datums: int,
        rewards: list[float],
        flat: bool,
        drop: bool,
    ) -> None:
        avg, low, high = _stats(rewards)
        logger.info(
            "groups=%d task=%s trajectories=%d steps=%d datums=%d steps/datum=%.2f"
            " reward_avg=%.3f reward_min=%.3f reward_max=%.3f infra_excluded=%d zero_variance=%s",
            self._finalized,
            group.task_id,
            trajectories,
            steps,
            datums,
            steps / datums if datums else 0.0,
            avg,
            low,
            high,
            group.infrastructure,
            ("dropped" if drop else "kept") if flat else "no",
        )
