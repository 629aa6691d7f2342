"""Entry module: the config of the ``single-turn`` harness and its spec.

Imports only rllm-core, pydantic and the standard library; the harness (and the ``openai``
client) loads when a plan builds it.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rllm_core import ComponentSpec, hookimpl, lazy
from rllm_core.kit.harness_keys import MaxRetries, MaxTokens, RequestTimeout
from rllm_core.kit.templates import template_fields

__all__ = ["USER_TEMPLATE_FIELDS", "SingleTurnConfig"]

USER_TEMPLATE_FIELDS = ("instruction", "task_id")
"""The placeholders ``user_template`` may use."""


class SingleTurnConfig(BaseModel):
    """Keys of ``[harness] name = "single-turn"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system_prompt: str | None = Field(
        default=None, description="system message sent before the user message; none when unset"
    )
    user_template: str = Field(
        default="{instruction}",
        description="the user message; placeholders {instruction} and {task_id}",
    )
    max_tokens: MaxTokens = Field(
        default=None,
        description="completion length sent with the request; unset leaves it to the gateway",
    )
    request_timeout_s: RequestTimeout = Field(
        default=600.0, description="HTTP timeout of the chat request, in seconds"
    )
    max_retries: MaxRetries = 2

    @field_validator("user_template")
    @classmethod
    def _known_placeholders(cls, value: str) -> str:
        template_fields(value, USER_TEMPLATE_FIELDS, "user_template")
        return value


@hookimpl
def rllm_harnesses() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="harness",
        name="single-turn",
        factory=lazy("rllm_harness_single_turn.harness:SingleTurnHarness"),
        config=SingleTurnConfig,
        summary="one chat request with the task's instruction; the reply is the answer",
    )
