"""Which Tinker SDK errors are worth retrying, and how long the service asked to wait.

Transient: a lost or timed-out connection (``APIConnectionError``, which ``APITimeoutError``
extends, and the builtin ``ConnectionError``), an answer with status 408, 429 or 5xx, and a
request that failed on the server's side (``RequestFailedError`` of category ``server``).
Anything else (a 400, bad credentials, a validation error, a request the server refused as
the user's fault) fails at once.
"""

from __future__ import annotations

import tinker
from tinker.types import RequestErrorCategory

__all__ = ["is_transient", "retry_after_s"]

_RETRYABLE_STATUS = frozenset({408, 429})


def is_transient(error: BaseException) -> bool:
    if isinstance(error, tinker.APIStatusError):
        return error.status_code in _RETRYABLE_STATUS or error.status_code >= 500
    if isinstance(error, tinker.APIConnectionError):
        return True
    if isinstance(error, tinker.RequestFailedError):
        return error.category == RequestErrorCategory.Server
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
