"""What each step writes: the ``metrics.jsonl`` line and the ``episodes.jsonl`` records.

Every value in a metrics line is a number except ``step`` (an int). Keys:

- ``reward/mean|std|min|max`` over the step's scored episodes (population std), and
  ``accuracy``: the share of them with reward >= 1. All 0.0 when no episode was scored.
- ``episodes``, ``infra_failures``, ``infra_retries``: scored episodes, rollouts excluded after
  their last retry, and retries taken.
- ``termination/<reason>`` for every :class:`~rllm_core.types.Termination`: the share of the
  step's rollouts (scored and excluded; an excluded one counts with its last attempt's reason)
  that ended with it (0.0 for every reason when there was none).
- ``datums``, ``groups``, ``zero_variance_groups``, ``dropped_groups``, ``steps_per_datum``,
  ``incomplete_chains`` and ``advantage/*`` from the datum builder's report.
- ``groups/sampled``, ``groups/filtered``, ``groups/surplus``, ``groups/short`` and
  ``groups/sample_batches``: what dynamic sampling (``[algorithm].filter_groups``,
  :mod:`rllm_core.rollout.dynamic`) rolled out, left out and lacked, and in how many rounds
  (without it: one round, every group sampled and kept).
- ``resets``: lineages beyond the first per episode (each reset of a cumulative session starts
  a new lineage, so a new trajectory); ``resets/history_truncated``,
  ``resets/history_summarized`` and ``resets/history_edited``: model calls whose messages
  rewrote their lineage's history (an agent that truncated or summarized its context), by
  reason, counted from the traces.
- ``tools/calls``: the well-formed tool calls of the step's episodes' replies, and
  ``tools/invalid``: their model calls whose reply held a tool-call attempt the renderer's
  tool-call format could not read (malformed, cut off by ``max_tokens``; the trace's flag
  ``tool_call_invalid``), counted from the traces.
- ``security/denied``: requests the gateway refused to the step's episodes' session tokens
  (another session's routes, an admin route): what the agents tried beyond their reach. Each
  refusal is also a WARNING line in ``run.log``.
- ``samples/truncated``: scored episodes with a model call cut at ``[sampling].max_tokens``
  (finish reason ``length``); with ``[algorithm.overlong]`` or ``length_penalty`` also
  ``samples/overlong_masked``, ``reward/overlong_penalty_mean`` and
  ``reward/length_penalty_mean`` from the datum builder's report
  (:mod:`rllm_core.algorithms.shaping`). ``reward/mean`` and the other reward statistics are
  the raw rewards.
- ``tokens/sampled`` (completion tokens of scored episodes), ``tokens/trained`` (tokens of the
  datums), ``tokens/sampled_per_s`` (over the rollout phase), ``tokens/trained_per_s`` (over
  the train phase).
- every metric the policy update returned (see :mod:`rllm_core.training.update`), prefixed
  ``train/`` (loss metrics keep their own ``<loss>/`` prefix inside it), except the off-policy
  diagnostics ``offpolicy/*`` and the rollout corrections' ``correction/*``, which keep their
  names; and ``trained`` (1 when the optimizer stepped, 0 when the step had no datum).
- ``time/rollout_s``, ``time/train_s``, ``time/step_s`` and ``weight_version``.
- ``time/sampler_busy_s`` and ``sampler_utilization`` (busy seconds over ``time/rollout_s``):
  how long the sampler ran the model during the rollout phase, when it reports that
  (:class:`~rllm_core.ports.training.BusyClock`); absent otherwise.
- with ``[run].pipeline = "async"``: ``async/policy_age_mean`` and ``async/policy_age_max`` (the
  trainer's weight version at the update minus each trained sample's version; 0 when nothing was
  trained), ``async/dropped_stale`` (groups of the step's batch older than
  ``[algorithm].max_policy_age``, not trained), ``async/queue_groups`` (groups of later batches
  waiting in the sample buffer when the step's update ended: its ``backlog().groups``),
  ``async/sampler_wait_s`` (how long rollouts waited for the trainer, since the previous line,
  because they were as far ahead as the bound allows) and ``async/trainer_wait_s`` (how long this
  step waited for its batch), ``async/running_rollouts`` and ``async/in_flight_groups`` (the
  rollouts running and the groups dispatched but not yet trained, each a mean over the time
  since the previous line). ``time/rollout_s`` is then the batch's rollout time and
  ``time/step_s`` the time since the previous step ended; ``time/sampler_busy_s`` is absent (batches
  overlap, so the sampler's busy time has no one batch to belong to).
- with ``[gateway].workers`` above 1: ``gateway/calls/<i>``, the model calls gateway worker
  ``i`` served since the previous batch's line (evaluations during the run included).
- with a ``[sampler]`` that counts its weight updates
  (:class:`~rllm_core.ports.training.SyncCounters`, the vLLM sampler's ``vllm/weight_syncs``,
  ``vllm/sync_s`` and ``vllm/restores``): its counts since it started, as they stood when the
  batch's rollouts were done.
- ``system/rss_gb``: the process's peak resident memory so far, in GB (10^9 bytes; the
  kernel's high-water mark, model load included), and ``system/rss_now_gb``: its resident
  memory when the line was made. Absent where the platform does not report them.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rllm_core.algorithms.datums import HISTORY_BREAK_REASONS
from rllm_core.algorithms.shaping import RewardShaping, truncated
from rllm_core.run.metric_names import (
    ROLLOUT_S,
    SAMPLER_BUSY_S,
    SAMPLES_TRUNCATED,
    SECURITY_DENIED,
    SUMMARY,
    TERMINATION_PREFIX,
    Reduction,
)
from rllm_core.types import Datum, Episode, Termination

__all__ = [
    "completion_tokens",
    "episode_record",
    "episode_version",
    "memory_metrics",
    "reward_stats",
    "rollout_metrics",
    "sft_summary",
    "step_metrics",
    "summarize",
    "train_metrics",
]


UNPREFIXED = ("offpolicy/", "correction/")
"""Training metrics that keep their own name in the line: the off-policy diagnostics and the
rollout corrections' figures describe the samples as much as the update."""


def reward_stats(rewards: Sequence[float]) -> dict[str, float]:
    """Mean, population std, min, max and accuracy (share >= 1) of ``rewards``."""
    if not rewards:
        return {f"reward/{k}": 0.0 for k in ("mean", "std", "min", "max")} | {"accuracy": 0.0}
    mean = math.fsum(rewards) / len(rewards)
    var = math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)
    return {
        "reward/mean": mean,
        "reward/std": math.sqrt(var),
        "reward/min": float(min(rewards)),
        "reward/max": float(max(rewards)),
        "accuracy": sum(1 for r in rewards if r >= 1.0) / len(rewards),
    }


def completion_tokens(episode: Episode) -> int:
    """Tokens the sampler produced for ``episode`` (every step of every trajectory)."""
    return sum(len(s.completion_token_ids) for t in episode.trajectories for s in t.steps)


def _resets(episode: Episode) -> int:
    return max(0, len({t.lineage_id for t in episode.trajectories}) - 1)


def step_metrics(
    *,
    step: int,
    episodes: Sequence[Episode],
    infra_failures: int,
    retries: int,
    report: Mapping[str, float],
    datums: Sequence[Datum],
    train: Mapping[str, float],
    rollout_s: float,
    train_s: float,
    step_s: float,
    weight_version: int,
    sampler_busy_s: float | None = None,
    excluded: Sequence[Termination] = (),
) -> dict[str, Any]:
    """The ``metrics.jsonl`` line of one step; see the module docstring for the keys.
    ``report`` is :meth:`~rllm_core.algorithms.DatumReport.metrics`."""
    rollout = rollout_metrics(
        episodes=episodes,
        infra_failures=infra_failures,
        excluded=excluded,
        retries=retries,
        report=report,
        rollout_s=rollout_s,
        sampler_busy_s=sampler_busy_s,
    )
    return (
        {"step": step}
        | rollout
        | train_metrics(
            datums=datums,
            train=train,
            train_s=train_s,
            step_s=step_s,
            weight_version=weight_version,
        )
    )


def rollout_metrics(
    *,
    episodes: Sequence[Episode],
    infra_failures: int,
    retries: int,
    report: Mapping[str, float],
    rollout_s: float,
    sampler_busy_s: float | None = None,
    excluded: Sequence[Termination] = (),
) -> dict[str, float]:
    """The part of a metrics line known once a step's rollouts are done: rewards, episode and
    datum counts, sampled tokens, rollout time, sampler use, and the termination rates over
    the scored ``episodes`` and the ``excluded`` rollouts' reasons."""
    sampled = sum(completion_tokens(e) for e in episodes)
    line = reward_stats([e.reward for e in episodes])
    line |= {
        "episodes": float(len(episodes)),
        "infra_failures": float(infra_failures),
        "infra_retries": float(retries),
        "resets": float(sum(_resets(e) for e in episodes)),
        SECURITY_DENIED: float(sum(e.denied for e in episodes)),
        "tools/calls": float(sum(e.trace_counts.tool_calls for e in episodes)),
        "tools/invalid": float(sum(e.trace_counts.tool_calls_invalid for e in episodes)),
        SAMPLES_TRUNCATED: float(sum(truncated(e) for e in episodes)),
        "tokens/sampled": float(sampled),
        "tokens/sampled_per_s": sampled / rollout_s if rollout_s > 0 else 0.0,
        "time/rollout_s": rollout_s,
    }
    ended = [e.termination for e in episodes] + list(excluded)
    for reason in Termination:
        count = sum(1 for t in ended if t is reason)
        line[TERMINATION_PREFIX + reason] = count / len(ended) if ended else 0.0
    for reason in HISTORY_BREAK_REASONS:
        line[f"resets/{reason}"] = float(
            sum(e.trace_counts.history_breaks.get(reason, 0) for e in episodes)
        )
    for key in (
        "datums",
        "groups",
        "zero_variance_groups",
        "dropped_groups",
        "steps_per_datum",
        "incomplete_chains",
    ):
        line[key] = float(report.get(key, 0.0))
    if sampler_busy_s is not None:
        line["time/sampler_busy_s"] = sampler_busy_s
        line["sampler_utilization"] = sampler_busy_s / rollout_s if rollout_s > 0 else 0.0
    line |= {
        k: float(v)
        for k, v in report.items()
        if k.startswith(("advantage/", "samples/", "reward/"))
    }
    return line


def train_metrics(
    *,
    datums: Sequence[Datum],
    train: Mapping[str, float],
    train_s: float,
    step_s: float,
    weight_version: int,
) -> dict[str, float]:
    """The part of a metrics line the policy update adds: trained tokens, the update's
    metrics, times, the weight version and memory."""
    trained = sum(len(d.token_ids) for d in datums)
    line = {
        "tokens/trained": float(trained),
        "tokens/trained_per_s": trained / train_s if train_s > 0 and trained else 0.0,
        "time/train_s": train_s,
        "time/step_s": step_s,
        "weight_version": float(weight_version),
        "trained": 1.0 if train else 0.0,
    }
    line |= memory_metrics()
    line |= {(k if k.startswith(UNPREFIXED) else f"train/{k}"): float(v) for k, v in train.items()}
    return line


def memory_metrics() -> dict[str, float]:
    """``system/rss_gb`` (peak resident memory of this process so far) and
    ``system/rss_now_gb`` (resident memory now), in GB; each absent where unavailable."""
    line: dict[str, float] = {}
    try:
        import resource
    except ImportError:  # not on Windows
        return line
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    line["system/rss_gb"] = peak * (1 if sys.platform == "darwin" else 1024) / 1e9
    try:
        with open("/proc/self/statm", "rb") as statm:
            resident_pages = int(statm.read().split()[1])
    except (OSError, IndexError, ValueError):
        return line
    now = resident_pages * os.sysconf("SC_PAGE_SIZE") / 1e9
    # The kernel's counters lag by a few pages; a peak below the current figure is that lag.
    line["system/rss_gb"] = max(line["system/rss_gb"], now)
    line["system/rss_now_gb"] = now
    return line


def episode_record(
    step: int, episode: Episode, shaping: RewardShaping | None = None
) -> dict[str, Any]:
    """The ``episodes.jsonl`` record of one scored episode: its task, reward (the harness's,
    unshaped), termination, signals, whether a model call was ``truncated`` and the trace ids
    of each trajectory (its lineage, in order). With ``shaping`` it also holds
    ``shaped_reward``, the reward the advantages were computed from, and ``overlong_masked``,
    whether its actions were left out of the loss."""
    record = {
        "step": step,
        "episode_id": episode.episode_id,
        "task_id": episode.task_id,
        "group_id": episode.group_id,
        "session_id": episode.session_id,
        "reward": episode.reward,
        "termination": str(episode.termination),
        "signals": dict(episode.signals),
        "denied": episode.denied,
        "completion_tokens": completion_tokens(episode),
        "weight_version": episode_version(episode),
        "trajectories": [
            {"lineage_id": t.lineage_id, "trace_ids": [s.trace_id for s in t.steps]}
            for t in episode.trajectories
        ],
        "truncated": truncated(episode),
    }
    if shaping is not None:
        shaped = shaping.shape(episode)
        record["shaped_reward"] = shaped.reward
        record["overlong_masked"] = shaped.masked
    return record


def episode_version(episode: Episode) -> int:
    """The policy version behind ``episode``: the oldest among its model calls (0 without
    any)."""
    versions = [s.weight_version for t in episode.trajectories for s in t.steps]
    return min(versions) if versions else 0


def summarize(rows: Sequence[Mapping[str, Any]], *, window: int = 5) -> dict[str, Any]:
    """Totals and first/last-``window`` reward means over a run's metrics lines, as
    :data:`rllm_core.run.metric_names.SUMMARY` declares them.

    ``groups`` and ``zero_variance_groups`` are the datum builder's counts summed;
    ``groups_sampled`` and ``groups_filtered`` the dynamic sampling's (0 for lines without
    them).

    ``sampler_utilization`` is the sampler's busy seconds over the rollout seconds of the steps
    that report them (``None`` when none does). A ``last`` figure is that of the last line
    holding it (``None`` when none does)."""

    def mean(values: list[float]) -> float | None:
        return math.fsum(values) / len(values) if values else None

    out: dict[str, Any] = {"steps": len(rows)}
    for key, name, reduction in SUMMARY:
        if reduction is Reduction.SUM:
            out[key] = math.fsum(float(r.get(name, 0.0)) for r in rows)
        elif reduction is Reduction.LAST:
            out[key] = next((float(r[name]) for r in reversed(rows) if name in r), None)
        elif reduction is Reduction.MEAN:
            out[key] = mean([float(r[name]) for r in rows if name in r])
        else:
            values = [float(r[name]) for r in rows if name in r]
            out[key] = mean(
                values[:window] if reduction is Reduction.MEAN_FIRST else values[-window:]
            )
    clocked = [r for r in rows if SAMPLER_BUSY_S in r]
    clocked_rollout_s = math.fsum(float(r[ROLLOUT_S]) for r in clocked)
    busy_s = math.fsum(float(r[SAMPLER_BUSY_S]) for r in clocked)
    out["sampler_utilization"] = busy_s / clocked_rollout_s if clocked_rollout_s > 0 else None
    return out


def sft_summary(rows: Sequence[dict[str, Any]], *, window: int = 5) -> dict[str, Any]:
    """First and last NLL (means over ``window`` steps), the last eval NLL and tokens
    trained, from an SFT run's metrics lines."""
    nll = [float(r["train/nll"]) for r in rows if "train/nll" in r]
    evals = [float(r["eval/nll"]) for r in rows if "eval/nll" in r]
    return {
        "steps": len(rows),
        "nll_first": sum(nll[:window]) / len(nll[:window]) if nll else None,
        "nll_last": sum(nll[-window:]) / len(nll[-window:]) if nll else None,
        "eval_nll": evals[-1] if evals else None,
        "eval_nll_first": evals[0] if evals else None,
        "tokens_trained": sum(float(r.get("train/tokens", 0.0)) for r in rows),
    }
