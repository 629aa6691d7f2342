"""The tool-call formats the gateway reads and writes, one per model family, by name.

A renderer picks one with its ``tool_call_format`` key; :func:`get` returns it, :func:`names`
lists them, and :func:`detect` names the format a chat template writes, where its text
shows it. Each format lives in its own module of this package as ``<module>:<attribute>``
(imported on first use); its contract is :mod:`rllm_core.kit.toolformats.base`.
"""

from __future__ import annotations

import importlib

from rllm_core.kit.toolformats.base import ToolCallFormat

__all__ = [
    "FORMATS",
    "ToolCallFormat",
    "UnknownToolCallFormat",
    "detect",
    "get",
    "names",
]

# name -> "module:attribute" in this package; detect() tries them in this order, so a family
# whose template also holds another's markers comes first.
FORMATS: dict[str, str] = {
    "gpt-oss": "gpt_oss:GPT_OSS",
    "qwen3-coder": "qwen3_coder:QWEN3_CODER",
    "glm-4.7": "glm:GLM47",
    "glm-4.5": "glm:GLM45",
    "kimi-k2": "kimi_k2:KIMI_K2",
    "deepseek-v3.1": "deepseek_v31:DEEPSEEK_V31",
    "minimax-m2": "minimax_m2:MINIMAX_M2",
    "llama4-pythonic": "llama4_pythonic:LLAMA4_PYTHONIC",
    "llama3-json": "llama3_json:LLAMA3_JSON",
    "mistral": "mistral:MISTRAL",
    "hermes": "hermes:HERMES",
}


class UnknownToolCallFormat(ValueError):
    """A ``tool_call_format`` that no module of this package provides."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown tool_call_format {name!r}; known formats: {', '.join(names())}")


def names() -> tuple[str, ...]:
    """Every format's name, sorted."""
    return tuple(sorted(FORMATS))


def get(name: str) -> ToolCallFormat:
    """The format called ``name``; :class:`UnknownToolCallFormat` lists the known ones."""
    target = FORMATS.get(name)
    if target is None:
        raise UnknownToolCallFormat(name)
    module, _, attribute = target.partition(":")
    found: ToolCallFormat = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
    return found


def detect(chat_template: str) -> str | None:
    """The name of the format ``chat_template`` writes tool calls in, or ``None`` when its
    text shows none (a template without tools, or one no format here recognizes)."""
    for name in FORMATS:
        if get(name).detects(chat_template):
            return name
    return None
