"""The Sampler over Tinker's SamplingClient: token ids in, token ids and logprobs out."""

from __future__ import annotations

from typing import Any, Protocol

import tinker
from rllm_core.kit.managed import ServiceCalls
from rllm_core.types import SampleRequest, SampleResult, SamplingParams

__all__ = ["SamplerSource", "TinkerSampler", "tinker_sampling_params"]


class SamplerSource(Protocol):
    """What the sampler needs from its backend: the newest sampling client with its version,
    and the backend's calls to Tinker, which retry and count the retries."""

    @property
    def weight_version(self) -> int: ...

    @property
    def calls(self) -> ServiceCalls: ...

    def current_sampling_client(self) -> tuple[Any, int]: ...


class TinkerSampler:
    """Implements :class:`~rllm_core.ports.training.Sampler` on the backend's newest
    ``SamplingClient``.

    - Each request samples one sequence from the sampling client published by the latest
      ``optim_step`` (or the initial weights) and reports that client's weight version, even
      when a newer one is published while the request is in flight.
    - ``stop_token_ids`` become Tinker's ``stop`` list; with none, Tinker is told to stop on
      nothing, not even end-of-sequence, as the gateway passes the renderer's stop ids. A
      stop token that ended the completion is in the returned ids (``finish_reason="stop"``).
    - Requests run concurrently; Tinker batches them on its side.
    - ``request.session_id`` is not sent: Tinker's sampling SDK has no session-affinity field
      (a ``SamplingClient`` is bound to one set of published weights).
    - A request that fails transiently is sent again (on the newest client, reporting its
      version) up to the backend's ``retries``; ``source.calls`` counts each retry for the
      next ``optim_step``.
    """

    def __init__(self, source: SamplerSource) -> None:
        self._source = source

    @property
    def weight_version(self) -> int:
        return self._source.weight_version

    async def sample(self, request: SampleRequest) -> SampleResult:
        prompt = tinker.types.ModelInput.from_ints(list(request.prompt_token_ids))
        params = tinker_sampling_params(request.params)

        async def once() -> tuple[Any, int]:
            client, version = self._source.current_sampling_client()
            future = client.sample(prompt=prompt, num_samples=1, sampling_params=params)
            return await future.result_async(), version

        response, version = await self._source.calls.sample(
            once, f"sampling request {request.request_id!r}"
        )
        if len(response.sequences) != 1:
            raise RuntimeError(
                f"Tinker returned {len(response.sequences)} sequences for request"
                f" {request.request_id!r}, which asked for 1"
            )
        sequence = response.sequences[0]
        tokens = [int(t) for t in sequence.tokens]
        logprobs = sequence.logprobs
        if logprobs is None or len(logprobs) != len(tokens):
            count = "no" if logprobs is None else len(logprobs)
            raise RuntimeError(
                f"Tinker returned {len(tokens)} tokens with {count} logprobs for request"
                f" {request.request_id!r}; training needs one logprob per sampled token"
            )
        finish_reason = "stop" if sequence.stop_reason == "stop" else "length"
        return SampleResult(
            completion_token_ids=tokens,
            logprobs=[float(v) for v in logprobs],
            finish_reason=finish_reason,
            weight_version=version,
        )


def tinker_sampling_params(params: SamplingParams) -> tinker.types.SamplingParams:
    """Our decoding settings as Tinker's."""
    return tinker.types.SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        seed=params.seed,
        stop=[int(t) for t in params.stop_token_ids],
    )
