"""Entry module of rllm-loss-dppo: config models and the specs the registry hook yields.

Imports only ``rllm_core``, pydantic and the standard library; the losses are named with
:func:`rllm_core.lazy`, so torch loads only when a plan builds one.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import ComponentSpec, hookimpl, lazy

__all__ = ["DPPOKLConfig", "DPPOTVConfig", "rllm_losses"]

_RATIO_CAP_DESCRIPTION = (
    "Cap on the importance weight exp(logprobs - old_logprobs) of unmasked tokens (truncated"
    " importance sampling, verl's clip_ratio_c for DPPO): above it the token's gradient uses"
    " the cap, so a token the old policy gave a very different probability cannot dominate"
    " the step. Unset (the default) keeps the full ratio, as the DPPO paper's recipe does"
    " with its cap of 10000."
)


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DPPOTVConfig(_Config):
    """DPPO with the binary total variation |p - q| of the sampled token."""

    delta: float = Field(
        0.15,
        gt=0.0,
        le=1.0,
        description=(
            "Trust-region radius in total variation: a token whose update moves it away from"
            " the old policy (old_logprobs: the rollout policy unless the plan recomputes them)"
            " is masked once |p - q| exceeds delta. 0.15 is the threshold the DPPO paper's"
            " experiments use."
        ),
    )
    ratio_cap: float | None = Field(None, gt=0.0, description=_RATIO_CAP_DESCRIPTION)


class DPPOKLConfig(_Config):
    """DPPO with the binary KL divergence KL(old || current) of the sampled token."""

    delta: float = Field(
        0.05,
        gt=0.0,
        description=(
            "Trust-region radius in KL (nats): a token whose update moves it away from the old"
            " policy (old_logprobs: the rollout policy unless the plan recomputes them) is"
            " masked once the binary KL(old || current) exceeds delta. 0.05 is the threshold"
            " the DPPO paper's experiments use and, by Pinsker's inequality (KL >= 2 TV^2),"
            " about the region of dppo-tv's 0.15."
        ),
    )
    ratio_cap: float | None = Field(None, gt=0.0, description=_RATIO_CAP_DESCRIPTION)


@hookimpl
def rllm_losses() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="loss",
        name="dppo-tv",
        factory=lazy("rllm_loss_dppo.loss:DPPOTV"),
        config=DPPOTVConfig,
        summary="Divergence PPO: mask tokens moving away from the old policy past a TV radius",
    )
    yield ComponentSpec(
        kind="loss",
        name="dppo-kl",
        factory=lazy("rllm_loss_dppo.loss:DPPOKL"),
        config=DPPOKLConfig,
        summary="Divergence PPO: mask tokens moving away from the old policy past a KL radius",
    )
