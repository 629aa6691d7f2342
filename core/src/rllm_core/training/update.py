"""One step's policy update: the plan's objective, applied ``epochs`` times over ``mini_batches``
slices of the step's datums, one optimizer step per slice.

With ``[algorithm].proximal = "recompute"`` the trainer's logprobs of every datum are computed
once, before the first update, and travel with the datums as ``proximal_logprobs``; with
``"rollout"`` (the default) the sampler's logprobs are the ratio denominator and nothing is
recomputed.

With ``[algorithm.kl]`` on, the trainer's reference logprobs of every datum
(:class:`~rllm_core.ports.ReferenceScorer`) are computed once, before the first update, after
the proximal ones: in the loss they travel with the datums as ``ref_logprobs``; in the reward
they lower each action token's advantage by ``coef * kl_t`` there and then
(:func:`~rllm_core.algorithms.reference_kl.penalize_advantages`), and the step reports
``kl/ref_mean`` and ``kl/ref_max`` of that batch.

The step's metrics merge those of its ``forward_backward`` and ``optim_step`` calls by the
rules declared with their names in :data:`rllm_core.run.metric_names.PASS_RULES`:
``offpolicy/*``, ``correction/*``, the token and sequence counts and a backend's counts of
dropped datums (``<name>/dropped_*``) come from the first epoch (each datum's first pass; the
counts are summed over its mini-batches); ``<name>/skipped_step`` is summed over every call
(the optimizer steps the backend skipped); ``*_min`` and ``*_max`` keep the extreme; ``step``
and ``learning_rate`` the last call's; every other figure is the mean over calls weighted by
their action tokens. ``optimizer_steps`` counts the calls, skipped or not.

A slice's ``forward_backward`` and ``optim_step`` run as one call on the trainer's thread:
a sampler that shares the weights (the torch backend's) then cannot start sequences between
them and hold the optimizer step up.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec

from rllm_core.algorithms.objective import Objective, RolloutCorrection, Term
from rllm_core.algorithms.reference_kl import ReferenceKL, penalize_advantages
from rllm_core.plan import ResolvedPlan
from rllm_core.plan.aggregation_check import effective_aggregation
from rllm_core.run.metric_names import ACTION_TOKENS, Reduction, pass_rule
from rllm_core.types import Datum

__all__ = ["build_objective", "merge_pass_metrics", "split_mini_batches", "update_policy"]


def build_objective(
    resolved: ResolvedPlan, loss: Any, aux_losses: Sequence[tuple[Any, float]]
) -> Objective:
    """The objective of a resolved plan from its built losses (``aux_losses`` in plan order);
    each term is named after the component the plan selected. It reduces with the mode a loss
    pins when the plan leaves ``[algorithm].aggregation`` unset
    (:mod:`rllm_core.plan.aggregation_check`)."""
    algorithm = resolved.plan.algorithm
    policy = resolved.get("[algorithm].loss")
    aux_names = [c.name for c in resolved if c.where.startswith("[algorithm].aux_losses")]
    if policy is None or len(aux_names) != len(aux_losses):
        # Components assembled by hand rather than from the plan: name terms by their losses.
        named = Objective.of(loss, aux_losses)
        policy_name, aux_names = named.policy.name, [t.name for t in named.aux]
    else:
        policy_name = policy.name
    correction = algorithm.correction
    return Objective(
        policy=Term(policy_name, loss),
        aux=tuple(
            Term(name, instance, coef)
            for name, (instance, coef) in zip(aux_names, aux_losses, strict=True)
        ),
        aggregation=effective_aggregation(resolved.plan, resolved.components),
        norm_length=algorithm.norm_length,
        proximal=algorithm.proximal,
        correction=RolloutCorrection(
            tis_cap=correction.tis_cap,
            mask_low=correction.mask_low,
            mask_high=correction.mask_high,
        ),
        kl=ReferenceKL(
            coef=algorithm.kl.coef,
            estimator=algorithm.kl.estimator,
            apply_in=algorithm.kl.apply_in,
        ),
        entropy_coef=algorithm.entropy_coef,
    )


def split_mini_batches(datums: Sequence[Datum], count: int) -> list[list[Datum]]:
    """``datums`` in order, in ``count`` contiguous slices whose sizes differ by at most one
    (fewer, none empty, when there are fewer datums than ``count``)."""
    count = max(1, min(count, len(datums)))
    size, extra = divmod(len(datums), count)
    out, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        out.append(list(datums[start:end]))
        start = end
    return out


async def update_policy(
    trainer: Any,
    datums: Sequence[Datum],
    objective: Objective,
    *,
    epochs: int,
    mini_batches: int,
    call: Callable[[Callable[[], Any]], Awaitable[Any]],
    after_step: Callable[[], Awaitable[Any]] | None = None,
) -> dict[str, float]:
    """Train on ``datums`` as the module docstring says; ``call`` runs each trainer call (the
    loop's trainer thread), ``after_step`` is awaited after every ``optim_step`` (a run with a
    ``[sampler]`` moves its servers to the new version there). Returns the merged metrics."""
    if objective.proximal == "recompute":
        scored = await call(functools.partial(trainer.compute_logprobs, list(datums)))
        datums = [
            msgspec.structs.replace(datum, proximal_logprobs=[float(v) for v in values])
            for datum, values in zip(datums, scored, strict=True)
        ]
    reference_metrics: dict[str, float] = {}
    if objective.needs_reference:
        datums, reference_metrics = await _with_reference(trainer, datums, objective, call)
    slices = split_mini_batches(datums, mini_batches)
    passes: list[tuple[int, Mapping[str, float], Mapping[str, float]]] = []
    for epoch in range(epochs):
        for chunk in slices:
            fb, opt = await call(functools.partial(_one_pass, trainer, chunk, objective))
            passes.append((epoch, fb, opt))
            if after_step is not None:
                await after_step()
    return merge_pass_metrics(passes) | reference_metrics


def _one_pass(
    trainer: Any, chunk: Sequence[Datum], objective: Objective
) -> tuple[dict[str, float], dict[str, float]]:
    return trainer.forward_backward(chunk, objective), trainer.optim_step()


async def _with_reference(
    trainer: Any,
    datums: Sequence[Datum],
    objective: Objective,
    call: Callable[[Callable[[], Any]], Awaitable[Any]],
) -> tuple[list[Datum], dict[str, float]]:
    scorer = getattr(trainer, "compute_ref_logprobs", None)
    if scorer is None:
        raise TypeError(
            f"[algorithm.kl] coef > 0 needs reference logprobs, which trainer"
            f" {type(trainer).__name__} cannot compute (no compute_ref_logprobs); set"
            " [algorithm.kl] coef = 0 or use a trainer backend with the reference_kl trait"
        )
    scored = await call(functools.partial(scorer, list(datums)))
    if objective.kl.in_reward:
        return penalize_advantages(datums, scored, objective.kl)
    return [
        msgspec.structs.replace(datum, ref_logprobs=[float(v) for v in values])
        for datum, values in zip(datums, scored, strict=True)
    ], {}


def merge_pass_metrics(
    passes: Sequence[tuple[int, Mapping[str, float], Mapping[str, float]]],
) -> dict[str, float]:
    """Merge ``(epoch, forward_backward metrics, optim_step metrics)`` per call; see the
    module docstring."""
    if not passes:
        return {}
    weights = [float(fb.get(ACTION_TOKENS, 0.0)) for _, fb, _ in passes]
    out: dict[str, float] = {}
    names = {name for _, fb, opt in passes for name in (*fb, *opt)}
    for name in sorted(names):
        rule = pass_rule(name)
        rows = [
            (float({**fb, **opt}[name]), weight)
            for (epoch, fb, opt), weight in zip(passes, weights, strict=True)
            if name in fb or name in opt
            if not rule.first_epoch or epoch == 0
        ]
        if not rows:
            continue
        values = [value for value, _ in rows]
        if rule.reduction is Reduction.SUM:
            out[name] = sum(values)
        elif rule.reduction is Reduction.LAST:
            out[name] = values[-1]
        elif rule.reduction is Reduction.MIN:
            out[name] = min(values)
        elif rule.reduction is Reduction.MAX:
            out[name] = max(values)
        else:
            total = sum(weight for _, weight in rows)
            out[name] = (
                sum(value * weight for value, weight in rows) / total
                if total > 0
                else sum(values) / len(values)
            )
    out["optimizer_steps"] = float(len(passes))
    return out
