"""Reading ``<tool_call>`` blocks back: every attempt kept, with its status."""

from __future__ import annotations

from rllm_core.kit.toolcalls import format_tool_call, split_tool_calls
from rllm_core.types import ParsedToolCall, ToolCall


def _block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_format():
    assert (
        format_tool_call("f", '{"a": 1}')
        == '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    )


def test_text_without_calls_is_content():
    assert split_tool_calls("Just text.\n") == ("Just text.\n", [])


def test_content_then_call_keeps_the_exact_argument_text():
    text = "Sure.\n" + _block('{"name": "f", "arguments": {"b":2,  "a": [1, 2]}}')
    content, calls = split_tool_calls(text)
    assert content == "Sure."
    assert calls == [
        ParsedToolCall(
            status="ok",
            raw='{"name": "f", "arguments": {"b":2,  "a": [1, 2]}}',
            call=ToolCall(id="call_0", name="f", arguments='{"b":2,  "a": [1, 2]}'),
        )
    ]


def test_argument_forms():
    _, calls = split_tool_calls(
        _block('{"arguments": {"x": 1}, "name": "reordered"}')
        + "\n"
        + _block('{"name": "as_string", "arguments": "{\\"x\\": 1}"}')
        + "\n"
        + _block('{"name": "none"}')
    )
    assert [(c.status, c.call.name, c.call.arguments) for c in calls] == [
        ("ok", "reordered", '{"x": 1}'),
        ("ok", "as_string", '{"x": 1}'),
        ("ok", "none", "{}"),
    ]
    assert [c.call.id for c in calls] == ["call_0", "call_1", "call_2"]


def test_malformed_attempts_are_kept():
    text = (
        _block('{"name": "f", "arguments": {"a": 1}')
        + "\n"
        + _block('{"arguments": {}}')
        + "\n"
        + _block('{"name": ""}')
        + "\n"
        + _block("[1, 2]")
        + '\n<tool_call>\n{"name": "g", "argu'
    )
    content, calls = split_tool_calls(text)
    assert content == ""
    assert [c.status for c in calls] == [
        "invalid_json",
        "missing_name",
        "missing_name",
        "missing_name",
        "unterminated",
    ]
    assert [c.raw for c in calls] == [
        '{"name": "f", "arguments": {"a": 1}',
        '{"arguments": {}}',
        '{"name": ""}',
        "[1, 2]",
        '{"name": "g", "argu',
    ]
    assert all(c.call is None and c.error for c in calls)
    assert calls[0].error.startswith("not valid JSON: ")
    assert calls[4].error == "no </tool_call>"


def test_text_between_and_after_calls_joins_the_content():
    text = "A\n" + _block('{"name": "f"}') + "\nstray\n" + _block('{"name": "g"}') + "\ntail "
    content, calls = split_tool_calls(text)
    assert content == "A\nstray\ntail"
    assert [c.call.name for c in calls] == ["f", "g"]
