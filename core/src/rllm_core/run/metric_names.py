"""The names of the metrics a run reduces, each declared with its reduction.

Two reductions happen in a run, and both read their rules here:

- **over a step's optimizer-step calls** (:data:`PASS_RULES`): a step calls the trainer's
  ``forward_backward`` and ``optim_step`` once per mini-batch and epoch, and its metrics line
  has one value per name. A rule gives the reduction and whether only the first epoch counts
  (each datum's first pass).
- **over a run's steps** (:data:`SUMMARY`): what ``summary.json`` reports of ``metrics.jsonl``.

The ``eval/*`` metrics of an evaluation during a run (``[run].eval_every``) are neither: the
step that evaluates writes them once (:data:`EVAL_PREFIX`, named in
:mod:`rllm_core.plan.eval_check`), and ``summary.json`` reports the last evaluation and the
best checkpoint.

A name is matched against the patterns in order (``fnmatch``: ``*`` matches anything, ``/``
included); the first that matches decides. A loss that reports ``<loss>/entropy_min`` gets the
minimum, ``<loss>/dropped_overlong`` the first epoch's sum, anything else the mean weighted by
each call's action tokens.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from fnmatch import fnmatchcase

from rllm_core.algorithms.distill import DISTILL_REVERSE_KL, DISTILL_TEACHER_LOGPROB
from rllm_core.algorithms.shaping import (
    LENGTH_PENALTY_MEAN,
    OVERLONG_MASKED,
    OVERLONG_PENALTY_MEAN,
)
from rllm_core.algorithms.shaping import TRUNCATED as SAMPLES_TRUNCATED
from rllm_core.plan.eval_check import EVAL_PREFIX
from rllm_core.rollout.gateway_workers import GATEWAY_CALLS_PREFIX

__all__ = [
    "ACCURACY",
    "ACTION_TOKENS",
    "ASYNC_IN_FLIGHT_GROUPS",
    "ASYNC_RUNNING_ROLLOUTS",
    "GATEWAY_CALLS_PREFIX",
    "DISTILL_REVERSE_KL",
    "DISTILL_TEACHER_LOGPROB",
    "ENTROPY_MEAN",
    "EPISODES",
    "EVAL_MEAN_REWARD",
    "EVAL_PASS_1",
    "EVAL_PREFIX",
    "GROUPS",
    "GROUPS_FILTERED",
    "GROUPS_SAMPLED",
    "INFRA_FAILURES",
    "KL_REF_MAX",
    "KL_REF_MEAN",
    "LEARNING_RATE",
    "LENGTH_PENALTY_MEAN",
    "OBSERVATION_TOKENS",
    "OPTIMIZER_STEP",
    "OVERLONG_MASKED",
    "OVERLONG_PENALTY_MEAN",
    "PASS_RULES",
    "REWARD_MEAN",
    "ROLLOUT_S",
    "SAMPLER_BUSY_S",
    "SAMPLES_TRUNCATED",
    "SECURITY_DENIED",
    "SEQUENCES",
    "SUMMARY",
    "TOKENS",
    "TOKENS_SAMPLED",
    "TOKENS_TRAINED",
    "TERMINATION_PREFIX",
    "TRAIN_S",
    "ZERO_VARIANCE_GROUPS",
    "PassRule",
    "Reduction",
    "pass_rule",
]


class Reduction(enum.StrEnum):
    """How many values of one metric become one."""

    SUM = "sum"
    LAST = "last"
    MIN = "min"
    MAX = "max"
    MEAN = "mean"
    """Over a step's calls: weighted by each call's action tokens; over steps: plain, over the
    steps that have the metric."""
    MEAN_FIRST = "mean_first"
    """Over steps: the mean of the first few."""
    MEAN_LAST = "mean_last"
    """Over steps: the mean of the last few."""


# ---------------------------------------------------------------- a step's calls

TOKENS = "tokens"
SEQUENCES = "sequences"
ACTION_TOKENS = "action_tokens"
OBSERVATION_TOKENS = "observation_tokens"
OPTIMIZER_STEP = "step"
LEARNING_RATE = "learning_rate"
KL_REF_MEAN = "kl/ref_mean"
"""Mean KL estimate to the reference model over action tokens (``[algorithm.kl]``)."""
KL_REF_MAX = "kl/ref_max"
ENTROPY_MEAN = "entropy/mean"
"""Mean next-token entropy of the policy over action tokens (``entropy_coef > 0``)."""


@dataclass(frozen=True)
class PassRule:
    """The reduction of a metric over a step's calls; ``first_epoch``: only the calls of the
    first epoch count (each datum's first pass)."""

    reduction: Reduction
    first_epoch: bool = False


_COUNT = PassRule(Reduction.SUM, first_epoch=True)

PASS_RULES: tuple[tuple[str, PassRule], ...] = (
    (TOKENS, _COUNT),
    (SEQUENCES, _COUNT),
    (ACTION_TOKENS, _COUNT),
    (OBSERVATION_TOKENS, _COUNT),
    ("*/dropped_*", _COUNT),  # a backend's datums dropped before sending
    ("*/skipped_step", PassRule(Reduction.SUM)),  # optimizer steps a backend skipped
    (OPTIMIZER_STEP, PassRule(Reduction.LAST)),
    (LEARNING_RATE, PassRule(Reduction.LAST)),
    # In the loss, each pass measures the policy it updates; in the reward, one value per step.
    (KL_REF_MAX, PassRule(Reduction.MAX)),
    (KL_REF_MEAN, PassRule(Reduction.MEAN)),
    (ENTROPY_MEAN, PassRule(Reduction.MEAN)),
    ("offpolicy/*_min", PassRule(Reduction.MIN, first_epoch=True)),
    ("offpolicy/*_max", PassRule(Reduction.MAX, first_epoch=True)),
    ("offpolicy/*", PassRule(Reduction.MEAN, first_epoch=True)),
    ("correction/*_min", PassRule(Reduction.MIN, first_epoch=True)),
    ("correction/*_max", PassRule(Reduction.MAX, first_epoch=True)),
    ("correction/*", PassRule(Reduction.MEAN, first_epoch=True)),
    ("*_min", PassRule(Reduction.MIN)),
    ("*_max", PassRule(Reduction.MAX)),
    ("*", PassRule(Reduction.MEAN)),
)
"""The rule of each metric a step's calls report; see the module docstring."""


def pass_rule(name: str) -> PassRule:
    """The first rule of :data:`PASS_RULES` whose pattern matches ``name``."""
    return next(rule for pattern, rule in PASS_RULES if fnmatchcase(name, pattern))


# ---------------------------------------------------------------- a run's steps

REWARD_MEAN = "reward/mean"
ACCURACY = "accuracy"
EPISODES = "episodes"
INFRA_FAILURES = "infra_failures"
TOKENS_SAMPLED = "tokens/sampled"
TOKENS_TRAINED = "tokens/trained"
GROUPS = "groups"
ZERO_VARIANCE_GROUPS = "zero_variance_groups"
GROUPS_SAMPLED = "groups/sampled"
GROUPS_FILTERED = "groups/filtered"
ROLLOUT_S = "time/rollout_s"
TRAIN_S = "time/train_s"
SAMPLER_BUSY_S = "time/sampler_busy_s"
SECURITY_DENIED = "security/denied"
TERMINATION_PREFIX = "termination/"
"""``termination/<reason>``: each step's share of rollouts that ended with ``<reason>`` (every
:class:`~rllm_core.types.Termination`, 0.0 included). A rate, so ``summary.json`` sums none of
them; a step's line has one value each, never reduced over its calls."""
ASYNC_RUNNING_ROLLOUTS = "async/running_rollouts"
"""The async pipeline's rollouts running (holding a ``[rollout].max_concurrency`` place), the
mean over the time since the previous step's line."""
ASYNC_IN_FLIGHT_GROUPS = "async/in_flight_groups"
"""The async pipeline's groups in flight (dispatched, their step not yet trained), the mean
over the time since the previous step's line."""
EVAL_PASS_1 = EVAL_PREFIX + "pass@1"
EVAL_MEAN_REWARD = EVAL_PREFIX + "mean_reward"
# GATEWAY_CALLS_PREFIX (with [gateway].workers above 1) is named in
# rllm_core.rollout.gateway_workers, which measures it.
# SAMPLES_TRUNCATED (scored episodes with a model call cut at the length limit), and with
# reward shaping OVERLONG_MASKED, OVERLONG_PENALTY_MEAN and LENGTH_PENALTY_MEAN, are named
# in rllm_core.algorithms.shaping, which measures them.
# With a teacher (on-policy distillation), each step's line has DISTILL_REVERSE_KL (the mean of
# student minus teacher logprob over sampled tokens) and DISTILL_TEACHER_LOGPROB, named in
# rllm_core.algorithms.distill, which measures them.

SUMMARY: tuple[tuple[str, str, Reduction], ...] = (
    ("reward_first", REWARD_MEAN, Reduction.MEAN_FIRST),
    ("reward_last", REWARD_MEAN, Reduction.MEAN_LAST),
    ("accuracy_last", ACCURACY, Reduction.LAST),
    ("episodes", EPISODES, Reduction.SUM),
    ("infra_failures", INFRA_FAILURES, Reduction.SUM),
    ("security_denied", SECURITY_DENIED, Reduction.SUM),
    ("truncated", SAMPLES_TRUNCATED, Reduction.SUM),
    ("tokens_sampled", TOKENS_SAMPLED, Reduction.SUM),
    ("tokens_trained", TOKENS_TRAINED, Reduction.SUM),
    ("groups", GROUPS, Reduction.SUM),
    ("zero_variance_groups", ZERO_VARIANCE_GROUPS, Reduction.SUM),
    ("groups_sampled", GROUPS_SAMPLED, Reduction.SUM),
    ("groups_filtered", GROUPS_FILTERED, Reduction.SUM),
    ("rollout_s", ROLLOUT_S, Reduction.SUM),
    ("train_s", TRAIN_S, Reduction.SUM),
    ("running_rollouts", ASYNC_RUNNING_ROLLOUTS, Reduction.MEAN),
    ("in_flight_groups", ASYNC_IN_FLIGHT_GROUPS, Reduction.MEAN),
)
"""``summary.json``'s key, the metric it reduces and how, for an RL run."""
