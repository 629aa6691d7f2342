"""Entry module: the ``qwen3`` renderer's config and spec.

Imports only rllm-core, pydantic and the standard library; the renderer and the tokenizers
library load when a plan builds the component.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import PlanPath, RendererSpec, hookimpl, lazy

__all__ = ["Qwen3Config"]


class Qwen3Config(BaseModel):
    """Keys of ``[renderer] name = "qwen3"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokenizer: Annotated[str, PlanPath()] = Field(
        description="local folder of a Hugging Face tokenizer with a Qwen vocabulary (Qwen3's,"
        " or Qwen2.5's, where <think> is plain text); its tokenizer.json is used"
    )
    keep_reasoning: bool = Field(
        default=False,
        description="false: drop past reasoning at a new user turn as Qwen3's template does"
        " (the bridge then refuses and the prompt is re-rendered); true: keep every turn's"
        " think block, so every next prompt extends the last",
    )
    enable_thinking: bool = Field(
        default=True,
        description="false: the generation prompt carries an empty think block, as the"
        " template's enable_thinking=False does",
    )


@hookimpl
def rllm_renderers() -> Iterator[RendererSpec]:
    yield RendererSpec(
        name="qwen3",
        factory=lazy("rllm_renderer_qwen3.renderer:Qwen3Renderer.from_config"),
        config=Qwen3Config,
        summary="Qwen3 thinking template: <think> reasoning parsed out, past reasoning dropped"
        " or kept across turns",
    )
