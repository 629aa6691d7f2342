"""Which rollout failures are the infrastructure's fault (retried, never scored).

Infrastructure:

- a ``SandboxError`` while creating, preparing or using the sandbox (except
  ``SandboxAuthError``: credentials are a configuration problem, so it aborts the batch);
- a ``TaskSetupError`` (the task's replayed setup failed: the episode cannot start);
- a ``VerifierError`` while grading (the verifier produced no reward);
- a harness outcome ending with ``sandbox_error`` or ``verifier_error``;
- a harness outcome ending with ``model_error`` whose metadata says the model server failed:
  ``status`` 500 or above, or ``error_type`` ``APIConnectionError`` / ``APITimeoutError``
  (the keys the bundled harnesses record for a failed call).

Every other termination (``done``, ``max_turns``, ``timeout``, ``context_length``,
``format_error``, a ``model_error`` from the model itself such as an empty reply) is the
policy's and is scored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rllm_core.errors import SandboxAuthError, SandboxError, TaskSetupError, VerifierError
from rllm_core.types import HarnessOutcome, Termination

__all__ = [
    "CONNECTION_ERROR_TYPES",
    "InfraError",
    "classify_exception",
    "infra_outcome",
    "model_server_failed",
]

CONNECTION_ERROR_TYPES = frozenset({"APIConnectionError", "APITimeoutError"})
"""``error_type`` values of a model call that never got an answer from the server."""


class InfraError(Exception):
    """One rollout attempt failed on infrastructure; ``termination`` says which part."""

    def __init__(self, message: str, *, termination: Termination) -> None:
        super().__init__(message)
        self.termination = termination


def classify_exception(exc: BaseException) -> Termination | None:
    """The infrastructure termination ``exc`` stands for, or ``None`` when it is not an
    infrastructure failure (and must propagate)."""
    if isinstance(exc, SandboxAuthError):
        return None
    if isinstance(exc, (SandboxError, TaskSetupError)):
        return Termination.SANDBOX_ERROR
    if isinstance(exc, VerifierError):
        return Termination.VERIFIER_ERROR
    return None


def model_server_failed(metadata: Mapping[str, Any]) -> bool:
    """Whether a ``model_error`` outcome's metadata records a server or connection failure."""
    status = metadata.get("status")
    if isinstance(status, int) and not isinstance(status, bool) and status >= 500:
        return True
    return metadata.get("error_type") in CONNECTION_ERROR_TYPES


def infra_outcome(outcome: HarnessOutcome) -> InfraError | None:
    """The infrastructure failure a harness outcome reports, or ``None`` when it is scored."""
    termination = outcome.termination
    detail = outcome.metadata.get("error")
    suffix = f": {detail}" if detail else ""
    if termination.is_infrastructure:
        return InfraError(f"the harness ended with {termination}{suffix}", termination=termination)
    if termination is Termination.MODEL_ERROR and model_server_failed(outcome.metadata):
        status = outcome.metadata.get("status")
        what = f"status {status}" if status is not None else outcome.metadata.get("error_type")
        return InfraError(
            f"the model server failed ({what}){suffix}", termination=Termination.MODEL_ERROR
        )
    return None
