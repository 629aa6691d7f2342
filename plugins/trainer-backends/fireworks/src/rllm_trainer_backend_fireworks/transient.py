"""Which Fireworks training SDK errors are worth retrying, and how long the service asked to
wait.

Transient: a lost or timed-out connection (``APIConnectionError``, which ``APITimeoutError``
extends, and the builtin ``ConnectionError``); an answer with status 408, 429 or 5xx, whether
the SDK raised it as ``APIStatusError``, ``TrainingAPIError`` or (for sampling)
``SamplingRequestError``; and a request that failed on the trainer's side
(``RequestFailedError`` of category ``server``). Anything else (a 400, bad credentials, a
validation error) fails at once.
"""

from __future__ import annotations

from fireworks.training.sdk import (
    APIConnectionError,
    APIStatusError,
    RequestFailedError,
    SamplingRequestError,
    TrainingAPIError,
)
from fireworks.training.sdk import types as fw

__all__ = ["is_transient", "retry_after_s"]


def _retryable(status: int | None) -> bool:
    return status is not None and (status in (408, 429) or status >= 500)


def is_transient(error: BaseException) -> bool:
    if isinstance(error, APIStatusError | TrainingAPIError):
        return _retryable(error.status_code)
    if isinstance(error, SamplingRequestError):
        return _retryable(error.final_status)
    if isinstance(error, APIConnectionError):
        return True
    if isinstance(error, RequestFailedError):
        return error.category == fw.RequestErrorCategory.Server
    return isinstance(error, ConnectionError)


def retry_after_s(error: BaseException) -> float | None:
    """The seconds a 429 or 503 answer's ``Retry-After`` header asks for, if it gives them."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    try:
        return max(0.0, float(headers.get("retry-after", "")))
    except (TypeError, ValueError):
        return None
