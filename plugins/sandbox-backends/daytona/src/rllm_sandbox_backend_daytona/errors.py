"""Translation of daytona SDK exceptions into the rllm-core sandbox error taxonomy.

=====================================================  ==============================
SDK exception                                          rllm-core error
=====================================================  ==============================
authentication (401), forbidden (403, not a file)      ``SandboxAuthError``
rate limit (429), connection, 500 / 502 / 503,
gateway or transport timeouts                          ``SandboxTransientError``
file not found; not found during a file call           ``SandboxFileNotFound``
not found (404) elsewhere, gone (410), spot eviction   ``SandboxGone``
process execution timeout during ``exec``              ``SandboxCommandTimeout``
anything else during ``create``                        ``SandboxCreateError``
anything else                                          ``SandboxError``
=====================================================  ==============================

The SDK's exception is kept as ``__cause__`` by the caller (``raise translated from exc``).
"""

from __future__ import annotations

from typing import Literal

from daytona import (
    DaytonaAuthenticationError,
    DaytonaBadGatewayError,
    DaytonaConnectionError,
    DaytonaError,
    DaytonaFileAccessDeniedError,
    DaytonaFileNotFoundError,
    DaytonaForbiddenError,
    DaytonaGoneError,
    DaytonaInternalServerError,
    DaytonaNotFoundError,
    DaytonaProcessExecutionTimeoutError,
    DaytonaRateLimitError,
    DaytonaServiceUnavailableError,
    DaytonaSpotEvictedError,
    DaytonaTimeoutError,
)
from rllm_core.errors import (
    SandboxAuthError,
    SandboxCommandTimeout,
    SandboxCreateError,
    SandboxError,
    SandboxFileNotFound,
    SandboxGone,
    SandboxTransientError,
)

__all__ = ["Context", "retry_after_s", "translate"]

Context = Literal["create", "exec", "file", "other"]

_TRANSIENT = (
    DaytonaRateLimitError,
    DaytonaConnectionError,
    DaytonaInternalServerError,
    DaytonaBadGatewayError,
    DaytonaServiceUnavailableError,
)


def translate(exc: BaseException, *, context: Context, what: str) -> SandboxError:
    """The rllm-core error for ``exc`` raised while doing ``what`` (a short phrase naming the
    call and its target). The caller raises it ``from exc``."""
    if isinstance(exc, SandboxError):
        return exc
    detail = f"{what} failed: {type(exc).__name__}: {exc}"
    if isinstance(exc, DaytonaError):
        if isinstance(exc, DaytonaFileAccessDeniedError):
            return SandboxError(f"{detail}; the sandbox user may not access that path")
        if isinstance(exc, (DaytonaAuthenticationError, DaytonaForbiddenError)):
            return SandboxAuthError(
                f"{detail}; check DAYTONA_API_KEY (or api_key) and the organization's access"
            )
        if isinstance(exc, _TRANSIENT):
            return SandboxTransientError(f"{detail}; retrying later may succeed")
        if isinstance(exc, DaytonaFileNotFoundError):
            return SandboxFileNotFound(f"{detail}; the path does not exist in the sandbox")
        if isinstance(exc, DaytonaNotFoundError):
            if context == "file" and "sandbox" not in str(exc).lower():
                return SandboxFileNotFound(f"{detail}; the path does not exist in the sandbox")
            return SandboxGone(f"{detail}; the sandbox no longer exists, create a new one")
        if isinstance(exc, (DaytonaGoneError, DaytonaSpotEvictedError)):
            return SandboxGone(f"{detail}; the sandbox no longer exists, create a new one")
        if isinstance(exc, DaytonaProcessExecutionTimeoutError) and context == "exec":
            return SandboxCommandTimeout(f"{detail}; raise the timeout or shorten the command")
        if isinstance(exc, DaytonaTimeoutError):
            if context == "create":
                return SandboxCreateError(
                    f"{detail}; the sandbox did not start in time, raise create_timeout_s or"
                    " use a prebuilt snapshot"
                )
            return SandboxTransientError(f"{detail}; retrying later may succeed")
        if context == "create":
            return SandboxCreateError(f"{detail}; check the image, resources and quota")
        return SandboxError(detail)
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
        return SandboxTransientError(f"{detail}; retrying later may succeed")
    if context == "create":
        return SandboxCreateError(detail)
    return SandboxError(detail)


def retry_after_s(exc: BaseException) -> float | None:
    """Seconds a rate-limited response asked to wait (its ``Retry-After`` header), if any."""
    headers = getattr(exc, "headers", None) or {}
    for key, value in headers.items():
        if str(key).lower() == "retry-after":
            try:
                return max(float(value), 0.0)
            except (TypeError, ValueError):
                return None
    return None
