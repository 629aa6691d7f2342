"""Entry module: the configs and specs of the ``chatml`` and ``qwen3`` renderers.

Imports only rllm-core, pydantic and the standard library; the renderer and the tokenizers
library load when a plan builds the component.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rllm_core import ComponentSpec, PlanPath, hookimpl, lazy
from rllm_core.kit import toolformats

__all__ = ["ChatMLConfig", "Qwen3Config"]


LITERAL_CONTROL_TOKENS = (
    "true: a control token such as <|im_end|> written inside message text (content, reasoning,"
    " tool calls, tool results) is encoded as ordinary text, so a tool output cannot forge a"
    " turn boundary; false (the reference chat templates' behaviour): it becomes the control"
    " token. A model trained with it on should be served with it on"
)


TOOL_CALL_FORMAT = (
    "how completions write tool calls, one of the formats of rllm_core.kit.toolformats"
    " (hermes, qwen3-coder, gpt-oss, ...; the table in docs/gateway.md): the template's own"
    " <tool_call> JSON blocks are 'hermes'. Rendering past turns stays the template's"
)


def known_tool_call_format(name: str) -> str:
    """``name`` when it is a registered tool-call format; else the error lists them."""
    if name not in toolformats.FORMATS:
        raise ValueError(str(toolformats.UnknownToolCallFormat(name)))
    return name


class ChatMLConfig(BaseModel):
    """Keys of ``[renderer] name = "chatml"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokenizer: Annotated[str, PlanPath(or_name=True, expects="tokenizer")] = Field(
        description="a Hugging Face tokenizer: a model catalog name, a local folder (relative"
        " to the plan; write ./name for a folder without a slash) or a Hub id"
        " (owner/name[@revision]) from the Hugging Face cache (run, sft and eval download it"
        " when missing and online); its tokenizer.json is"
        " used, and with template='auto' its chat template tells which template to render"
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
    literal_control_tokens: bool = Field(default=False, description=LITERAL_CONTROL_TOKENS)
    tool_call_format: str = Field(default="hermes", description=TOOL_CALL_FORMAT)

    _known_format = field_validator("tool_call_format")(known_tool_call_format)


class Qwen3Config(BaseModel):
    """Keys of ``[renderer] name = "qwen3"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokenizer: Annotated[str, PlanPath(or_name=True, expects="tokenizer")] = Field(
        description="a Hugging Face tokenizer with a Qwen vocabulary (Qwen3's, or Qwen2.5's,"
        " where <think> is plain text): a local folder (relative to the plan; write ./name for"
        " a folder without a slash) or a Hub id (owner/name[@revision]) already in the Hugging"
        " Face cache; its tokenizer.json is used"
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
    literal_control_tokens: bool = Field(default=False, description=LITERAL_CONTROL_TOKENS)
    tool_call_format: str = Field(default="hermes", description=TOOL_CALL_FORMAT)

    _known_format = field_validator("tool_call_format")(known_tool_call_format)


@hookimpl
def rllm_renderers() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="renderer",
        name="chatml",
        traits={"run_keys": ("tokenizer",)},
        factory=lazy("rllm_renderer_chatml.renderer:ChatMLRenderer.from_config"),
        config=ChatMLConfig,
        summary="ChatML templates of SmolLM2-Instruct and Qwen2.5-Instruct (tools, tool"
        " results), with a bridge that never re-tokenizes the past",
    )
    yield ComponentSpec(
        kind="renderer",
        name="qwen3",
        traits={"run_keys": ("tokenizer",)},
        factory=lazy("rllm_renderer_chatml.qwen3:Qwen3Renderer.from_config"),
        config=Qwen3Config,
        summary="Qwen3 thinking template: <think> reasoning parsed out, past reasoning dropped"
        " or kept across turns",
    )
