"""Entry module of rllm-sampler-vllm: the config model and the spec the registry hook yields.

Imports only rllm-core, pydantic and the standard library; the pool
(:mod:`rllm_sampler_vllm.pool`) loads when the sampler is built.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import ConfigDict, Field
from rllm_core import ComponentSpec, hookimpl, lazy
from rllm_core.kit.retry import RetrySettings

__all__ = ["VllmSamplerConfig"]


class VllmSamplerConfig(RetrySettings):
    """Keys of ``sampler:vllm`` (``rllm-core gateway serve --upstream URL`` fills ``urls``,
    ``model`` and ``api_key`` from its flags). The retry keys are those of
    :class:`~rllm_core.kit.retry.RetrySettings`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    urls: list[str] = Field(
        min_length=1,
        description="base URLs of the vLLM servers, e.g. http://10.0.0.5:8000 (no /v1)",
    )
    model: str | None = Field(
        default=None,
        description="sent as the request's model field (vLLM's --served-model-name); unset sends"
        " none, which a server with one model accepts",
    )
    api_key: str | None = Field(
        default=None,
        description="bearer token for the servers (vLLM's --api-key); unset sends none",
    )
    health_interval_s: float = Field(
        default=5.0,
        ge=0,
        description="seconds between GET /health probes of every server; 0 probes only while"
        " no server is up",
    )
    request_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="seconds one completion may take before it fails (not retried: a long"
        " generation would only time out again)",
    )
    retry_budget_s: float = Field(
        default=60.0,
        gt=0,
        description="total seconds a completion may spend on retries and on waiting for a"
        " server to come back, on top of the retries limit",
    )


@hookimpl
def rllm_samplers() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="sampler",
        name="vllm",
        factory=lazy("rllm_sampler_vllm.pool:HttpWorkerPool.from_config"),
        config=VllmSamplerConfig,
        summary="vLLM OpenAI-compatible servers over HTTP, token ids in and out",
    )
