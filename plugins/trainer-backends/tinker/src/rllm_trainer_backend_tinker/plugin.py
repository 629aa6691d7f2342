"""Entry module of rllm-trainer-backend-tinker: the config model and the spec the registry hook
yields.

Imports only ``rllm_core``, pydantic and the standard library; the backend is named with
:func:`rllm_core.lazy`, so the Tinker SDK and torch load only when a plan builds it.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import ConfigDict, Field, field_validator
from rllm_core import ComponentSpec, hookimpl, lazy
from rllm_core.kit.retry import RetrySettings

__all__ = ["TinkerBackendConfig", "rllm_trainer_backends"]


class TinkerBackendConfig(RetrySettings):
    """Options of the ``tinker`` trainer backend (plan section ``[trainer]``).

    ``retries``, ``retry_backoff_s`` and ``retry_backoff_max_s`` bound the retries of calls
    to Tinker that fail transiently (training steps, sampling, checkpoints).

    Credentials never appear here: the Tinker SDK reads ``TINKER_API_KEY`` (or its stored
    credentials) itself.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    base_model: str = Field(
        "Qwen/Qwen3-8B",
        min_length=1,
        description=(
            "Name of a base model Tinker serves, as Tinker spells it (such as 'Qwen/Qwen3-8B'"
            " or 'meta-llama/Llama-3.1-8B'). The plan's renderer must use this model's"
            " tokenizer."
        ),
    )
    lora_rank: int = Field(32, ge=1, description="Rank of the LoRA adapters Tinker trains.")
    train_mlp: bool = Field(True, description="Put LoRA adapters on the MLP layers.")
    train_attn: bool = Field(True, description="Put LoRA adapters on the attention layers.")
    train_unembed: bool = Field(True, description="Put a LoRA adapter on the unembedding.")
    seed: int | None = Field(
        0, description="Seed of the LoRA initialization; unset lets Tinker pick one."
    )
    learning_rate: float = Field(1e-4, gt=0.0, description="Learning rate of Tinker's AdamW.")
    betas: tuple[float, float] = Field(
        (0.9, 0.95), description="AdamW's moving-average coefficients (beta1, beta2)."
    )
    eps: float = Field(1e-12, gt=0.0, description="AdamW's denominator epsilon.")
    weight_decay: float = Field(0.0, ge=0.0, description="Decoupled weight decay of AdamW.")
    max_grad_norm: float = Field(
        1.0,
        ge=0.0,
        description=(
            "Tinker clips the global gradient norm to this before each step; 0 disables clipping."
        ),
    )
    logprob_temperature: float = Field(
        1.0,
        description=(
            "Temperature of the logprobs the losses see. Tinker's forward pass reports"
            " logprobs at temperature 1, so this is fixed at 1.0 and the plan's sampling"
            " temperature must be 1.0 for the losses' ratios to be on-policy."
        ),
    )
    base_url: str | None = Field(
        None,
        description=(
            "Tinker API address; unset uses TINKER_BASE_URL or the SDK's production default."
        ),
    )
    checkpoint_prefix: str = Field(
        "rllm",
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description=(
            "save_state names Tinker checkpoints '<prefix>-step<N>' (N: optimizer steps)."
        ),
    )
    checkpoint_ttl_s: int | None = Field(
        None,
        ge=3600,
        description="How long Tinker keeps saved checkpoints, in seconds; unset keeps them.",
    )
    request_timeout_s: float = Field(
        900.0,
        gt=0.0,
        description=(
            "Longest wait for one Tinker operation (forward_backward, optim_step, saving or"
            " loading a checkpoint) before it fails with TimeoutError."
        ),
    )

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        for value in betas:
            if not 0.0 <= value < 1.0:
                raise ValueError(f"each of betas must be in [0, 1), got {list(betas)}")
        return betas

    @field_validator("logprob_temperature")
    @classmethod
    def _tinker_logprobs_are_untempered(cls, value: float) -> float:
        if value != 1.0:
            raise ValueError(
                f"logprob_temperature is {value}, but Tinker's forward pass reports logprobs at"
                " temperature 1; set it to 1.0 and sample at temperature 1.0"
            )
        return value


@hookimpl
def rllm_trainer_backends() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="trainer_backend",
        name="tinker",
        factory=lazy("rllm_trainer_backend_tinker.backend:TinkerBackend"),
        config=TinkerBackendConfig,
        summary="LoRA training and sampling on Tinker's hosted models, with rllm-core's losses",
    )
