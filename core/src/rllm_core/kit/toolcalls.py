"""The ``<tool_call>`` text format of Qwen-style ChatML templates: the Hermes format's block
writer and reader, kept here for code that imports them from this module; the format itself
is :data:`rllm_core.kit.toolformats.hermes.HERMES`."""

from __future__ import annotations

from rllm_core.kit.toolformats.hermes import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    format_tool_call,
    split_tool_calls,
)

__all__ = ["TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "format_tool_call", "split_tool_calls"]
