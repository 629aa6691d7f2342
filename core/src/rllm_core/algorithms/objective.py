"""The training objective, composed once: a policy loss, auxiliary losses, one aggregation, the
ratio denominator the plan chose, rollout corrections and off-policy diagnostics.

An :class:`Objective` is built from the plan (:func:`rllm_core.training.update.build_objective`)
or by hand, and every trainer backend evaluates it the same way::

    step = objective.begin(action_masks, observation_masks)    # normalizers over the whole call
    for micro in micro_batches:
        total = step.evaluate(LossInputs(logprobs=..., rollout_logprobs=..., ...))
        total.backward()
    metrics = step.metrics()

What one evaluation does, on ``[B, T]`` tensors aligned so position ``t`` describes token ``t``:

1. **Ratio denominator.** ``old_logprobs`` in the :class:`~rllm_core.ports.LossContext` is the
   sampler's logprobs with ``proximal = "rollout"`` (every ratio is current / rollout, verl's
   bypass mode) and the trainer's logprobs computed once per batch before its first update
   with ``proximal = "recompute"`` (the inputs then carry them as ``proximal_logprobs``).
2. **Rollout correction.** With ``r = pi_trainer / pi_rollout`` per action token, where
   ``pi_trainer`` is the recomputed proximal policy when there is one and the current policy
   (without gradient) otherwise: truncated importance sampling weighs each action token by
   ``min(r, tis_cap)``; IcePop-style masking gives weight 0 to tokens whose ``r`` leaves
   ``[mask_low, mask_high]``. The weights carry no gradient and apply to every reduction over
   action tokens the losses make through ``ctx.aggregate``; observation-token reductions (an
   auxiliary loss on tool output) are left alone, the sampler having produced no logprob there.
3. **Terms.** The policy loss with coefficient 1, then each auxiliary loss times its
   coefficient; a coefficient of 0 leaves the loss out, so the result equals the policy loss
   alone bitwise.
4. **Regularizers** (:mod:`rllm_core.algorithms.reference_kl`): with ``kl`` in the loss,
   ``+ kl.coef * aggregate(kl_t)`` from ``ref_logprobs``; with ``entropy_coef``,
   ``- entropy_coef * aggregate(H_t)`` from ``entropy``; both over action tokens, with the
   step's normalizers and without correction weights. A coefficient of 0 adds nothing (the
   result is bitwise the same) and needs no input. Metrics ``kl/ref_mean``, ``kl/ref_max``
   and ``entropy/mean``.
5. **Diagnostics** between ``pi_trainer`` and the sampler on the sampled tokens (see
   :class:`OffPolicyStats`), and per-term metrics prefixed with the term's name.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rllm_core.algorithms.aggregation import (
    AGGREGATION_MODES,
    MaskAwareAggregate,
    StepAggregate,
    make_aggregate,
    step_normalizers,
)
from rllm_core.algorithms.reference_kl import ReferenceKL, kl_estimate
from rllm_core.ports.losses import Loss, LossContext, LossOutput

if TYPE_CHECKING:
    import torch

__all__ = [
    "PROXIMAL_MODES",
    "LossInputs",
    "Objective",
    "ObjectivePartial",
    "ObjectiveStep",
    "OffPolicyStats",
    "ReferenceKL",
    "RolloutCorrection",
    "Term",
]

PROXIMAL_MODES: tuple[str, ...] = ("rollout", "recompute")
"""What a ratio's denominator (``old_logprobs``) is: the sampler's logprobs, or the trainer's
computed once per batch before its first update."""

LOG_RATIO_LIMIT = 20.0
"""Trainer/sampler log-ratios are clamped to +-20 before ``exp`` (as losses do), so a token
the two disagree on wildly yields a finite weight and finite diagnostics."""


@dataclass(frozen=True, slots=True)
class Term:
    """One loss of the objective with the name its metrics carry (``dppo-tv``, ``echo-2``)
    and its coefficient (1 for the policy loss)."""

    name: str
    loss: Loss
    coef: float = 1.0


@dataclass(frozen=True, slots=True)
class RolloutCorrection:
    """Corrections for the gap between the sampler's and the trainer's policy, for any loss.

    ``tis_cap``: truncated importance sampling (Yao et al., "Your Efficient RL Framework
    Secretly Brings You Off-Policy RL Training", 2025): each action token is weighed by
    ``min(pi_trainer / pi_rollout, tis_cap)``. ``mask_low`` and ``mask_high``: IcePop
    (Ling Team, "Every Step Evolves", 2025): tokens whose ratio leaves ``[mask_low, mask_high]``
    get weight 0. Unset fields do nothing.
    """

    tis_cap: float | None = None
    mask_low: float | None = None
    mask_high: float | None = None

    def __post_init__(self) -> None:
        for label in ("tis_cap", "mask_low", "mask_high"):
            value = getattr(self, label)
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ValueError(f"{label} must be a finite positive number, got {value!r}")
        if (self.mask_low is None) != (self.mask_high is None):
            raise ValueError("set both mask_low and mask_high (the ratio range kept), or neither")
        if (
            self.mask_low is not None
            and self.mask_high is not None
            and not self.mask_low < 1.0 < self.mask_high
        ):
            raise ValueError(
                f"the kept ratio range [{self.mask_low}, {self.mask_high}] must contain 1"
                " (tokens on which trainer and sampler agree)"
            )

    @property
    def active(self) -> bool:
        return self.tis_cap is not None or self.mask_low is not None


@dataclass(frozen=True, slots=True)
class LossInputs:
    """One micro-batch, ``[B, T]`` right-padded tensors on the trainer's device.

    ``logprobs`` carry the gradient; ``proximal_logprobs`` are the trainer's logprobs computed
    before the batch's first update (required with ``proximal = "recompute"``, else ``None``).
    ``ref_logprobs``: the reference model's logprobs of the same tokens, without gradient
    (required with the KL in the loss, see :attr:`Objective.needs_reference`). ``entropy``:
    the policy's next-token entropy at each action token's predicting position, with
    gradient (required with ``entropy_coef > 0``, see :attr:`Objective.needs_entropy`); other
    positions are ignored.
    """

    logprobs: torch.Tensor
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor
    action_mask: torch.Tensor
    observation_mask: torch.Tensor
    proximal_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None


@dataclass(frozen=True)
class Objective:
    """What a trainer minimises; see the module docstring.

    ``terms`` holds the policy loss first (coefficient 1), then the auxiliary losses with a
    nonzero coefficient; names are unique (repeats get ``-2``, ``-3`` suffixes). ``kl`` and
    ``entropy_coef`` are the regularizers (off by default).
    """

    policy: Term
    aux: tuple[Term, ...] = ()
    aggregation: str = "token-mean"
    norm_length: float | None = None
    proximal: str = "rollout"
    correction: RolloutCorrection = field(default_factory=RolloutCorrection)
    kl: ReferenceKL = field(default_factory=ReferenceKL)
    entropy_coef: float = 0.0
    terms: tuple[Term, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATION_MODES:
            raise ValueError(
                f"unknown aggregation mode {self.aggregation!r}; valid modes:"
                f" {', '.join(AGGREGATION_MODES)}"
            )
        if self.proximal not in PROXIMAL_MODES:
            raise ValueError(
                f"unknown proximal mode {self.proximal!r}; valid: {', '.join(PROXIMAL_MODES)}"
            )
        coef = self.entropy_coef
        if (
            isinstance(coef, bool)
            or not isinstance(coef, int | float)
            or not math.isfinite(coef)
            or coef < 0
        ):
            raise ValueError(f"entropy_coef must be a finite number >= 0 (0: off), got {coef!r}")
        for index, term in enumerate(self.aux):
            coef = term.coef
            if (
                isinstance(coef, bool)
                or not isinstance(coef, int | float)
                or not math.isfinite(coef)
            ):
                raise ValueError(
                    f"aux_losses[{index}] has coefficient {coef!r} ({term.name!r}); give a"
                    " finite number (0 leaves the loss out)"
                )
        active = [Term(self.policy.name, self.policy.loss, 1.0)] + [
            Term(t.name, t.loss, float(t.coef)) for t in self.aux if t.coef != 0
        ]
        names = _unique([t.name for t in active])
        object.__setattr__(
            self,
            "terms",
            tuple(Term(n, t.loss, t.coef) for n, t in zip(names, active, strict=True)),
        )
        if self.aggregation == "seq-mean-token-sum-norm":
            make_aggregate(
                self.aggregation, total_tokens=0, total_sequences=0, norm_length=self.norm_length
            )

    @classmethod
    def of(
        cls,
        loss: Loss,
        aux_losses: Sequence[tuple[Loss, float]] = (),
        *,
        name: str | None = None,
        **options: Any,
    ) -> Objective:
        """An objective from bare losses (tests, scripts): each term is named by its ``name``
        attribute when it has one, else by its class name in kebab case."""
        return cls(
            policy=Term(name or _default_name(loss), loss),
            aux=tuple(Term(_default_name(aux), aux, coef) for aux, coef in aux_losses),
            **options,
        )

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.terms]

    @property
    def reads_observations(self) -> bool:
        """Whether some term may read logprobs outside the action mask (see the ``Loss``
        port's ``reads_observations``); when not, a trainer may compute action positions only."""
        return any(getattr(t.loss, "reads_observations", True) for t in self.terms)

    @property
    def needs_reference(self) -> bool:
        """Whether the run computes the reference model's logprobs (the KL is on, in the
        loss or in the reward)."""
        return self.kl.active

    @property
    def needs_entropy(self) -> bool:
        """Whether a trainer must pass ``LossInputs.entropy`` (``entropy_coef > 0``)."""
        return self.entropy_coef > 0

    def begin(
        self,
        action_masks: Sequence[torch.Tensor],
        observation_masks: Sequence[torch.Tensor],
    ) -> ObjectiveStep:
        """Start one ``forward_backward`` call: count its normalizers over every micro-batch's
        masks (``[B, T]`` each), so the gradient does not depend on how it is split."""
        return ObjectiveStep(self, action_masks, observation_masks)


class ObjectiveStep:
    """The objective over one ``forward_backward`` call: evaluates micro-batches and collects
    their metrics."""

    def __init__(
        self,
        objective: Objective,
        action_masks: Sequence[torch.Tensor],
        observation_masks: Sequence[torch.Tensor],
    ) -> None:
        self.objective = objective
        self.action_tokens, action_sequences = step_normalizers(action_masks)
        self.observation_tokens, observation_sequences = step_normalizers(observation_masks)
        self._action = make_aggregate(
            objective.aggregation,
            total_tokens=self.action_tokens,
            total_sequences=action_sequences,
            norm_length=objective.norm_length,
        )
        self._observation = make_aggregate(
            objective.aggregation,
            total_tokens=self.observation_tokens,
            total_sequences=observation_sequences,
            norm_length=objective.norm_length,
        )
        self._sums: dict[str, float] = defaultdict(float)
        self._means = _WeightedMeans()
        self._maxima: dict[str, float] = {}
        self.offpolicy = OffPolicyStats()

    def evaluate(self, inputs: LossInputs) -> torch.Tensor:
        """The objective's value on one micro-batch, with its gradient; records metrics."""
        import torch

        objective = self.objective
        action = inputs.action_mask != 0
        if objective.proximal == "recompute":
            if inputs.proximal_logprobs is None:
                raise ValueError(
                    "proximal = 'recompute' needs the trainer's logprobs from before the batch's"
                    " first update (LossInputs.proximal_logprobs); the backend did not pass them"
                )
            old = inputs.proximal_logprobs
        else:
            old = inputs.rollout_logprobs
        trainer = (
            inputs.proximal_logprobs
            if inputs.proximal_logprobs is not None
            else inputs.logprobs.detach()
        )
        log_ratio = (trainer - inputs.rollout_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        log_ratio = torch.where(action, log_ratio, torch.zeros_like(log_ratio))
        self.offpolicy.add(log_ratio, trainer, inputs.rollout_logprobs, action)
        weights = self._correction_weights(log_ratio, action)
        aggregate = _CorrectedAggregate(
            action=self._action,
            observation=self._observation,
            action_mask=inputs.action_mask,
            observation_mask=inputs.observation_mask,
            weights=weights,
        )
        context = LossContext(
            logprobs=inputs.logprobs,
            old_logprobs=old,
            rollout_logprobs=inputs.rollout_logprobs,
            advantages=inputs.advantages,
            action_mask=inputs.action_mask,
            observation_mask=inputs.observation_mask,
            aggregate=aggregate,
        )
        total: torch.Tensor | None = None
        for term in objective.terms:
            aggregate.selected = 0
            value = _checked_loss(term.loss(context), term.name, self._means, aggregate)
            self._sums[f"{term.name}/loss"] += float(value.detach())
            total = value if total is None else total + term.coef * value
        assert total is not None
        total = self._regularize(total, inputs, action)
        self._sums["loss"] += float(total.detach())
        return total

    def _regularize(
        self, total: torch.Tensor, inputs: LossInputs, action: torch.Tensor
    ) -> torch.Tensor:
        import torch

        objective = self.objective
        tokens = float(action.sum())
        if objective.kl.in_loss:
            if inputs.ref_logprobs is None:
                raise ValueError(
                    "[algorithm.kl] in = 'loss' needs the reference model's logprobs"
                    " (LossInputs.ref_logprobs); the backend did not pass them"
                )
            zero = torch.zeros_like(inputs.logprobs)
            # Masking the inputs, not the estimate, keeps padding's gradient finite (k3 of a
            # meaningless log-ratio can overflow).
            values = kl_estimate(
                torch.where(action, inputs.logprobs, zero),
                torch.where(action, inputs.ref_logprobs.to(zero.dtype), zero),
                objective.kl.estimator,
            )
            total = total + objective.kl.coef * self._action(values, inputs.action_mask)
            if tokens:
                selected = values.detach()[action].double()
                self._means.add("kl/ref_mean", float(selected.mean()), tokens)
                self._max("kl/ref_max", float(selected.max()))
        if objective.needs_entropy:
            if inputs.entropy is None:
                raise ValueError(
                    "[algorithm].entropy_coef > 0 needs the policy's entropy"
                    " (LossInputs.entropy); the backend did not pass it"
                )
            entropy = torch.where(action, inputs.entropy, torch.zeros_like(inputs.entropy))
            total = total - objective.entropy_coef * self._action(entropy, inputs.action_mask)
            if tokens:
                self._means.add(
                    "entropy/mean", float(entropy.detach()[action].double().mean()), tokens
                )
        return total

    def _max(self, name: str, value: float) -> None:
        self._maxima[name] = max(self._maxima.get(name, -math.inf), value)

    def _correction_weights(
        self, log_ratio: torch.Tensor, action: torch.Tensor
    ) -> torch.Tensor | None:
        import torch

        correction = self.objective.correction
        if not correction.active:
            return None
        ratio = log_ratio.exp()
        weights = torch.ones_like(ratio)
        tokens = float(action.sum())
        if correction.tis_cap is not None:
            weights = ratio.clamp(max=correction.tis_cap)
            capped = (ratio > correction.tis_cap) & action
            self._means.add(
                "correction/tis_capped_fraction", float(capped.sum()) / max(tokens, 1), tokens
            )
        if correction.mask_low is not None and correction.mask_high is not None:
            kept = (ratio >= correction.mask_low) & (ratio <= correction.mask_high)
            weights = torch.where(kept, weights, torch.zeros_like(weights))
            dropped = (~kept) & action
            self._means.add(
                "correction/masked_fraction", float(dropped.sum()) / max(tokens, 1), tokens
            )
        weights = torch.where(action, weights, torch.zeros_like(weights)).detach()
        if tokens:
            self._means.add(
                "correction/weight_mean", float(weights[action].double().mean()), tokens
            )
        return weights

    def metrics(self) -> dict[str, float]:
        """``loss`` (the total), ``<name>/loss`` and each term's own metrics as
        ``<name>/<metric>`` (means over micro-batches weighted by the tokens the term reduced
        over), ``correction/*`` when a correction is on, ``kl/ref_mean``, ``kl/ref_max`` and
        ``entropy/mean`` when those regularizers are in the loss, ``offpolicy/*`` (see
        :class:`OffPolicyStats`), and ``action_tokens`` / ``observation_tokens``."""
        out = dict(self._sums) | self._means.result() | self._maxima | self.offpolicy.result()
        out["action_tokens"] = float(self.action_tokens)
        out["observation_tokens"] = float(self.observation_tokens)
        return out

    def partial(self) -> ObjectivePartial:
        """What this step accumulated over the micro-batches it evaluated, as plain picklable
        values: a trainer that splits one call's micro-batches across processes gathers every
        process's partial and :meth:`merge` s them, so :meth:`metrics` describes the whole
        call."""
        means = self._means
        return ObjectivePartial(
            sums=dict(self._sums),
            weighted=dict(means._weighted),
            weights=dict(means._weights),
            plain={name: list(values) for name, values in means._plain.items()},
            offpolicy=self.offpolicy.partial(),
            maxima=dict(self._maxima),
        )

    def merge(self, partials: Sequence[ObjectivePartial]) -> None:
        """Replace what this step accumulated with the union of ``partials`` (this step's own
        among them), taken in order: sums add, weighted means pool their weights, off-policy
        statistics pool their tokens. The normalizers are not touched: every process counted
        them over the whole call."""
        sums: dict[str, float] = defaultdict(float)
        means = _WeightedMeans()
        offpolicy = OffPolicyStats()
        maxima: dict[str, float] = {}
        for part in partials:
            for name, value in part.maxima.items():
                maxima[name] = max(maxima.get(name, -math.inf), value)
            for name, value in part.sums.items():
                sums[name] += value
            for name, values in part.plain.items():
                means._weighted[name] += part.weighted.get(name, 0.0)
                means._weights[name] += part.weights.get(name, 0.0)
                means._plain[name].extend(values)
            offpolicy.absorb(part.offpolicy)
        self._sums, self._means, self.offpolicy = sums, means, offpolicy
        self._maxima = maxima


@dataclass(frozen=True, slots=True)
class ObjectivePartial:
    """The metric accumulators of one :class:`ObjectiveStep` (see
    :meth:`ObjectiveStep.partial`); plain floats and lists, so it pickles."""

    sums: dict[str, float]
    weighted: dict[str, float]
    weights: dict[str, float]
    plain: dict[str, list[float]]
    offpolicy: dict[str, float]
    maxima: dict[str, float] = field(default_factory=dict)


class OffPolicyStats:
    """How far the trainer's policy is from the sampler's on the sampled tokens, accumulated
    over micro-batches. With ``log r = log pi_trainer - log pi_rollout`` per action token:

    - ``offpolicy/k1``: mean of ``-log r``, the plain estimate of KL(rollout || trainer);
    - ``offpolicy/k3``: mean of ``r - 1 - log r``, the low-variance, never negative estimate of
      the same KL (Schulman's k3); exactly 0 when the logprobs agree;
    - ``offpolicy/chi2``: mean of ``r**2`` minus 1, the chi-squared divergence estimate that
      bounds the variance of importance weights;
    - ``offpolicy/ratio_mean``, ``offpolicy/ratio_min``, ``offpolicy/ratio_max``: of ``r``;
    - ``offpolicy/trainer_ppl``, ``offpolicy/sampler_ppl``: ``exp`` of minus the mean logprob
      each side gave the sampled tokens.
    """

    def __init__(self) -> None:
        self.tokens = 0
        self._sum_neg_log = 0.0
        self._sum_k3 = 0.0
        self._sum_ratio = 0.0
        self._sum_ratio2 = 0.0
        self._sum_trainer = 0.0
        self._sum_sampler = 0.0
        self._min = math.inf
        self._max = -math.inf

    def add(
        self,
        log_ratio: torch.Tensor,
        trainer_logprobs: torch.Tensor,
        rollout_logprobs: torch.Tensor,
        mask: torch.Tensor,
    ) -> None:
        count = int(mask.sum())
        if not count:
            return
        lr = log_ratio.detach()[mask].double()
        ratio = lr.exp()
        self.tokens += count
        self._sum_neg_log += float(-lr.sum())
        self._sum_k3 += float((ratio - 1.0 - lr).sum())
        self._sum_ratio += float(ratio.sum())
        self._sum_ratio2 += float((ratio * ratio).sum())
        self._sum_trainer += float(trainer_logprobs.detach()[mask].double().sum())
        self._sum_sampler += float(rollout_logprobs.detach()[mask].double().sum())
        self._min = min(self._min, float(ratio.min()))
        self._max = max(self._max, float(ratio.max()))

    _FIELDS = (
        "_sum_neg_log",
        "_sum_k3",
        "_sum_ratio",
        "_sum_ratio2",
        "_sum_trainer",
        "_sum_sampler",
    )

    def partial(self) -> dict[str, float]:
        """The accumulated sums, token count, minimum and maximum as plain floats."""
        out = {name: getattr(self, name) for name in self._FIELDS}
        out |= {"tokens": float(self.tokens), "min": self._min, "max": self._max}
        return out

    def absorb(self, partial: dict[str, float]) -> None:
        """Add the statistics another accumulator's :meth:`partial` returned."""
        if not partial["tokens"]:
            return
        self.tokens += int(partial["tokens"])
        for name in self._FIELDS:
            setattr(self, name, getattr(self, name) + partial[name])
        self._min = min(self._min, partial["min"])
        self._max = max(self._max, partial["max"])

    def result(self) -> dict[str, float]:
        if not self.tokens:
            return {}
        n = self.tokens
        return {
            "offpolicy/k1": self._sum_neg_log / n,
            "offpolicy/k3": self._sum_k3 / n,
            "offpolicy/chi2": self._sum_ratio2 / n - 1.0,
            "offpolicy/ratio_mean": self._sum_ratio / n,
            "offpolicy/ratio_min": self._min,
            "offpolicy/ratio_max": self._max,
            "offpolicy/trainer_ppl": _safe_exp(-self._sum_trainer / n),
            "offpolicy/sampler_ppl": _safe_exp(-self._sum_sampler / n),
        }


class _CorrectedAggregate(MaskAwareAggregate):
    """The mask-aware aggregate, weighing action-token values by the correction weights and
    counting the tokens a term reduced over (its metrics' weight across micro-batches)."""

    def __init__(
        self,
        *,
        action: StepAggregate,
        observation: StepAggregate,
        action_mask: torch.Tensor,
        observation_mask: torch.Tensor,
        weights: torch.Tensor | None,
    ) -> None:
        super().__init__(
            action=action,
            observation=observation,
            action_mask=action_mask,
            observation_mask=observation_mask,
        )
        self._weights = weights
        self.selected = 0

    def __call__(
        self, values: torch.Tensor, mask: torch.Tensor, *, mode: str | None = None
    ) -> torch.Tensor:
        self.selected += int((mask != 0).sum())
        if self.is_observation(mask):
            return self.observation(values, mask, mode=mode)
        if self._weights is not None and values.shape == self._weights.shape:
            values = values * self._weights
        return self.action(values, mask, mode=mode)


class _WeightedMeans:
    def __init__(self) -> None:
        self._weighted: dict[str, float] = defaultdict(float)
        self._weights: dict[str, float] = defaultdict(float)
        self._plain: dict[str, list[float]] = defaultdict(list)

    def add(self, name: str, value: float, weight: float) -> None:
        self._weighted[name] += float(value) * weight
        self._weights[name] += weight
        self._plain[name].append(float(value))

    def result(self) -> dict[str, float]:
        out = {}
        for name, values in self._plain.items():
            weight = self._weights[name]
            out[name] = self._weighted[name] / weight if weight > 0 else sum(values) / len(values)
        return out


def _checked_loss(
    output: LossOutput, name: str, means: _WeightedMeans, aggregate: _CorrectedAggregate
) -> torch.Tensor:
    import torch

    value = getattr(output, "loss", None)
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(
            f"loss {name!r} returned {shape} as its loss; a loss returns"
            " LossOutput(loss=<0-dim tensor>)"
        )
    for key, metric in output.metrics.items():
        means.add(f"{name}/{key}", float(metric), float(aggregate.selected))
    return value


def _unique(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return out


def _default_name(loss: Any) -> str:
    import re

    name = getattr(loss, "name", None)
    if isinstance(name, str) and name:
        return name
    return re.sub(
        r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", type(loss).__name__
    ).lower()


def _safe_exp(value: float) -> float:
    return math.exp(min(value, 700.0))
