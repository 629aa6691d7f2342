"""Entry module: the ``hf`` renderer's config and spec.

Imports only rllm-core, pydantic and the standard library; transformers loads when a plan
builds the component.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rllm_core import ComponentSpec, PlanPath, hookimpl, lazy
from rllm_core.kit import toolformats

__all__ = ["HFConfig"]


class HFConfig(BaseModel):
    """Keys of ``[renderer] name = "hf"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokenizer: Annotated[str, PlanPath(or_name=True, expects="tokenizer")] = Field(
        description="the tokenizer with a chat template: a model catalog name, a local folder"
        " (relative to the plan; write ./name for a folder without a slash) or a Hugging Face"
        " Hub id (owner/name[@revision]) from the Hugging Face cache (run, sft and eval download"
        " it when missing, unless HF_HUB_OFFLINE=1)"
    )
    chat_template: str | None = Field(
        default=None,
        description="Jinja chat template text to use instead of the tokenizer's own",
    )
    template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="extra variables for the template, e.g. {enable_thinking = false}",
    )
    tool_arguments: Literal["object", "string"] = Field(
        default="object",
        description="how tool-call arguments reach the template: 'object' decodes their JSON"
        " text (the Hugging Face convention), 'string' passes the text as it is",
    )
    stop_tokens: list[str] = Field(
        default_factory=list,
        description="tokens that end an assistant turn, besides the tokenizer's EOS and the"
        " usual turn-close tokens it has (<|im_end|>, <|eot_id|>, <end_of_turn>, ...)",
    )
    literal_control_tokens: bool = Field(
        default=False,
        description="true: a control token (an added token marked special, such as"
        " <|im_end|> or <|eot_id|>) written inside message text (content, reasoning, tool"
        " calls, tool results) is encoded as ordinary text, so a tool output cannot forge a"
        " turn boundary; false (what the chat template does): it becomes the control token. A"
        " model trained with it on should be served with it on",
    )
    tool_call_format: str | None = Field(
        default=None,
        description="how completions write tool calls, one of the formats of"
        " rllm_core.kit.toolformats (hermes, qwen3-coder, gpt-oss, glm-4.5, ...; the table in"
        " docs/gateway.md). Unset: the format whose markers the chat template writes; a"
        " template that renders no tool calls is read as 'hermes' (<tool_call> JSON blocks);"
        " one that renders them in a format not recognized is refused until this is set",
    )
    history_size: int = Field(
        default=4096,
        ge=1,
        description="how many recent prompts the renderer remembers the conversation of; the"
        " bridge re-renders a remembered conversation and returns None for a prompt it"
        " does not know",
    )

    @field_validator("tool_call_format")
    @classmethod
    def _known_format(cls, name: str | None) -> str | None:
        if name is not None and name not in toolformats.FORMATS:
            raise ValueError(str(toolformats.UnknownToolCallFormat(name)))
        return name


@hookimpl
def rllm_renderers() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="renderer",
        name="hf",
        traits={"run_keys": ("tokenizer",)},
        factory=lazy("rllm_renderer_hf.renderer:HFRenderer.from_config"),
        config=HFConfig,
        summary="any tokenizer's chat template via transformers, with a bridge that checks the"
        " prefix at run time",
    )
