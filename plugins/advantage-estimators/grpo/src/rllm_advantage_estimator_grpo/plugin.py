"""Entry module of rllm-advantage-estimator-grpo: config models and the specs the registry
hook yields.

Imports only ``rllm_core``, pydantic and the standard library; the estimators
(:mod:`rllm_advantage_estimator_grpo.estimators`, pure Python) load when a plan builds one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rllm_core import ComponentSpec, NoConfig, hookimpl, lazy

__all__ = [
    "DistillConfig",
    "GRPOConfig",
    "PRPOConfig",
    "ReinforceAdvantageConfig",
    "ReinforcePlusPlusBaselineConfig",
    "rllm_advantage_estimators",
]

StdKind = Literal["sample", "population"]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


_EPSILON_DESCRIPTION = (
    "Added to the standard deviation before dividing, so a tiny spread cannot blow advantages up."
)
_STD_DESCRIPTION = (
    "How the standard deviation is estimated: 'sample' divides the squared deviations by n-1"
    " (unbiased, what torch.std computes and what published GRPO runs used), 'population'"
    " divides by n."
)


class GRPOConfig(_Config):
    """Group-relative advantages: reward minus the group mean, optionally over the group std."""

    normalize_std: bool = Field(
        True,
        description=(
            "Divide by the group's standard deviation plus epsilon. false gives the centered"
            " advantages of Dr. GRPO (reward minus group mean), which do not up-weight groups"
            " whose rewards barely differ."
        ),
    )
    epsilon: float = Field(1e-6, ge=0.0, description=_EPSILON_DESCRIPTION)
    std: StdKind = Field("sample", description=_STD_DESCRIPTION)


class ReinforceAdvantageConfig(_Config):
    """The raw reward, minus an optional constant baseline."""

    baseline: float = Field(
        0.0, description="A constant subtracted from every reward (0 keeps the raw reward)."
    )


class ReinforcePlusPlusBaselineConfig(_Config):
    """Group mean baseline, then normalization by the standard deviation over the whole batch."""

    epsilon: float = Field(1e-6, ge=0.0, description=_EPSILON_DESCRIPTION)
    std: StdKind = Field("sample", description=_STD_DESCRIPTION)


class PRPOConfig(_Config):
    """Batch-wide normalization: reward minus the batch mean, over the batch std."""

    epsilon: float = Field(1e-6, ge=0.0, description=_EPSILON_DESCRIPTION)
    std: StdKind = Field("sample", description=_STD_DESCRIPTION)


class DistillConfig(_Config):
    """On-policy distillation: a teacher model scores the tokens the policy sampled; each
    sampled token's advantage is ``coef * (teacher_logprob - student_logprob)`` (the negative
    per-token reverse-KL estimate), plus ``reward_coef`` times the GRPO advantage of its
    episode's reward."""

    teacher: dict[str, Any] = Field(
        description=(
            "The teacher: a table with `name`, a trainer backend that scores tokens (`torch`:"
            " `model` is a catalog name, a local folder or a Hub id), and that backend's keys."
            " Its tokenizer must be the student's. `logprob_temperature` defaults to"
            " [sampling].temperature."
        ),
    )
    coef: float = Field(1.0, gt=0.0, description="Scale of the per-token teacher signal.")
    reward_coef: float = Field(
        0.0,
        ge=0.0,
        description=(
            "Weight of the GRPO advantage of the episode's reward (group mean, over the group"
            " std) added to every sampled token's advantage; 0: the teacher alone."
        ),
    )

    @property
    def reads_rewards(self) -> bool:
        """Whether the rewards reach the advantages: only with a reward weight."""
        return self.reward_coef > 0

    @field_validator("teacher")
    @classmethod
    def _named(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(value.get("name"), str) or not value["name"]:
            raise ValueError(
                'the teacher is a table with a name, such as { name = "torch", model = "..." }'
            )
        return value


@hookimpl
def rllm_advantage_estimators() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="advantage_estimator",
        name="grpo",
        factory=lazy("rllm_advantage_estimator_grpo.estimators:GRPO"),
        config=GRPOConfig,
        summary="reward minus group mean, divided by group std (std off: Dr. GRPO centering)",
    )
    yield ComponentSpec(
        kind="advantage_estimator",
        name="rloo",
        factory=lazy("rllm_advantage_estimator_grpo.estimators:RLOO"),
        config=NoConfig,
        summary="reward minus the mean of the other rewards of its group (leave-one-out)",
    )
    yield ComponentSpec(
        kind="advantage_estimator",
        name="reinforce",
        factory=lazy("rllm_advantage_estimator_grpo.estimators:Reinforce"),
        config=ReinforceAdvantageConfig,
        summary="raw reward minus an optional constant baseline",
    )
    yield ComponentSpec(
        kind="advantage_estimator",
        name="reinforce-plus-plus-baseline",
        factory=lazy("rllm_advantage_estimator_grpo.estimators:ReinforcePlusPlusBaseline"),
        config=ReinforcePlusPlusBaselineConfig,
        summary="reward minus group mean, divided by the std over the whole batch (REINFORCE++)",
    )
    yield ComponentSpec(
        kind="advantage_estimator",
        name="prpo",
        factory=lazy("rllm_advantage_estimator_grpo.estimators:PRPO"),
        config=PRPOConfig,
        summary="reward minus batch mean, divided by batch std",
    )
    yield ComponentSpec(
        kind="advantage_estimator",
        name="distill",
        factory=lazy("rllm_advantage_estimator_grpo.estimators:Distill"),
        config=DistillConfig,
        summary="on-policy distillation: teacher minus student logprob on each sampled token",
        traits={"teacher": True},
    )
