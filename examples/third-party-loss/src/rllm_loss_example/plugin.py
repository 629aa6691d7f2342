"""Entry module of rllm-loss-example: registers the ``reinforce-tis`` loss.

rllm-core imports this module every time it lists plugins, so it imports only rllm_core,
pydantic and the standard library. The loss itself, which needs torch, is named with ``lazy``
and imported only when a plan builds it.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import ComponentSpec, hookimpl, lazy


class ReinforceTISConfig(BaseModel):
    """The keys a plan may set for ``reinforce-tis``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    cap: float = Field(default=2.0, gt=0, description="truncation cap c of the importance weight")
    beta: float = Field(
        default=0.0, ge=0, description="coefficient of the k3 KL penalty to the rollout policy"
    )


@hookimpl
def rllm_losses() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="loss",
        name="reinforce-tis",
        factory=lazy("rllm_loss_example.loss:ReinforceTIS"),
        config=ReinforceTISConfig,
        summary="REINFORCE with truncated importance weights and an optional k3 KL penalty",
    )
