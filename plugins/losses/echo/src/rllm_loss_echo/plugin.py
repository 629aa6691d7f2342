"""Entry module of rllm-loss-echo: the config model and the spec the registry hook yields.

Imports only ``rllm_core``, pydantic and the standard library; the loss is named with
:func:`rllm_core.lazy`, so torch loads only when a plan builds it.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import ComponentSpec, hookimpl, lazy

__all__ = ["EchoConfig", "rllm_losses"]


class EchoConfig(BaseModel):
    """Options of the ECHO auxiliary loss."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    coef: float = Field(
        0.05,
        ge=0.0,
        description=(
            "Weight of the observation cross-entropy added to the policy loss. The run loop"
            " applies it (total = policy loss + coef * echo); 0 reproduces the policy loss"
            " exactly."
        ),
    )


@hookimpl
def rllm_losses() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="loss",
        name="echo",
        factory=lazy("rllm_loss_echo.loss:Echo"),
        config=EchoConfig,
        summary="auxiliary cross-entropy on environment-observation tokens (ECHO)",
        traits={"role": "auxiliary"},
    )
