"""Reward shaping for long completions: ``[algorithm.overlong]`` and ``[algorithm].length_penalty``.

An episode is **truncated** when one of its model calls stopped at the length limit
(``Step.finish_reason == "length"``). With ``L_max = [sampling].max_tokens``, ``B =
buffer_tokens`` and ``L`` the completion tokens of the episode's longest model call:

- ``overlong.mode = "soft"`` (DAPO's soft overlong punishment, verl's overlong buffer) adds
  ``min(0, ((L_max - B) - L) / B * penalty_factor)`` to the reward: 0 up to ``L_max - B``
  tokens, falling linearly to ``-penalty_factor`` at ``L_max``. A multi-turn episode is
  judged by its longest call, the one that came nearest the limit, whether or not it was cut.
- ``overlong.mode = "mask"`` (DAPO's overlong filtering) keeps the reward and the tokens of a
  truncated episode but sets every ``action_mask`` entry of its datums to false, so they add
  nothing to the loss. Its reward still counts in its group's baseline: the policy did produce
  that outcome, and leaving it out would make the others' advantages depend on which of them
  ran long.
- ``length_penalty = c`` adds ``-c * T / L_max`` with ``T`` every token the episode sampled
  (all its model calls).

The shaped reward (raw plus both terms) is what the advantage estimator sees. Which groups
have equal rewards (``drop_zero_variance_groups``, ``filter_groups``) is decided on the raw
rewards, as DAPO filters on accuracy, so shaping never changes which groups are trained.

Pure Python; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import msgspec

from rllm_core.types import Episode, Sample

if TYPE_CHECKING:
    from rllm_core.plan import Plan

__all__ = [
    "LENGTH_PENALTY_MEAN",
    "OVERLONG_MASKED",
    "OVERLONG_PENALTY_MEAN",
    "TRUNCATED",
    "RewardShaping",
    "Shaped",
    "longest_call",
    "mask_actions",
    "sampled_tokens",
    "soft_overlong_penalty",
    "truncated",
]

TRUNCATED = "samples/truncated"
OVERLONG_MASKED = "samples/overlong_masked"
OVERLONG_PENALTY_MEAN = "reward/overlong_penalty_mean"
LENGTH_PENALTY_MEAN = "reward/length_penalty_mean"


def truncated(episode: Episode) -> bool:
    """Whether a model call of ``episode`` stopped at the length limit."""
    return any(step.finish_reason == "length" for t in episode.trajectories for step in t.steps)


def longest_call(episode: Episode) -> int:
    """Completion tokens of ``episode``'s longest model call (0 without any)."""
    return max(
        (len(step.completion_token_ids) for t in episode.trajectories for step in t.steps),
        default=0,
    )


def sampled_tokens(episode: Episode) -> int:
    """Completion tokens of every model call of ``episode``."""
    return sum(len(step.completion_token_ids) for t in episode.trajectories for step in t.steps)


def soft_overlong_penalty(
    length: int, *, max_tokens: int, buffer_tokens: int, penalty_factor: float
) -> float:
    """What DAPO's soft overlong punishment adds to the reward of a completion of ``length``
    tokens: 0 up to ``max_tokens - buffer_tokens``, then ``-penalty_factor`` times the share of
    the buffer used (``-penalty_factor`` at ``max_tokens``)."""
    expected = max_tokens - buffer_tokens
    return min(0.0, (expected - length) / buffer_tokens * penalty_factor)


@dataclass(frozen=True, slots=True)
class Shaped:
    """One episode's reward before (``raw``) and after (``reward``) shaping, the two terms
    added (``overlong_penalty`` and ``length_penalty``, each <= 0), whether it was
    ``truncated`` and whether its datums are to be ``masked``."""

    raw: float
    reward: float
    truncated: bool
    masked: bool = False
    overlong_penalty: float = 0.0
    length_penalty: float = 0.0


@dataclass(frozen=True, slots=True)
class RewardShaping:
    """The plan's shaping; see the module docstring. ``overlong`` is ``off``, ``mask`` or
    ``soft``; ``buffer_tokens`` is required by ``soft`` and must be below ``max_tokens``."""

    max_tokens: int
    overlong: Literal["off", "mask", "soft"] = "off"
    buffer_tokens: int | None = None
    penalty_factor: float = 1.0
    length_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.overlong == "soft" and (
            self.buffer_tokens is None or not 0 < self.buffer_tokens < self.max_tokens
        ):
            raise ValueError(
                f"soft overlong punishment needs 0 < buffer_tokens < max_tokens, got"
                f" buffer_tokens = {self.buffer_tokens} and max_tokens = {self.max_tokens}"
            )

    @classmethod
    def from_plan(cls, plan: Plan) -> RewardShaping:
        algorithm = plan.algorithm
        return cls(
            max_tokens=plan.sampling.max_tokens,
            overlong=algorithm.overlong.mode,
            buffer_tokens=algorithm.overlong.buffer_tokens,
            penalty_factor=algorithm.overlong.penalty_factor,
            length_penalty=algorithm.length_penalty,
        )

    @property
    def active(self) -> bool:
        """Whether shaping changes any reward or mask."""
        return self.overlong != "off" or self.length_penalty > 0

    def shape(self, episode: Episode) -> Shaped:
        cut = truncated(episode)
        overlong = 0.0
        if self.overlong == "soft":
            assert self.buffer_tokens is not None  # checked in __post_init__
            overlong = soft_overlong_penalty(
                longest_call(episode),
                max_tokens=self.max_tokens,
                buffer_tokens=self.buffer_tokens,
                penalty_factor=self.penalty_factor,
            )
        length = -self.length_penalty * sampled_tokens(episode) / self.max_tokens
        return Shaped(
            raw=episode.reward,
            reward=episode.reward + overlong + length,
            truncated=cut,
            masked=cut and self.overlong == "mask",
            overlong_penalty=overlong,
            length_penalty=length,
        )

    def metrics(self, shaped: Sequence[Shaped], *, masked: int) -> dict[str, float]:
        """``samples/overlong_masked`` (``masked``: episodes whose datums were masked) with
        ``mask``, and the means over ``shaped`` of what each term added to the rewards
        (``reward/overlong_penalty_mean`` with ``soft``, ``reward/length_penalty_mean`` with a
        length penalty); nothing for a term that is off."""
        out: dict[str, float] = {}
        n = len(shaped)
        if self.overlong == "mask":
            out[OVERLONG_MASKED] = float(masked)
        if self.overlong == "soft":
            out[OVERLONG_PENALTY_MEAN] = (
                math.fsum(s.overlong_penalty for s in shaped) / n if n else 0.0
            )
        if self.length_penalty > 0:
            out[LENGTH_PENALTY_MEAN] = math.fsum(s.length_penalty for s in shaped) / n if n else 0.0
        return out


def mask_actions(samples: Iterable[Sample], episode_ids: set[str]) -> tuple[list[Sample], int]:
    """``samples`` with every action of the episodes ``episode_ids`` masked out (tokens and
    everything else kept), and how many of those episodes had a sample."""
    out: list[Sample] = []
    hit: set[str] = set()
    for sample in samples:
        if sample.episode_id in episode_ids:
            hit.add(sample.episode_id)
            datum = sample.datum
            datum = msgspec.structs.replace(datum, action_mask=[False] * len(datum.token_ids))
            sample = msgspec.structs.replace(sample, datum=datum)
        out.append(sample)
    return out, len(hit)
