"""Entry module: the ``chatml`` renderer's config and spec.

Imports only rllm-core, pydantic and the standard library; the renderer and the tokenizers
library load when a plan builds the component.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import PlanPath, RendererSpec, hookimpl, lazy

__all__ = ["ChatMLConfig"]


class ChatMLConfig(BaseModel):
    """Keys of ``[renderer] name = "chatml"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokenizer: Annotated[str, PlanPath()] = Field(
        description="local folder of a Hugging Face tokenizer: its tokenizer.json is used, and"
        " with template='auto' its chat template tells which template to render"
    )
    template: Literal["auto", "smollm2", "qwen2.5"] = Field(
        default="auto",
        description="which ChatML template to render; 'auto' recognises it from the chat"
        " template stored with the tokenizer",
    )
    default_system: str | None = Field(
        default=None,
        description="system message used when a conversation has none; None keeps the"
        " template's own default",
    )


@hookimpl
def rllm_renderers() -> Iterator[RendererSpec]:
    yield RendererSpec(
        name="chatml",
        factory=lazy("rllm_renderer_chatml.renderer:ChatMLRenderer.from_config"),
        config=ChatMLConfig,
        summary="ChatML templates of SmolLM2-Instruct and Qwen2.5-Instruct (tools, tool"
        " results), with a bridge that never re-tokenizes the past",
    )
