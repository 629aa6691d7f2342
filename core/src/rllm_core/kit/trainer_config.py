"""Config keys that mean the same in every trainer backend: the AdamW optimizer's.

A backend's config model subclasses :class:`AdamWSettings` so the keys ``learning_rate``,
``betas``, ``eps``, ``weight_decay`` and ``max_grad_norm`` are spelled, bounded and described
the same way everywhere. A backend whose service or model wants another default declares the
key again with the same type, which carries the bounds and the description::

    class MyBackendConfig(AdamWSettings):
        learning_rate: LearningRate = 1e-5
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

__all__ = ["AdamBetas", "AdamEps", "AdamWSettings", "LearningRate"]


def _betas_in_range(betas: tuple[float, float]) -> tuple[float, float]:
    for value in betas:
        if not 0.0 <= value < 1.0:
            raise ValueError(f"each of betas must be in [0, 1), got {list(betas)}")
    return betas


LearningRate = Annotated[
    float,
    Field(
        gt=0.0,
        description="Learning rate of AdamW; with a learning-rate schedule, its peak.",
    ),
]
AdamBetas = Annotated[
    tuple[float, float],
    Field(description="AdamW's moving-average coefficients (beta1, beta2), each in [0, 1)."),
    AfterValidator(_betas_in_range),
]
AdamEps = Annotated[float, Field(gt=0.0, description="AdamW's denominator epsilon.")]


class AdamWSettings(BaseModel):
    """The optimizer keys of a trainer backend's config."""

    learning_rate: LearningRate = 1e-4
    betas: AdamBetas = (0.9, 0.999)
    eps: AdamEps = 1e-8
    weight_decay: float = Field(0.0, ge=0.0, description="Decoupled weight decay of AdamW.")
    max_grad_norm: float = Field(
        1.0,
        ge=0.0,
        description=(
            "Before each optimizer step the gradients are rescaled so their global L2 norm is"
            " at most this; 0 disables clipping."
        ),
    )

    def adam_params(self) -> dict[str, float]:
        """These settings as the keyword arguments of the ``AdamParams`` that Tinker-style
        training APIs (Tinker, Fireworks) take for an optimizer step."""
        return {
            "learning_rate": self.learning_rate,
            "beta1": self.betas[0],
            "beta2": self.betas[1],
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "grad_clip_norm": self.max_grad_norm,
        }
