"""The Sampler over the Fireworks deployment that serves the newest published weights."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

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

    Session affinity: a request of a gateway session (``SampleRequest.session_id``) goes
    through the sampling client's ``deployment_sampler`` with ``prompt_cache_key`` set to the
    session, the field Fireworks routes on, so every turn of an episode reaches the replica
    that holds its prompt in cache. A request outside a session, or a client without a
    ``deployment_sampler``, goes through the client's ``sample_async``.
    """

    def __init__(self, source: SamplingSource) -> None:
        self._source = source

    @property
    def weight_version(self) -> int:
        return self._source.weight_version

    async def sample(self, request: SampleRequest) -> SampleResult:
        params = request.params

        async def once() -> tuple[_Sampled, int]:
            async with self._source.sampling() as (client, version):
                deployment = getattr(client, "deployment_sampler", None)
                if request.session_id and deployment is not None:
                    return await _sample_in_session(deployment, request), version
                return await _sample(client, request), version

        (tokens, logprobs, finish), version = await self._source.calls.sample(
            once, f"sampling request {request.request_id!r}"
        )
        if logprobs is None or len(logprobs) != len(tokens) or None in logprobs:
            given = "no" if logprobs is None else f"{sum(lp is not None for lp in logprobs)}"
            raise RuntimeError(
                f"the Fireworks sampler returned {len(tokens)} tokens with {given} logprobs for"
                f" request {request.request_id!r}; training needs one logprob per sampled token"
            )
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


_Sampled = tuple[list[int], list[float | None] | None, Literal["stop", "length"]]
"""A completion's token ids, their logprobs (``None`` when the response has none) and why it
ended."""


async def _sample(client: Any, request: SampleRequest) -> _Sampled:
    params = request.params
    sdk_params = fw.SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        stop=list(params.stop_token_ids) or None,
        seed=params.seed,
    )
    prompt = fw.ModelInput.from_ints(list(request.prompt_token_ids))
    response = await client.sample_async(prompt, 1, sdk_params)
    if len(response.sequences) != 1:
        raise RuntimeError(
            f"the Fireworks sampler returned {len(response.sequences)} sequences for one"
            f" request {request.request_id!r}; expected exactly 1"
        )
    sequence = response.sequences[0]
    logprobs = sequence.logprobs
    return (
        [int(t) for t in sequence.tokens],
        None if logprobs is None else list(logprobs),
        "stop" if sequence.stop_reason == "stop" else "length",
    )


async def _sample_in_session(deployment: Any, request: SampleRequest) -> _Sampled:
    """One completion from the deployment with the request's session as its
    ``prompt_cache_key``, read from the SDK's ``SampledCompletion``."""
    params = request.params
    options: dict[str, Any] = {"logprobs": True, "top_p": params.top_p}
    if params.seed is not None:
        options["seed"] = params.seed
    completions = await deployment.sample_with_prompt_tokens(
        list(request.prompt_token_ids),
        n=1,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        stop=list(params.stop_token_ids) or None,
        prompt_cache_key=request.session_id,
        **options,
    )
    if len(completions) != 1:
        raise RuntimeError(
            f"the Fireworks deployment returned {len(completions)} completions for one request"
            f" {request.request_id!r} of session {request.session_id!r}; expected exactly 1"
        )
    completion = completions[0]
    tokens = [int(t) for t in completion.full_tokens[completion.prompt_len :]]
    logprobs = completion.sampling_logprobs
    if logprobs is not None:
        logprobs = list(logprobs)
        if completion.logprobs_echoed:
            # Echoed lists hold one entry per token after the first, prompt included, so
            # the completion's entries start at prompt_len - 1.
            start = max(completion.prompt_len - 1, 0)
            logprobs = logprobs[start : start + len(tokens)]
    return tokens, logprobs, "length" if completion.finish_reason == "length" else "stop"
