"""Translation of the modal SDK's exceptions into the rllm-core sandbox error taxonomy.

Every translated error keeps the SDK's exception as ``__cause__`` (the caller raises it with
``from``). The mapping (an :class:`rllm_core.kit.sandboxes.ErrorMap`):

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
from rllm_core.errors import SandboxError
from rllm_core.kit.sandboxes import ErrorMap

__all__ = ["translate"]

ERRORS = ErrorMap(
    service="modal",
    auth_hint="set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (or run `modal token new`) for a"
    " workspace that may create sandboxes",
    create_hint="check the image, the resources and the app named in the config",
    auth=(mx.AuthError, mx.PermissionDeniedError),
    file_not_found=(mx.SandboxFilesystemNotFoundError,),
    gone=(mx.NotFoundError, mx.SandboxTerminatedError, mx.SandboxTimeoutError, mx.ClientClosed),
    command_timeout=(mx.ExecTimeoutError,),
    transient=(
        mx.ConnectionError,
        mx.InternalError,
        mx.ServiceError,
        mx.ResourceExhaustedError,
        grpclib.exceptions.StreamTerminatedError,
        ConnectionError,
        OSError,
    ),
)


def translate(exc: BaseException, what: str, *, creating: bool = False) -> SandboxError:
    """The rllm-core error for ``exc`` raised by the SDK during ``what``; raise it ``from exc``.

    ``what`` names the operation and its target (``"read_file /app/x"``); ``creating`` picks
    ``SandboxCreateError`` for failures outside the other classes.
    """
    return ERRORS.translate(exc, what, creating=creating)
