"""Translation of the modal SDK's exceptions into the rllm-core sandbox error taxonomy.

Every translated error keeps the SDK's exception as ``__cause__`` (the caller raises it with
``from``). The mapping:

- ``AuthError``, ``PermissionDeniedError`` -> ``SandboxAuthError``
- ``ConnectionError``, ``InternalError``, ``ServiceError``, ``ResourceExhaustedError`` (rate
  limited), ``grpclib`` stream losses, the builtin ``ConnectionError`` and ``OSError`` ->
  ``SandboxTransientError``
- ``NotFoundError``, ``SandboxTerminatedError``, ``SandboxTimeoutError`` (lifetime spent),
  ``ClientClosed`` -> ``SandboxGone``
- ``SandboxFilesystemNotFoundError`` -> ``SandboxFileNotFound``
- ``ExecTimeoutError`` -> ``SandboxCommandTimeout``
- anything else -> ``SandboxCreateError`` while creating, ``SandboxError`` otherwise
"""

from __future__ import annotations

import grpclib.exceptions
from modal import exception as mx
from rllm_core.errors import (
    SandboxAuthError,
    SandboxCommandTimeout,
    SandboxCreateError,
    SandboxError,
    SandboxFileNotFound,
    SandboxGone,
    SandboxTransientError,
)

__all__ = ["translate"]

_AUTH = (mx.AuthError, mx.PermissionDeniedError)
_TRANSIENT = (
    mx.ConnectionError,
    mx.InternalError,
    mx.ServiceError,
    mx.ResourceExhaustedError,
    grpclib.exceptions.StreamTerminatedError,
    ConnectionError,
    OSError,
)
_GONE = (mx.NotFoundError, mx.SandboxTerminatedError, mx.SandboxTimeoutError, mx.ClientClosed)


def translate(exc: BaseException, what: str, *, creating: bool = False) -> SandboxError:
    """The rllm-core error for ``exc`` raised by the SDK during ``what``; raise it ``from exc``.

    ``what`` names the operation and its target (``"read_file /app/x"``); ``creating`` picks
    ``SandboxCreateError`` for failures outside the other classes.
    """
    if isinstance(exc, SandboxError):
        return exc
    detail = f"{what}: modal raised {type(exc).__name__}: {exc}"
    if isinstance(exc, _AUTH):
        return SandboxAuthError(
            f"{detail}; set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (or run `modal token new`)"
            " for a workspace that may create sandboxes"
        )
    if isinstance(exc, mx.SandboxFilesystemNotFoundError):
        return SandboxFileNotFound(f"{detail}; the path does not exist in the sandbox")
    if isinstance(exc, _GONE):
        return SandboxGone(
            f"{detail}; the sandbox was terminated or its lifetime ran out, create a new one"
        )
    if isinstance(exc, mx.ExecTimeoutError):
        return SandboxCommandTimeout(f"{detail}; raise the timeout or shorten the command")
    if isinstance(exc, _TRANSIENT):
        return SandboxTransientError(f"{detail}; the call may succeed when retried")
    if creating:
        return SandboxCreateError(
            f"{detail}; check the image, the resources and the app named in the config"
        )
    return SandboxError(detail)
