"""The Sampler over the Fireworks deployment that serves the newest published weights."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from fireworks.training.sdk import types as fw
from rllm_core.kit.managed import ServiceCalls
from rllm_core.types import SampleRequest, SampleResult

__all__ = ["FireworksSampler", "SamplingSource"]


class SamplingSource(Protocol):
    """What the sampler needs from its backend: the sampling client of the newest published
    weights with their version, held for one request, and the backend's calls to Fireworks,
    which retry and count the retries."""

    @property
    def weight_version(self) -> int: ...

    @property
    def calls(self) -> ServiceCalls: ...

    def sampling(self) -> AbstractAsyncContextManager[tuple[Any, int]]: ...


class FireworksSampler:
    """Token ids in, token ids and logprobs out, from the deployment the backend hot-loaded.

    ``weight_version`` is the backend's: it moves when ``optim_step`` publishes new weights.
    Each request reports the version it read with its client when it started; the backend
    does not switch the deployment's weights while a request runs, so that version produced
    every token of it. A completion that ended on a stop token must include that token, since
    training uses the sampled ids as they are; a response that drops it or lacks logprobs
    raises. A request that fails transiently is sent again (on the newest weights, reporting
    their version) up to the backend's ``retries``; ``source.calls`` counts each retry for the
    next ``optim_step``.
    """

    def __init__(self, source: SamplingSource) -> None:
        self._source = source

    @property
    def weight_version(self) -> int:
        return self._source.weight_version

    async def sample(self, request: SampleRequest) -> SampleResult:
        params = request.params
        prompt = fw.ModelInput.from_ints(list(request.prompt_token_ids))
        sdk_params = fw.SamplingParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop=list(params.stop_token_ids) or None,
            seed=params.seed,
        )

        async def once() -> tuple[Any, int]:
            async with self._source.sampling() as (client, version):
                return await client.sample_async(prompt, 1, sdk_params), version

        response, version = await self._source.calls.sample(
            once, f"sampling request {request.request_id!r}"
        )
        if len(response.sequences) != 1:
            raise RuntimeError(
                f"the Fireworks sampler returned {len(response.sequences)} sequences for one"
                f" request {request.request_id!r}; expected exactly 1"
            )
        sequence = response.sequences[0]
        tokens = [int(t) for t in sequence.tokens]
        logprobs = sequence.logprobs
        if logprobs is None or len(logprobs) != len(tokens):
            raise RuntimeError(
                f"the Fireworks sampler returned {len(tokens)} tokens with"
                f" {'no' if logprobs is None else len(logprobs)} logprobs for request"
                f" {request.request_id!r}; training needs one logprob per sampled token"
            )
        finish = "stop" if sequence.stop_reason == "stop" else "length"
        if (
            finish == "stop"
            and params.stop_token_ids
            and (not tokens or tokens[-1] not in params.stop_token_ids)
        ):
            raise RuntimeError(
                f"the Fireworks sampler stopped request {request.request_id!r} without returning"
                f" the stop token (last token {tokens[-1] if tokens else None}, stop tokens"
                f" {list(params.stop_token_ids)}); the sampled ids must include it to be trained"
            )
        return SampleResult(
            completion_token_ids=tokens,
            logprobs=[float(x) for x in logprobs],
            finish_reason=finish,
            weight_version=version,
        )
