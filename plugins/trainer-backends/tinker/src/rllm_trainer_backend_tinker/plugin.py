"""Entry module of rllm-trainer-backend-tinker: the config model and the spec the registry hook
yields.

Imports only ``rllm_core``, pydantic and the standard library; the backend is named with
:func:`rllm_core.lazy`, so the Tinker SDK and torch load only when a plan builds it.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import Field, field_validator
from rllm_core import ComponentSpec, Credential, hookimpl, lazy
from rllm_core.kit.managed.config import ManagedTrainerSettings, managed_trainer_spec
from rllm_core.kit.trainer_config import AdamBetas, AdamEps

__all__ = ["TinkerBackendConfig", "rllm_trainer_backends"]


class TinkerBackendConfig(ManagedTrainerSettings):
    """Options of the ``tinker`` trainer backend (plan section ``[trainer]``).

    ``loss_path`` chooses between Tinker's own loss kernels and the client-side loss (see
    :mod:`rllm_core.algorithms.native_losses`); ``vocab_size`` bounds the token ids a datum may hold
    before it is dropped from a step (see :mod:`rllm_core.kit.token_hygiene`).

    ``retries``, ``retry_backoff_s`` and ``retry_backoff_max_s`` bound the retries of calls
    to Tinker that fail transiently (training steps, sampling, checkpoints).

    Credentials never appear here: the Tinker SDK reads ``TINKER_API_KEY`` (or its stored
    credentials) itself. ``base_model``, the old name of ``model``, is accepted until the next
    release with a warning (see :class:`~rllm_core.kit.managed.ManagedServiceSettings`).
    """

    model: str = Field(
        "Qwen/Qwen3-8B",
        min_length=1,
        description=(
            "Name of a base model Tinker serves, as Tinker spells it (such as 'Qwen/Qwen3-8B'"
            " or 'meta-llama/Llama-3.1-8B'); nothing is loaded on this machine. The plan's"
            " renderer must use this model's tokenizer. The old name of this key, base_model,"
            " is accepted until the next release with a warning."
        ),
    )
    lora_rank: int = Field(32, ge=1, description="Rank of the LoRA adapters Tinker trains.")
    train_mlp: bool = Field(True, description="Put LoRA adapters on the MLP layers.")
    train_attn: bool = Field(True, description="Put LoRA adapters on the attention layers.")
    train_unembed: bool = Field(True, description="Put a LoRA adapter on the unembedding.")
    seed: int | None = Field(
        0, description="Seed of the LoRA initialization; unset lets Tinker pick one."
    )
    betas: AdamBetas = (0.9, 0.95)
    eps: AdamEps = 1e-12
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
    yield managed_trainer_spec(
        name="tinker",
        factory=lazy("rllm_trainer_backend_tinker.backend:TinkerBackend"),
        config=TinkerBackendConfig,
        summary="LoRA training and sampling on Tinker's hosted models, with rllm-core's losses",
        credential=Credential(
            what="Tinker API key",
            env=("TINKER_API_KEY",),
            also_env=(("TINKER_CREDENTIAL_CMD",),),
            files=("~/.tinker/credentials.json",),
            login="tinker auth login",
        ),
    )
