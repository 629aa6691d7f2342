"""Records to OpenAI-shaped dictionaries, as chat templates read them."""

from __future__ import annotations

from rllm_core.chat_dicts import message_dicts, tool_dicts
from rllm_core.types import Message, ToolCall, ToolSpec


def test_messages_with_calls_reasoning_and_results():
    call = ToolCall(id="c1", name="add", arguments='{"a": 1}')
    broken = ToolCall(id="c2", name="add", arguments="{not json")
    messages = [
        Message(role="user", content="hi", name="ann"),
        Message(role="assistant", content="", reasoning="think", tool_calls=(call, broken)),
        Message(role="tool", content="2", tool_call_id="c1"),
    ]
    assert message_dicts(messages) == [
        {"role": "user", "content": "hi", "name": "ann"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "think",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": {"a": 1}},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "add", "arguments": "{not json"},
                },
            ],
        },
        {"role": "tool", "content": "2", "tool_call_id": "c1"},
    ]
    as_text = message_dicts(messages, arguments="string")
    assert as_text[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'


def test_tools():
    assert tool_dicts(None) is None
    assert tool_dicts([]) is None
    spec = ToolSpec(name="add", description="adds", parameters={"type": "object"})
    assert tool_dicts([spec]) == [
        {
            "type": "function",
            "function": {"name": "add", "description": "adds", "parameters": {"type": "object"}},
        }
    ]
