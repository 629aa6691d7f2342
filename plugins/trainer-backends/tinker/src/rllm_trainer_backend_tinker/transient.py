"""Which Tinker SDK errors are worth retrying.

Transient: a lost or timed-out connection (``APIConnectionError``, which ``APITimeoutError``
extends, and the builtin ``ConnectionError``), an answer with status 408, 429 or 5xx, and a
request that failed on the server's side (``RequestFailedError`` of category ``server``).
Anything else (a 400, bad credentials, a validation error, a request the server refused as
the user's fault) fails at once. How long a failed answer asks to wait is read by
:func:`rllm_core.kit.managed.retry_after_s`.

A request that changes nothing when run twice (sampling, scoring logprobs, publishing weights,
saving or loading a checkpoint) is also retried after a lost answer, an ``ssl.SSLError`` or a
timeout (:func:`rllm_core.kit.managed.lost_answer`); ``forward_backward`` and ``optim_step``
are not, since the service may have applied them already.
"""

from __future__ import annotations

import tinker
from rllm_core.kit.managed import retryable_status
from tinker.types import RequestErrorCategory

__all__ = ["is_transient"]


def is_transient(error: BaseException) -> bool:
    if isinstance(error, tinker.APIStatusError):
        return retryable_status(error.status_code)
    if isinstance(error, tinker.APIConnectionError):
        return True
    if isinstance(error, tinker.RequestFailedError):
        return error.category == RequestErrorCategory.Server
    return isinstance(error, ConnectionError)
