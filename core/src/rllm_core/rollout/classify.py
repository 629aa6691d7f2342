"""Which rollout failures are the infrastructure's fault, and the reason each one ends with.

Infrastructure (see :class:`~rllm_core.types.Termination`):

- ``environment_start_timeout``: a ``SandboxStartTimeout`` (the backend's sandbox did not start
  in time) or a ``TaskSetupTimeout`` (the task's environment build ran past its limit);
- ``sandbox_error``: any other ``SandboxError`` while creating, preparing or using the sandbox
  (except ``SandboxAuthError``: credentials are a configuration problem, so it aborts the
  batch), and any other ``TaskSetupError`` (the task's replayed setup failed);
- ``verifier_timeout``: a ``VerifierTimeout``, or grading past its deadline;
- ``grading_error``: a ``RewardFileMissing`` or ``RewardFileInvalid`` (the verifier ran but its
  reward could not be read);
- ``verifier_error``: any other ``VerifierError`` (the verifier crashed);
- a harness outcome ending with one of those reasons or ``agent_setup_timeout`` (the harness
  could not install or start its agent in time);
- ``no_model_call``: a harness outcome ``done``, ``max_turns``, ``format_error`` or
  ``model_error`` (not a server failure) from a session whose traces hold no model call, or
  only empty replies (no completion tokens, or a reply with neither text nor tool calls):
  :func:`no_model_call`. ``timeout`` and ``context_length`` keep their own, more telling
  reason;
- a harness outcome ending with ``model_error`` whose metadata says the model server failed:
  ``status`` 500 or above, or ``error_type`` ``APIConnectionError`` / ``APITimeoutError``
  (the keys the bundled harnesses record for a failed call). This one is always masked.

``[rollout].mask`` (:class:`~rllm_core.rollout.RolloutSettings`'s ``mask``) names the
infrastructure reasons that are masked: retried, then left out of training. One it leaves out
is scored as the policy's failure (see :class:`~rllm_core.rollout.AttemptRunner`). Every other
termination (``done``, ``max_turns``, ``timeout``, ``context_length``, ``format_error``, a
``model_error`` from the model itself) is the policy's and is scored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from rllm_core.errors import (
    RewardFileInvalid,
    RewardFileMissing,
    SandboxAuthError,
    SandboxError,
    SandboxStartTimeout,
    TaskSetupError,
    TaskSetupTimeout,
    VerifierError,
    VerifierTimeout,
)
from rllm_core.types import HarnessOutcome, Termination, Trace

__all__ = [
    "CONNECTION_ERROR_TYPES",
    "InfraError",
    "classify_exception",
    "infra_outcome",
    "model_server_failed",
    "no_model_call",
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
    if isinstance(exc, (SandboxStartTimeout, TaskSetupTimeout)):
        return Termination.ENVIRONMENT_START_TIMEOUT
    if isinstance(exc, (SandboxError, TaskSetupError)):
        return Termination.SANDBOX_ERROR
    if isinstance(exc, VerifierTimeout):
        return Termination.VERIFIER_TIMEOUT
    if isinstance(exc, (RewardFileMissing, RewardFileInvalid)):
        return Termination.GRADING_ERROR
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


def _empty(trace: Trace) -> bool:
    if not trace.record.completion_token_ids:
        return True
    delta = trace.record.messages_delta
    reply = delta[-1] if delta and delta[-1].role == "assistant" else None
    return reply is not None and not reply.content.strip() and not reply.tool_calls


def no_model_call(outcome: HarnessOutcome, traces: list[Trace]) -> HarnessOutcome:
    """``outcome`` ended ``no_model_call`` when its session's ``traces`` hold no model call or
    only empty replies (see the module docstring); else ``outcome`` unchanged. The harness's
    own termination is kept in the metadata as ``harness_termination``."""
    ended = outcome.termination
    if ended.is_infrastructure or ended in (Termination.TIMEOUT, Termination.CONTEXT_LENGTH):
        return outcome
    if ended is Termination.MODEL_ERROR and model_server_failed(outcome.metadata):
        return outcome
    if any(not _empty(trace) for trace in traces):
        return outcome
    what = (
        "the agent made no model call"
        if not traces
        else f"every one of the agent's {len(traces)} model call(s) got an empty reply"
    )
    metadata = {**outcome.metadata, "harness_termination": str(ended), "error": what}
    return msgspec.structs.replace(
        outcome, termination=Termination.NO_MODEL_CALL, metadata=metadata
    )
