"""Entry module of rllm-loss-ppo: config models and the specs the registry hook yields.

Imports only ``rllm_core``, pydantic and the standard library; every implementation is named
with :func:`rllm_core.lazy`, so torch loads only when a plan builds a loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import ComponentSpec, hookimpl, lazy
from rllm_core.plan.schema import KL_ESTIMATORS, AggregationMode
from rllm_core.ports import NativeLoss

__all__ = [
    "CISPOConfig",
    "GSPOConfig",
    "PPOClipConfig",
    "ReinforceKLConfig",
    "ReinforceLossConfig",
    "rllm_losses",
]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# ---------------------------------------------------------------- policy losses


class PPOClipConfig(_Config):
    """Clipped surrogate of PPO with decoupled clip ranges and optional dual clip."""

    eps_low: float = Field(
        0.2,
        ge=0.0,
        lt=1.0,
        description="The ratio is clipped below at 1 - eps_low (PPO's epsilon, 0.2).",
    )
    eps_high: float = Field(
        0.2,
        ge=0.0,
        description=(
            "The ratio is clipped above at 1 + eps_high. 0.2 is symmetric PPO; DAPO's"
            " 'clip-higher' uses 0.28 so that unlikely tokens can gain probability faster."
        ),
    )
    dual_clip_c: float | None = Field(
        None,
        gt=1.0,
        description=(
            "Dual-clip constant c (> 1): for negative advantages the per-token loss is capped at"
            " c * |A|, so one token with a huge ratio cannot dominate the step. Unset disables it."
        ),
    )

    def native_loss(self) -> NativeLoss | str:
        """The managed services' ``ppo`` kernel with the ratio clipped to
        ``[1 - eps_low, 1 + eps_high]``; none with a dual clip, which that kernel lacks."""
        if self.dual_clip_c is not None:
            return "dual_clip_c has no parameter in the services' 'ppo' kernel"
        return NativeLoss("ppo", 1.0 - self.eps_low, 1.0 + self.eps_high)


class CISPOConfig(_Config):
    """Clipped importance-sampling weight, detached, times the logprob (MiniMax-M1)."""

    eps_low: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description=(
            "The weight is clipped below at 1 - eps_low. 1.0 (a floor of 0) imposes no lower"
            " bound, as in MiniMax-M1, which tunes only the upper bound."
        ),
    )
    eps_high: float = Field(
        0.28,
        ge=0.0,
        description="The weight is clipped above at 1 + eps_high.",
    )

    def native_loss(self) -> NativeLoss:
        """The managed services' ``cispo`` kernel with the weight clipped to
        ``[1 - eps_low, 1 + eps_high]``."""
        return NativeLoss("cispo", 1.0 - self.eps_low, 1.0 + self.eps_high)


class GSPOConfig(_Config):
    """Sequence-level ratio (geometric mean of token ratios), clipped, broadcast per token."""

    eps_low: float = Field(
        3e-4,
        ge=0.0,
        lt=1.0,
        description=(
            "The sequence ratio is clipped below at 1 - eps_low. Sequence ratios stay much closer"
            " to 1 than token ratios, hence the GSPO paper's small 3e-4."
        ),
    )
    eps_high: float = Field(
        4e-4,
        ge=0.0,
        description="The sequence ratio is clipped above at 1 + eps_high (GSPO paper: 4e-4).",
    )

    def native_loss(self) -> str:
        return (
            "the services' SDKs list a 'gspo' kernel without documenting its formula or"
            " config, so its objective cannot be checked against this loss"
        )


class ReinforceLossConfig(_Config):
    """Importance-sampled REINFORCE with an optional cap on the weight."""

    ratio_cap: float | None = Field(
        None,
        gt=0.0,
        description=(
            "Cap on the detached importance weight (truncated importance sampling). Unset keeps"
            " the full ratio, which is exactly 1 when training is on-policy."
        ),
    )

    def native_loss(self) -> NativeLoss | str:
        """The managed services' ``importance_sampling`` kernel (gradient ``-r * A`` per
        token, as this loss's); none with a ``ratio_cap``, which that kernel lacks."""
        if self.ratio_cap is not None:
            return "ratio_cap has no parameter in the services' 'importance_sampling' kernel"
        return NativeLoss("importance_sampling")


class ReinforceKLConfig(_Config):
    """Importance-sampled REINFORCE with a clamped weight and a KL term anchored on the
    sampler's logprobs."""

    kl_coef: float = Field(
        0.1,
        ge=0.0,
        description=(
            "Weight of the KL term between the trained policy and the sampler's logprobs, added"
            " to the policy-gradient term per action token (0: plain clamped REINFORCE)."
        ),
    )
    direction: Literal["forward", "backward"] = Field(
        "forward",
        description=(
            "Which KL the term estimates on the sampled tokens: `forward`, KL(sampler || policy)"
            " (log-ratio sampler over policy; the tokens were drawn from the sampler, so k1 and"
            " k3 are unbiased estimates of it); `backward`, KL(policy || sampler) (log-ratio"
            " policy over sampler)."
        ),
    )
    kl_approx: Literal[KL_ESTIMATORS] = Field(  # type: ignore[valid-type]
        "k3",
        description=(
            "The per-token KL estimator, as [algorithm.kl] estimator defines them: k1 (the"
            " log-ratio), k2 (half its square), k3 (exp(-log r) - 1 + log r, never negative),"
            " low-var-kl (k3 with clamps)."
        ),
    )
    ratio_clamp_min: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description=(
            "Lower bound of the detached importance weight exp(logprobs - old_logprobs)"
            " (unset: none)."
        ),
    )
    ratio_clamp_max: float | None = Field(
        None,
        ge=1.0,
        description=(
            "Upper bound of the detached importance weight (truncated importance sampling;"
            " unset: none)."
        ),
    )
    aggregation: AggregationMode | None = Field(
        None,
        description=(
            "Pin the aggregation mode this loss reduces with: the run then uses it when"
            " [algorithm].aggregation is unset, and plan check refuses a plan that sets"
            " another. Unset: the plan's."
        ),
    )

    def pinned_aggregation(self) -> str | None:
        """The aggregation mode this loss pins (``aggregation``), or ``None``."""
        return self.aggregation


# ---------------------------------------------------------------- hooks


@hookimpl
def rllm_losses() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="loss",
        name="ppo-clip",
        factory=lazy("rllm_loss_ppo.ppo_clip:PPOClip"),
        config=PPOClipConfig,
        summary="PPO clipped surrogate with decoupled clip range and optional dual clip",
    )
    yield ComponentSpec(
        kind="loss",
        name="cispo",
        factory=lazy("rllm_loss_ppo.cispo:CISPO"),
        config=CISPOConfig,
        summary="clipped, detached importance weight times advantage times logprob (MiniMax-M1)",
    )
    yield ComponentSpec(
        kind="loss",
        name="gspo",
        factory=lazy("rllm_loss_ppo.gspo:GSPO"),
        config=GSPOConfig,
        summary="clipped surrogate on the sequence-level ratio, broadcast to its tokens (Qwen)",
    )
    yield ComponentSpec(
        kind="loss",
        name="reinforce",
        factory=lazy("rllm_loss_ppo.reinforce:Reinforce"),
        config=ReinforceLossConfig,
        summary="importance-sampled REINFORCE: detached ratio times advantage times logprob",
    )
    yield ComponentSpec(
        kind="loss",
        name="reinforce-kl",
        factory=lazy("rllm_loss_ppo.reinforce_kl:ReinforceKL"),
        config=ReinforceKLConfig,
        summary="clamped importance-sampled REINFORCE plus a KL to the sampler's logprobs",
    )
