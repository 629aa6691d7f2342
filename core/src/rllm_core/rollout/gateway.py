"""What rollouts need of the gateway: :class:`SessionGateway`."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from rllm_core.types import LLMEndpoint, SamplingParams

__all__ = ["SessionGateway"]


@runtime_checkable
class SessionGateway(Protocol):
    """The gateway as the rollout runner uses it: one session per rollout attempt.

    Contract:

    - ``configure_session(session_id, enforced=params)`` makes every model call of the session
      sample with ``params`` (``None``: the request's own); it may be called before the
      session has seen a call, and creates its live state.
    - ``endpoint(session_id)`` is the OpenAI-compatible endpoint a harness talks to, and opens
      the session; every call through it is recorded in the trace store under ``session_id``.
      Its ``api_key`` is the session's own token: it reaches that session's model routes and
      nothing else (not another session, not the traces, not the gateway's admin routes),
      because the harness hands it to the agent being trained.
    - ``denied(session_id)`` counts the requests refused to the session's token while it was
      open (another session's routes, an admin route): what the agent tried beyond its reach.
      Read it before releasing the session.
    - ``release_session(session_id)`` forgets the session's live state (its sampling
      parameters, token accumulator) and keeps its traces; an unknown id is ignored. From then
      on the endpoint's ``api_key`` is refused, so an agent that outlives its episode cannot
      add to it.

    :class:`~rllm_core.gateway.server.Gateway` satisfies it, as does the seeded view of
    :class:`~rllm_core.rollout.seeding.SeededGateway`.

    Example::

        gateway.configure_session("run-s1-t-0-a0", enforced=SamplingParams(max_tokens=64))
        outcome = await harness.run(task, gateway.endpoint("run-s1-t-0-a0"), None)
        gateway.release_session("run-s1-t-0-a0")
    """

    def configure_session(self, session_id: str, *, enforced: SamplingParams | None) -> None: ...

    def endpoint(self, session_id: str) -> LLMEndpoint: ...

    def denied(self, session_id: str) -> int: ...

    def release_session(self, session_id: str) -> None: ...
