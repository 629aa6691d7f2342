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
did not start in time during ``create``                ``SandboxStartTimeout``
anything else during ``create``                        ``SandboxCreateError``
anything else                                          ``SandboxError``
=====================================================  ==============================

The common part is an :class:`rllm_core.kit.sandboxes.ErrorMap`; what depends on the call
(a file call's not found, an exec's timeout, a creation that did not start in time) is decided
here first. The SDK's exception is kept as ``__cause__`` by the caller (``raise translated
from exc``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from daytona import (
    DaytonaAuthenticationError,
    DaytonaBadGatewayError,
    DaytonaConnectionError,
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
    SandboxError,
    SandboxFileNotFound,
    SandboxStartTimeout,
)
from rllm_core.kit.sandboxes import ErrorMap

__all__ = ["Context", "retry_after_s", "translate"]

Context = Literal["create", "exec", "file", "other"]

ERRORS = ErrorMap(
    service="daytona",
    auth_hint="check DAYTONA_API_KEY (or api_key) and the organization's access",
    create_hint="check the image, resources and quota",
    auth=(DaytonaAuthenticationError, DaytonaForbiddenError),
    file_not_found=(DaytonaFileNotFoundError,),
    gone=(DaytonaNotFoundError, DaytonaGoneError, DaytonaSpotEvictedError),
    transient=(
        DaytonaRateLimitError,
        DaytonaConnectionError,
        DaytonaInternalServerError,
        DaytonaBadGatewayError,
        DaytonaServiceUnavailableError,
        DaytonaTimeoutError,
        ConnectionError,
        TimeoutError,
        OSError,
    ),
)
# Only an exec's process timeout is the command's; elsewhere a timeout is the transport's.
_EXEC_ERRORS = replace(ERRORS, command_timeout=(DaytonaProcessExecutionTimeoutError,))


def translate(exc: BaseException, *, context: Context, what: str) -> SandboxError:
    """The rllm-core error for ``exc`` raised while doing ``what`` (a short phrase naming the
    call and its target). The caller raises it ``from exc``."""
    if isinstance(exc, SandboxError):
        return exc
    detail = ERRORS.detail(exc, what)
    if isinstance(exc, DaytonaFileAccessDeniedError):
        return SandboxError(f"{detail}; the sandbox user may not access that path")
    not_found = isinstance(exc, DaytonaNotFoundError) and "sandbox" not in str(exc).lower()
    if context == "file" and not_found:
        return SandboxFileNotFound(f"{detail}; the path does not exist in the sandbox")
    if context == "create" and isinstance(exc, DaytonaTimeoutError):
        return SandboxStartTimeout(
            f"{detail}; the sandbox did not start in time, raise create_timeout_s or use a"
            " prebuilt snapshot"
        )
    errors = _EXEC_ERRORS if context == "exec" else ERRORS
    return errors.translate(exc, what, creating=context == "create")


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
