"""Test helpers for the managed trainer backends (tinker, fireworks): the SDK errors a service
answers with, a way to make a fake's method fail a few times, and a plain REINFORCE loss with
a datum to train with.

Both SDKs build their HTTP errors from an ``httpx`` response, so :func:`status_error` serves
either SDK's error types.
"""

from __future__ import annotations

import httpx
from rllm_core.ports import LossContext, LossOutput
from rllm_core.types import Datum

__all__ = ["DATUMS", "REQUEST", "Reinforce", "failing", "status_error"]

REQUEST = httpx.Request("POST", "https://service.invalid/api")
"""The request the errors below answer (SDK connection errors take one too)."""


def status_error(kind: type[Exception], code: int, **headers: str) -> Exception:
    """An SDK error of class ``kind`` for an answer with status ``code`` and ``headers``."""
    response = httpx.Response(code, request=REQUEST, headers=headers)
    return kind(f"answer {code}", response=response, body=None)


def failing(obj: object, name: str, *errors: BaseException) -> list[int]:
    """Make ``obj.name`` raise ``errors`` in turn, then behave; returns the call log."""
    real = getattr(obj, name)
    queue = list(errors)
    calls: list[int] = []

    def wrapper(*args, **kwargs):
        calls.append(len(calls) + 1)
        if queue:
            raise queue.pop(0)
        return real(*args, **kwargs)

    setattr(obj, name, wrapper)
    return calls


class Reinforce:
    """REINFORCE: minus the advantage times the sampled token's logprob, over action tokens."""

    name = "reinforce"

    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=ctx.aggregate(-ctx.advantages * ctx.logprobs, ctx.action_mask))


DATUMS = [
    Datum(
        token_ids=[0, 1, 2],
        logprobs=[0.0, -0.5, -0.7],
        advantages=[0.0, 1.0, 1.0],
        action_mask=[False, True, True],
        observation_mask=[False, False, False],
    )
]
"""One prompt token and two action tokens with advantage 1."""
