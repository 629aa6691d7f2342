"""The config keys and component spec every managed trainer backend shares.

A managed backend trains on a remote service with AdamW, may run the objective in one of the
service's own loss kernels (``loss_path``), drops datums the service would reject before a step
(``vocab_size``, else the length of ``tokenizer``), retries its requests, and publishes each
new version of the weights to a sampler on the same service. :class:`ManagedTrainerSettings`
holds those keys; :func:`managed_trainer_spec` is the component a backend's registry hook
yields.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from rllm_core.algorithms.native_losses import NATIVE_KERNELS, NativeLossSettings
from rllm_core.kit.managed.calls import ManagedServiceSettings
from rllm_core.kit.token_hygiene import TokenHygieneSettings
from rllm_core.kit.trainer_config import AdamWSettings
from rllm_core.plugins import ComponentSpec, Credential

__all__ = ["ManagedTrainerSettings", "managed_trainer_spec"]


class ManagedTrainerSettings(
    ManagedServiceSettings, AdamWSettings, NativeLossSettings, TokenHygieneSettings
):
    """The keys of :class:`~rllm_core.kit.managed.ManagedServiceSettings` (retries, the
    longest wait for one request, ``base_model`` as the old name of ``model``),
    :class:`~rllm_core.kit.trainer_config.AdamWSettings`,
    :class:`~rllm_core.algorithms.native_losses.NativeLossSettings` (``loss_path``) and
    :class:`~rllm_core.kit.token_hygiene.TokenHygieneSettings` (``vocab_size``,
    ``tokenizer``); unknown keys are refused, and a config is frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def managed_trainer_spec(
    *,
    name: str,
    factory: Any,
    config: type[BaseModel],
    summary: str,
    credential: Credential,
) -> ComponentSpec:
    """The ``trainer_backend`` component ``name``: a backend on a hosted model that publishes
    its weights, takes ``seed``, ``logprob_temperature`` and ``tokenizer`` from the run, and
    runs every kernel of :data:`~rllm_core.algorithms.native_losses.NATIVE_KERNELS` natively;
    ``plan check`` refuses the reference KL and the entropy bonus with it, saying why."""
    return ComponentSpec(
        kind="trainer_backend",
        name=name,
        factory=factory,
        config=config,
        summary=summary,
        traits={
            "run_keys": ("seed", "logprob_temperature", "tokenizer"),
            "publishes_weights": True,
            "hosted_model": True,
            "native_losses": NATIVE_KERNELS,
            "reference_kl_refusal": (
                "the backend scores tokens under the policy it trains only and asks its service"
                " for no base-model logprobs"
            ),
            "entropy_refusal": (
                "its service returns per-token logprobs, not the logits an entropy needs"
            ),
        },
        credentials=(credential,),
    )
