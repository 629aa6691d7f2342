"""The routing key: which conversation a model call belongs to, for samplers that keep one
conversation on one server.

The gateway sets :data:`routing_key` to the session id around each model call. A sampler over
several servers may read it to send every call of a session to the same server, whose prefix
cache then still holds the conversation; samplers that have one server ignore it. Outside the
gateway it is ``None`` unless the caller sets it with :func:`routed`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["routed", "routing_key"]

routing_key: ContextVar[str | None] = ContextVar("rllm_core_routing_key", default=None)
"""The key the current model call is routed by (the gateway sets it to the session id)."""


@contextlib.contextmanager
def routed(key: str) -> Iterator[None]:
    """Route the model calls made inside the block by ``key``."""
    token = routing_key.set(key)
    try:
        yield
    finally:
        routing_key.reset(token)
