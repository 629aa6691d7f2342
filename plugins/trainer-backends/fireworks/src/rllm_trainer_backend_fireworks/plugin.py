"""Entry module of rllm-trainer-backend-fireworks: the config model and the spec the registry hook
yields.

Imports only ``rllm_core``, pydantic and the standard library; the backend is named with
:func:`rllm_core.lazy`, so the Fireworks SDK and torch load only when a plan builds it.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import Field
from rllm_core import ComponentSpec, Credential, hookimpl, lazy
from rllm_core.kit.managed.config import ManagedTrainerSettings, managed_trainer_spec
from rllm_core.kit.trainer_config import LearningRate

__all__ = ["FireworksBackendConfig", "rllm_trainer_backends"]


class FireworksBackendConfig(ManagedTrainerSettings):
    """Options of the ``fireworks`` trainer backend (plan section ``[trainer]``).

    ``loss_path`` chooses between the trainer's own loss kernels and the custom-loss path (see
    :class:`~rllm_core.algorithms.native_losses.NativeLossSettings`); ``vocab_size`` lets datums
    with token ids outside the model's vocabulary be dropped before a step instead of failing it
    (see :class:`~rllm_core.kit.token_hygiene.TokenHygieneSettings`). ``retries``,
    ``retry_backoff_s`` and ``retry_backoff_max_s`` bound the retries of calls to Fireworks
    that fail transiently (training steps, sampling, checkpoints).
    ``base_model``, the old name of ``model``, is accepted until the next release with a
    warning (see :class:`~rllm_core.kit.managed.ManagedServiceSettings`).
    """

    model: str = Field(
        min_length=1,
        description=(
            "Fireworks model resource to train, such as 'accounts/fireworks/models/qwen3-8b';"
            " nothing is loaded on this machine. The old name of this key, base_model, is"
            " accepted until the next release with a warning."
        ),
    )
    lora_rank: int = Field(
        16, ge=0, description="LoRA rank of the trained adapter; 0 trains every parameter."
    )
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha; the update is scaled by alpha/rank.")
    seed: int = Field(0, description="Seed of the adapter initialization on the trainer.")
    learning_rate: LearningRate = 1e-5
    logprob_temperature: float = Field(
        1.0,
        gt=0.0,
        description=(
            "Temperature of the logprobs the trainer recomputes. The Fireworks trainer computes"
            " them at temperature 1 only, so any other value is refused when the backend is"
            " built; sample at temperature 1.0 for on-policy ratios."
        ),
    )
    training_shape_id: str | None = Field(
        None,
        description=(
            "Fireworks training shape (accelerators, sharding) for the managed trainer job;"
            " unset lets Fireworks choose the validated shape for the model."
        ),
    )
    deployment_id: str | None = Field(
        None,
        description=(
            "Reuse this Fireworks deployment as the hot-load sampling target; unset creates one"
            " for the run and removes it on close."
        ),
    )
    api_key_env: str = Field(
        "FIREWORKS_API_KEY",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable that holds the training-scoped Fireworks API key.",
    )
    base_url: str | None = Field(None, description="Fireworks API URL; unset uses the SDK default.")
    promote_final: bool = Field(
        False,
        description=(
            "When the run ends after at least one optimizer step, save the final weights and"
            " promote them to a permanent Fireworks model (a LoRA addon of model, or a full"
            " model with lora_rank = 0) before the trainer job is torn down; run.log names it."
        ),
    )
    promoted_model_id: str | None = Field(
        None,
        pattern=r"^[a-z0-9-]{1,63}$",
        description=(
            "Id of the model promote_final creates (1-63 of a-z, 0-9, '-'); unset:"
            " rllm-<trainer job id>-step<N>. An id that exists already fails the promotion."
        ),
    )


@hookimpl
def rllm_trainer_backends() -> Iterator[ComponentSpec]:
    yield managed_trainer_spec(
        name="fireworks",
        factory=lazy("rllm_trainer_backend_fireworks.backend:FireworksBackend"),
        config=FireworksBackendConfig,
        summary="Fireworks training API (remote LoRA/full, custom losses) + hot-loaded sampler",
        credential=Credential(
            what="Fireworks API key", env=("FIREWORKS_API_KEY",), env_key="api_key_env"
        ),
    )
