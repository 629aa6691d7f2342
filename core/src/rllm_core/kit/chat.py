"""One chat call to an episode's endpoint, with the failures that end an episode made typed.

:func:`chat` returns the reply or raises :class:`ModelCallError`, whose ``termination`` is
``CONTEXT_LENGTH`` when the endpoint refused the prompt as too long and ``MODEL_ERROR`` for
every other failure of the call (connection lost, timeouts after the client's retries, any
other error status). ``details`` is a JSON-safe record of what happened for the outcome's
metadata.

How the rllm-core gateway reports an over-long prompt: status 400 with error code
``prompt_too_long`` (its own ``max_prompt_tokens`` limit) or ``upstream_rejected`` (a model
server refused the prompt). Other OpenAI-compatible servers use ``context_length_exceeded``
or say "maximum context length" in the message; both are recognised too.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from rllm_core.types import LLMEndpoint, Termination

__all__ = [
    "CONTEXT_LENGTH_CODES",
    "ChatReply",
    "ModelCallError",
    "chat",
    "is_context_length_error",
    "open_client",
]

CONTEXT_LENGTH_CODES = frozenset(
    {"prompt_too_long", "upstream_rejected", "context_length_exceeded"}
)
_CONTEXT_LENGTH_PHRASES = ("context length", "context_length", "maximum context", "too many tokens")


@dataclass(frozen=True, slots=True)
class ChatReply:
    """The assistant's reply: ``content`` (``""`` when the model wrote none), its reasoning
    text when the server separates it, and the choice's ``finish_reason``."""

    content: str
    reasoning: str | None = None
    finish_reason: str | None = None

    def as_message(self) -> dict[str, Any]:
        """The reply as the assistant message of the next request."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        return message


class ModelCallError(Exception):
    """A model call failed in a way that ends the episode with ``termination``."""

    def __init__(self, message: str, *, termination: Termination, details: dict[str, Any]):
        super().__init__(message)
        self.termination = termination
        self.details = details


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Loading the certificate store takes tens of milliseconds of CPU; a run opens one client
    # per rollout, many at once, so building it per client stalls the start of every step.
    return httpx.create_ssl_context()


def open_client(llm: LLMEndpoint, *, timeout_s: float, max_retries: int) -> openai.AsyncOpenAI:
    """An ``AsyncOpenAI`` client on ``llm`` with an explicit timeout and retry count; every
    client shares one TLS context (httpx's default verification)."""
    return openai.AsyncOpenAI(
        base_url=llm.base_url,
        api_key=llm.api_key,
        timeout=timeout_s,
        max_retries=max_retries,
        http_client=openai.DefaultAsyncHttpxClient(verify=_tls_context()),
    )


def is_context_length_error(error: openai.APIStatusError) -> bool:
    """Whether an error status says the prompt does not fit the model's context."""
    if error.status_code not in (400, 413, 422):
        return False
    if error.code in CONTEXT_LENGTH_CODES:
        return True
    text = str(error.message).lower()
    return any(phrase in text for phrase in _CONTEXT_LENGTH_PHRASES)


def _details(error: openai.APIError) -> dict[str, Any]:
    details: dict[str, Any] = {"error": str(error.message), "error_type": type(error).__name__}
    if isinstance(error, openai.APIStatusError):
        details["status"] = error.status_code
    if error.code is not None:
        details["code"] = error.code
    return details


async def chat(
    client: openai.AsyncOpenAI,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    max_tokens: int | None = None,
) -> ChatReply:
    """Send one chat request; sampling settings other than ``max_tokens`` are left to the
    endpoint (the gateway enforces them per session)."""
    extra: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens}
    try:
        response = await client.chat.completions.create(
            model=model, messages=list(messages), **extra
        )
    except openai.APIStatusError as exc:
        if is_context_length_error(exc):
            raise ModelCallError(
                f"the prompt does not fit the model's context: {exc.message}",
                termination=Termination.CONTEXT_LENGTH,
                details=_details(exc),
            ) from exc
        raise ModelCallError(
            f"the model call failed with status {exc.status_code}: {exc.message}",
            termination=Termination.MODEL_ERROR,
            details=_details(exc),
        ) from exc
    except openai.APIError as exc:
        raise ModelCallError(
            f"the model call failed: {exc.message}",
            termination=Termination.MODEL_ERROR,
            details=_details(exc),
        ) from exc
    if not response.choices:
        raise ModelCallError(
            "the model server answered with no choices",
            termination=Termination.MODEL_ERROR,
            details={"error": "no choices in the response", "error_type": "EmptyResponse"},
        )
    choice = response.choices[0]
    extras = choice.message.model_extra or {}
    reasoning = extras.get("reasoning_content") or extras.get("reasoning")
    return ChatReply(
        content=choice.message.content or "",
        reasoning=reasoning if isinstance(reasoning, str) else None,
        finish_reason=choice.finish_reason,
    )
