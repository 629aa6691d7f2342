"""Config keys several harnesses take, each a field type with its bounds and description: a
chat request's completion length, timeout and retries, and the cap on an episode's time budget.

A harness config declares each key under its usual name with its usual default
(``max_tokens: MaxTokens = None``), so every harness bounds and documents the key alike and its
config keeps its own order of keys; a harness whose key means more says so with its own
``Field(description=...)``, which keeps the bounds.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

__all__ = ["MaxRetries", "MaxTokens", "RequestTimeout", "TimeoutCap"]

MaxTokens = Annotated[
    int | None,
    Field(
        gt=0,
        description="completion length sent with each request; unset leaves it to the gateway",
    ),
]
"""``max_tokens`` (default ``None``)."""

RequestTimeout = Annotated[
    float,
    Field(
        gt=0,
        allow_inf_nan=False,
        description="HTTP timeout of one chat request, in seconds",
    ),
]
"""``request_timeout_s`` (default ``600.0``)."""

MaxRetries = Annotated[
    int,
    Field(
        ge=0,
        description="retries of a failed request (connection errors, 429, 5xx) by the client",
    ),
]
"""``max_retries`` (default ``2``)."""

TimeoutCap = Annotated[
    float | None,
    Field(
        gt=0,
        allow_inf_nan=False,
        description="cap on the episode's time budget, which is the task's agent timeout;"
        " unset uses the task's timeout as it is",
    ),
]
"""``timeout_cap_s`` (default ``None``)."""
