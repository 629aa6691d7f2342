"""Entry module of rllm-trainer-backend-torch: the config models and the spec the registry hook
yields.

Imports only ``rllm_core``, pydantic and the standard library; the backend is named with
:func:`rllm_core.lazy`, so torch and transformers load only when a plan builds it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rllm_core import ComponentSpec, PlanPath, hookimpl, lazy
from rllm_core.kit.trainer_config import AdamWSettings, LearningRate
from rllm_core.ports import ParallelSettings

__all__ = ["DEFAULT_TARGET_MODULES", "LoraSettings", "TorchBackendConfig", "rllm_trainer_backends"]

DEFAULT_TARGET_MODULES: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
"""Every linear projection of attention and MLP in Llama-family models (SmolLM2, Qwen2.5)."""


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class LoraSettings(_Config):
    """LoRA adapters (peft) on the base model's linear layers, or full-parameter training."""

    rank: int = Field(
        16,
        ge=0,
        description=(
            "LoRA rank r. 0 trains every parameter of the model instead (full fine-tuning);"
            " the other LoRA keys are then ignored."
        ),
    )
    alpha: float = Field(
        32.0, gt=0.0, description="LoRA alpha; the adapter's update is scaled by alpha / rank."
    )
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input during training."
    )
    target_modules: tuple[str, ...] = Field(
        DEFAULT_TARGET_MODULES,
        min_length=1,
        description=(
            "Names of the linear modules that get adapters (matched against the end of each"
            " module's dotted name). The default covers every attention and MLP projection of"
            " Llama-family models."
        ),
    )

    @property
    def full(self) -> bool:
        """True when every parameter is trained (``rank = 0``)."""
        return self.rank == 0


class TorchBackendConfig(_Config, AdamWSettings):
    """Options of the ``torch`` trainer backend (plan section ``[trainer]``)."""

    model: Annotated[str, PlanPath(or_name=True, expects="model")] = Field(
        "smollm2-135m-instruct",
        min_length=1,
        description=(
            "A model catalog name (such as 'smollm2-135m-instruct'), else a local folder holding"
            " a transformers model (config.json, safetensors weights; relative to the plan, write"
            " ./name for a folder without a slash), else a Hugging Face Hub id"
            " (owner/name[@revision]) from the Hugging Face cache (HF_HUB_CACHE or HF_HOME/hub;"
            " run, sft and eval download it when missing, unless HF_HUB_OFFLINE=1)."
        ),
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$",
        description=(
            "'auto' picks the first CUDA device when one is present and the CPU otherwise;"
            " 'cpu', 'cuda' or 'cuda:N' force one."
        ),
    )
    malloc_mmap_threshold_kb: int | None = Field(
        None,
        ge=1,
        le=32768,
        description=(
            "Linux with glibc: a host allocation of at least this many KiB gets pages of its"
            " own, returned to the system when freed (mallopt M_MMAP_THRESHOLD, for the whole"
            " process). Unset keeps glibc's sliding threshold, which rises to the largest block"
            " freed (up to 32 MiB), after which freed activations stay resident: a training"
            " step over long sequences then holds gigabytes it no longer uses. 1024 bounds that"
            " at a few percent of a step's time."
        ),
    )
    cpu_threads: int | None = Field(
        None,
        ge=1,
        description=(
            "Threads torch computes with on the CPU (`torch.set_num_threads`, for the whole"
            " process); unset: torch's default, one per core. Fewer leave cores to sandbox"
            " commands and the gateway that run while the sampler decodes."
        ),
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description=(
            "Dtype of the model weights. Logprobs and losses are always computed in float32."
        ),
    )
    seed: int = Field(
        0,
        description=(
            "Seeds Python's and torch's random generators when the backend is built, so LoRA"
            " initialization and dropout are reproducible."
        ),
    )
    deterministic: bool = Field(
        True,
        description=(
            "Reproducible numerics: MKL's strict reproducible mode, torch's deterministic"
            " algorithms and, on CUDA, cuDNN's deterministic kernels. `rllm-core run` sets it"
            " from [run].deterministic."
        ),
    )
    lora: LoraSettings = Field(
        default_factory=LoraSettings,
        description="LoRA settings (`rank`, `alpha`, `dropout`, `target_modules`); rank 0 is"
        " full-parameter training.",
    )
    learning_rate: LearningRate = 2e-4
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description=(
            "Learning-rate schedule after warmup: constant, or a linear or cosine decay that"
            " reaches 0 after `total_steps` optimizer steps."
        ),
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        description=(
            "Optimizer steps of linear warmup: step k (from 1) uses k / warmup_steps of the"
            " learning rate until it reaches the peak."
        ),
    )
    total_steps: int | None = Field(
        None,
        ge=1,
        description="Length of the schedule in optimizer steps; required by 'linear' and 'cosine'.",
    )
    micro_batch_size: int = Field(
        4,
        ge=1,
        description=(
            "Sequences per forward pass. A forward_backward call is split into micro-batches of"
            " this size; the gradient does not depend on it, only speed and memory do."
        ),
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description=(
            "Most tokens (sequences times the longest one's length) in one forward pass: a"
            " micro-batch ends early rather than pass this, and a longer sequence goes alone."
            " Long multi-turn episodes need it, as a forward pass's memory grows with its"
            " tokens; the gradient does not depend on it."
        ),
    )
    share_prefixes: bool = Field(
        False,
        description=(
            "Run each prefix that several sequences of a forward pass share once, as a tree"
            " (the prompt of a GRPO group, an agent's task messages before a rewound history):"
            " the same logprobs and gradient as without it, fewer tokens through the model."
            " micro_batch_tokens then counts each shared token once. Needs sdpa or eager"
            " attention; not used for packed SFT examples."
        ),
    )
    gradient_checkpointing: bool = Field(
        False,
        description=(
            "Recompute activations during the backward pass instead of storing them: less"
            " memory, about a third more compute."
        ),
    )
    logprob_temperature: float = Field(
        1.0,
        gt=0.0,
        description=(
            "Logits are divided by this before the log-softmax, so recomputed logprobs compare"
            " with the sampler's when the sampler used that temperature."
        ),
    )
    max_batch_size: int = Field(
        32, ge=1, description="Sampler: most sequences decoded together in one batch."
    )
    prefix_cache_mb: int = Field(
        512,
        ge=0,
        description=(
            "Sampler: memory for the keys and values of finished sequences, so that a prompt"
            " starting with one (the next turn of a multi-turn episode) runs only its new"
            " tokens through the model. Dropped whenever the weights change; 0 turns reuse"
            " off."
        ),
    )
    max_seq_len: int | None = Field(
        None,
        ge=2,
        description=(
            "Sampler: longest prompt plus completion, in tokens. Unset uses the model's context"
            " length."
        ),
    )

    parallel: ParallelSettings = Field(
        default_factory=ParallelSettings,
        description=(
            "Training in several processes with torch.distributed (`world_size`, `strategy`,"
            " `backend`, `timeout_s`); world_size 1 trains in this process alone."
        ),
    )

    @model_validator(mode="after")
    def _schedule_has_a_length(self) -> TorchBackendConfig:
        if self.lr_schedule != "constant":
            if self.total_steps is None:
                raise ValueError(
                    f"lr_schedule {self.lr_schedule!r} decays over total_steps optimizer steps;"
                    " set total_steps (or use lr_schedule = 'constant')"
                )
            if self.warmup_steps >= self.total_steps:
                raise ValueError(
                    f"warmup_steps ({self.warmup_steps}) must be smaller than total_steps"
                    f" ({self.total_steps}) for lr_schedule {self.lr_schedule!r}"
                )
        return self


@hookimpl
def rllm_trainer_backends() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="trainer_backend",
        name="torch",
        factory=lazy("rllm_trainer_backend_torch.backend:TorchBackend"),
        config=TorchBackendConfig,
        summary="local transformers model: LoRA or full training and a batched KV-cache sampler",
        traits={
            "run_keys": ("seed", "deterministic", "logprob_temperature", "total_steps"),
            "proximal_modes": ("rollout", "recompute"),
            "publishes_weights": True,
            "exports_weights": True,
            "packs_sequences": True,
            "reference_kl": ("loss", "reward"),
            "entropy": True,
        },
    )
