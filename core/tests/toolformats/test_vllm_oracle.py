"""The oracle itself: vLLM's hermes parser reads a Qwen-style completion through it."""

from __future__ import annotations

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def test_the_oracle_reads_a_hermes_completion_with_reasoning(vllm_oracle):
    text = (
        '<think>\nfind it\n</think>\n\nLet me look.\n<tool_call>\n{"name": "read_file",'
        ' "arguments": {"path": "ü \\"q\\".txt"}}\n</tool_call>'
    )
    [read, plain] = vllm_oracle.parse("hermes", [text, "no call"], TOOLS, reasoning_parser="qwen3")
    assert read["tools_called"] is True
    assert read["calls"] == [
        {
            "name": "read_file",
            "arguments": {"path": 'ü "q".txt'},
            "arguments_text": '{"path": "ü \\"q\\".txt"}',
        }
    ]
    assert read["reasoning"].strip() == "find it"
    assert read["content"].strip() == "Let me look."
    assert plain["tools_called"] is False
    assert plain["calls"] == []


def test_the_oracle_reports_an_unknown_parser(vllm_oracle):
    import pytest

    with pytest.raises(RuntimeError, match="no-such-parser"):
        vllm_oracle.parse("no-such-parser", ["x"])
