"""How a mini-swe-agent run maps to a :class:`~rllm_core.types.Termination`.

The agent ends with an exit status (the ``exit_status`` of its last message) or an exception
out of ``DefaultAgent.run``:

========================  ==================================================================
``Submitted``             ``DONE``; the submission is the outcome's ``answer``
``LimitsExceeded``        ``MAX_TURNS`` (``limit`` in the metadata: ``steps`` or ``cost``)
``TimeExceeded``          ``TIMEOUT``
``RepeatedFormatError``   ``FORMAT_ERROR``
context window refused    ``CONTEXT_LENGTH`` (litellm's ``ContextWindowExceededError``, or what
                          :func:`rllm_core.kit.chat.is_context_length_error` reads as one)
any other API error       ``MODEL_ERROR`` with ``error``, ``error_type`` and ``status``
sandbox failure           ``SANDBOX_ERROR`` with ``error`` and ``error_type``
========================  ==================================================================

Any other exception is a bug and propagates.
"""

from __future__ import annotations

from typing import Any

import litellm
import openai
from rllm_core.kit.chat import is_context_length_error
from rllm_core.types import Termination

from rllm_harness_mini_swe_agent.environment import SandboxFailed

__all__ = ["EXIT_STATUSES", "from_exception", "is_tools_refusal"]

EXIT_STATUSES: dict[str, Termination] = {
    "Submitted": Termination.DONE,
    "LimitsExceeded": Termination.MAX_TURNS,
    "TimeExceeded": Termination.TIMEOUT,
    "RepeatedFormatError": Termination.FORMAT_ERROR,
}
"""The agent's exit statuses and the termination each stands for."""


def is_context_length(exc: BaseException) -> bool:
    """Whether a failed call says the prompt does not fit the model's context. litellm's
    errors keep the gateway's status and error code, which the core reads as for any client."""
    if isinstance(exc, litellm.ContextWindowExceededError):
        return True
    return isinstance(exc, openai.APIStatusError) and is_context_length_error(exc)


def is_tools_refusal(exc: BaseException) -> bool:
    """Whether the gateway refused to render the request: status 400 with code
    ``unrenderable``. On the first request of a tool-calling agent (a system and a user
    message, and the ``bash`` tool) that is the renderer's template having no tool format."""
    return (
        isinstance(exc, openai.APIStatusError)
        and exc.status_code == 400
        and exc.code == "unrenderable"
    )


def from_exception(exc: BaseException) -> tuple[Termination, dict[str, Any]] | None:
    """The termination and metadata a failed run's exception stands for; ``None`` for an
    exception that is not the model's or the sandbox's (a bug: let it propagate)."""
    if isinstance(exc, SandboxFailed):
        return Termination.SANDBOX_ERROR, {
            "error": str(exc.error),
            "error_type": type(exc.error).__name__,
        }
    if not isinstance(exc, openai.APIError):
        return None
    # litellm's exceptions subclass the openai client's; the rollout runner reads these two
    # names as "the model server failed" (retried, not scored).
    if isinstance(exc, openai.APITimeoutError):
        error_type = "APITimeoutError"
    elif isinstance(exc, openai.APIConnectionError):
        error_type = "APIConnectionError"
    else:
        error_type = type(exc).__name__
    details: dict[str, Any] = {"error": str(exc), "error_type": error_type}
    if isinstance(exc, openai.APIStatusError):
        details["status"] = exc.status_code
    if is_context_length(exc):
        return Termination.CONTEXT_LENGTH, details
    return Termination.MODEL_ERROR, details
