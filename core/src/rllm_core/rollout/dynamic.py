"""Dynamic sampling: roll out more task groups until a step has enough that carry a signal.

A group whose scored rewards are all equal gets an advantage of zero for every episode under a
group-relative estimator (GRPO and its family), so it trains nothing. With
``[algorithm].filter_groups = "zero-variance"`` a step rolls out its ``batch_size`` groups, and
while fewer than ``batch_size`` of them are informative (two or more scored episodes whose
rewards differ) it rolls out more tasks, taken from the run's data order, up to
``max_sample_batches`` rounds in all. Each extra round asks for the missing groups divided by the
share of informative groups seen so far in this step (all of ``batch_size`` when none was),
never more than ``batch_size``; a task the step already rolled out (the data order wrapped into
its next epoch) is skipped, and a round left with none ends the sampling. The first
``batch_size`` informative groups, in sampling order, are trained; the zero-variance groups
are left out (``groups/filtered``) and informative ones beyond ``batch_size`` too
(``groups/surplus``). A step whose rounds run out trains on the informative groups it has
(``groups/short`` is how many it lacked).

:func:`sample_informative` is used by both pipelines (``sync`` in the training loop, ``async``
in the rollout producer); ``filter_groups = "none"`` is one round, every group kept.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from rllm_core.rollout.records import RolloutBatch
from rllm_core.types import DEFAULT_MASK, Episode, Task, Termination

__all__ = ["FILTER_MODES", "SampledStep", "informative", "sample_informative"]

FILTER_MODES = ("none", "zero-variance")


def informative(group: Sequence[Episode], mask: frozenset[Termination] = DEFAULT_MASK) -> bool:
    """Whether a group's scored episodes (those whose termination ``mask`` does not name)
    carry a group-relative signal: two or more, with rewards that differ."""
    rewards = [episode.reward for episode in group if episode.termination not in mask]
    return len(rewards) >= 2 and any(reward != rewards[0] for reward in rewards)


@dataclass(frozen=True)
class SampledStep:
    """What one step rolled out over its rounds.

    ``batch`` merges the rounds: its ``groups`` are those to build datums from (every group
    without filtering; with it, the trained informative groups followed by the zero-variance
    groups, which the datum builder counts and drops), its failures, retries and wall seconds
    summed. ``episodes`` are every scored episode of every round (surplus groups included:
    they describe the policy) and ``tasks`` every task rolled out, in order.
    """

    batch: RolloutBatch
    episodes: list[Episode]
    tasks: list[Task]
    rounds: int
    sampled: int
    filtered: int
    surplus: int
    short: int

    def metrics(self) -> dict[str, float]:
        """``groups/sampled``, ``groups/filtered``, ``groups/surplus``, ``groups/short`` and
        ``groups/sample_batches`` (rounds) as floats."""
        return {
            "groups/sampled": float(self.sampled),
            "groups/filtered": float(self.filtered),
            "groups/surplus": float(self.surplus),
            "groups/short": float(self.short),
            "groups/sample_batches": float(self.rounds),
        }


async def sample_informative(
    run: Callable[[list[Task]], Awaitable[RolloutBatch]],
    first: list[Task],
    take: Callable[[int], list[Task]],
    *,
    batch_size: int,
    filter_groups: str = "none",
    max_sample_batches: int = 1,
    check: Callable[[RolloutBatch, list[Task]], None] = lambda batch, tasks: None,
    mask: frozenset[Termination] = DEFAULT_MASK,
) -> SampledStep:
    """Roll out ``first`` with ``run``, then, with ``filter_groups = "zero-variance"``, as
    many more tasks from ``take(n)`` as the module docstring says. ``check`` sees each round's
    batch and tasks (it raises to end the step, as too many failed rollouts do); ``mask`` is
    the rollouts' ``[rollout].mask`` (see :func:`informative`)."""
    if filter_groups not in FILTER_MODES:
        raise ValueError(f"filter_groups {filter_groups!r} is not one of {FILTER_MODES}")
    tasks = list(first)
    rounds: list[RolloutBatch] = []
    groups: list[list[Episode]] = []
    round_tasks = list(first)
    while True:
        batch = await run(round_tasks)
        check(batch, round_tasks)
        rounds.append(batch)
        groups.extend(batch.groups)
        if filter_groups == "none":
            break
        found = sum(1 for group in groups if informative(group, mask))
        missing = batch_size - found
        if missing <= 0 or len(rounds) >= max_sample_batches:
            break
        wanted = math.ceil(missing * len(groups) / found) if found else batch_size
        # A task already rolled out in this step would reuse its sessions: skip it.
        seen = {task.task_id for task in tasks}
        round_tasks = [
            t for t in take(min(batch_size, max(missing, wanted))) if t.task_id not in seen
        ]
        if not round_tasks:
            break
        tasks.extend(round_tasks)

    episodes = [episode for group in groups for episode in group]
    signal = [group for group in groups if informative(group, mask)]
    flat = [group for group in groups if group and not informative(group, mask)]
    kept = groups if filter_groups == "none" else signal[:batch_size] + flat
    merged = RolloutBatch(
        groups=kept,
        infra_failures=[failure for batch in rounds for failure in batch.infra_failures],
        retries=sum(batch.retries for batch in rounds),
        wall_s=sum(batch.wall_s for batch in rounds),
        episodes_done=sum(batch.episodes_done for batch in rounds),
    )
    if filter_groups == "none":
        return SampledStep(merged, episodes, tasks, 1, len(groups), 0, 0, 0)
    trained = min(len(signal), batch_size)
    return SampledStep(
        batch=merged,
        episodes=episodes,
        tasks=tasks,
        rounds=len(rounds),
        sampled=len(groups),
        filtered=len(flat),
        surplus=len(signal) - trained,
        short=batch_size - trained,
    )
