"""Every sample request the gateway makes carries the session it serves: ``SampleRequest.
session_id`` is the session id of the URL (``/sessions/{id}/v1/...``) for chat completions,
streamed or not, and for completions, and equals the routing key set around the call, so a
backend can keep a session on one sampler (its prefix cache) from the request alone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from rllm_core.routing import routing_key
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import SampleRequest, SampleResult

SESSIONS = ("task-7.r3", "grp:2@run-1", "s")


class Recording(ScriptedSampler):
    """A scripted sampler that also streams, and notes the routing key of every request."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.keys: list[tuple[str, str | None]] = []

    async def sample(self, request: SampleRequest) -> SampleResult:
        self.keys.append((request.session_id, routing_key.get()))
        return await super().sample(request)

    async def sample_stream(
        self, request: SampleRequest
    ) -> AsyncIterator[tuple[list[int], list[float]] | SampleResult]:
        result = await self.sample(request)
        for index, token in enumerate(result.completion_token_ids):
            yield [token], [result.logprobs[index]]
        yield result


def test_chat_and_completions_carry_the_session_of_the_url(serve, client, toy):
    sampler = Recording(lambda request: "ok", renderer=toy)
    gateway = serve(sampler)

    def one_session(session: str) -> None:
        api = client(gateway, session)
        messages = [{"role": "user", "content": f"hi from {session}"}]
        api.chat.completions.create(model="policy", messages=messages)
        list(api.chat.completions.create(model="policy", messages=messages, stream=True))
        api.completions.create(model="policy", prompt=f"complete {session}", max_tokens=4)

    with ThreadPoolExecutor(len(SESSIONS)) as pool:
        list(pool.map(one_session, SESSIONS))

    assert len(sampler.requests) == 3 * len(SESSIONS)
    for session in SESSIONS:
        mine = [r for r in sampler.requests if r.session_id == session]
        assert len(mine) == 3, session
        # the prompts that name the session are the ones that carry it
        texts = [toy.decode(r.prompt_token_ids) for r in mine]
        assert all(session in text for text in texts), (session, texts)
    assert all(key == session for session, key in sampler.keys)
