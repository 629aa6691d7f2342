"""Entry module: the config of the ``single-turn`` harness and its spec.

Imports only rllm-core, pydantic and the standard library; the harness (and the ``openai``
client) loads when a plan builds it.
"""

from __future__ import annotations

import string
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rllm_core import HarnessSpec, hookimpl, lazy

__all__ = ["USER_TEMPLATE_FIELDS", "SingleTurnConfig", "template_fields"]

USER_TEMPLATE_FIELDS = ("instruction", "task_id")
"""The placeholders ``user_template`` may use."""


def template_fields(template: str, allowed: tuple[str, ...], key: str) -> set[str]:
    """The ``{name}`` placeholders of ``template``; raises ``ValueError`` naming ``key`` when one
    is not in ``allowed`` or the template is not valid ``str.format`` syntax."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ValueError(
            f"{key} is not a valid template ({exc}); write literal braces as {{{{ and }}}}"
        ) from None
    for name in sorted(names):
        if name not in allowed:
            raise ValueError(
                f"{key} uses the placeholder {{{name}}}, which is not one of "
                + ", ".join(f"{{{a}}}" for a in allowed)
                + "; write literal braces as {{ and }}"
            )
    return names


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
    max_tokens: int | None = Field(
        default=None,
        gt=0,
        description="completion length sent with the request; unset leaves it to the gateway",
    )
    request_timeout_s: float = Field(
        default=600.0, gt=0, description="HTTP timeout of the chat request, in seconds"
    )
    max_retries: int = Field(
        default=2,
        ge=0,
        description="retries of a failed request (connection errors, 429, 5xx) by the client",
    )

    @field_validator("user_template")
    @classmethod
    def _known_placeholders(cls, value: str) -> str:
        template_fields(value, USER_TEMPLATE_FIELDS, "user_template")
        return value


@hookimpl
def rllm_harnesses() -> Iterator[HarnessSpec]:
    yield HarnessSpec(
        name="single-turn",
        factory=lazy("rllm_harness_single_turn.harness:SingleTurnHarness"),
        config=SingleTurnConfig,
        summary="one chat request with the task's instruction; the reply is the answer",
    )
