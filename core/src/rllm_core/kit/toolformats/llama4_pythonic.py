"""Llama 4 pythonic tool calls (vLLM's ``llama4_pythonic`` parser).

The turn's calls are one Python list of calls with keyword arguments, which the model may
wrap in ``<|python_start|>`` ... ``<|python_end|>``::

    [read_file(path="notes.txt"), search(query="llama", limit=3, exact=True)]

Arguments are Python literals read as JSON values: strings, numbers, ``True``/``False``,
``None`` (and ``true``/``false``/``null``), lists and tuples, dicts with string keys. A value
JSON cannot hold (``inf``, a set, an expression, a positional argument) makes the call
``invalid_json``. ``write`` emits strings and dict keys as JSON string literals (also valid
Python with the same value), ``True``/``False``/``None``, and numbers as JSON writes them,
so vLLM's reader and ours read back the same values; a tool name or an argument name that is
not a Python identifier cannot be written in this syntax.

``split`` reads the list from ``<|python_start|>`` or the first ``[name(`` on, so text before
it stays content (vLLM reads calls only from a turn that starts with the list); text after
the list is added to the content on a line of its own. A call's arguments are
``json.dumps`` of the values, in the order written. The family has no reasoning syntax.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import re
import warnings
from collections.abc import Sequence
from typing import Any

from rllm_core.kit.toolformats._progress import Progress, ProgressStream, add_trailing, held_back
from rllm_core.ports.rendering import ToolCallStream
from rllm_core.types import ParsedToolCall, ToolCall, ToolSpec

__all__ = ["LLAMA4_PYTHONIC", "PYTHON_END", "PYTHON_START", "Llama4Pythonic"]

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"

_IDENTIFIER = r"[^\W\d]\w*"
_START = re.compile(rf"<\|python_start\|>|\[\s*{_IDENTIFIER}\s*\(")
_PARTIAL_START = re.compile(rf"\[\s*(?:{_IDENTIFIER}\s*)?\Z")
# Strings (triple-quoted first), a quote that opens a string not closed, and the brackets
# and commas that give the list its structure.
_PIECE = re.compile(
    r"""'''(?:[^\\]|\\.)*?'''|\"\"\"(?:[^\\]|\\.)*?\"\"\"|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"
    |(?P<open_quote>['"])|(?P<open>[\[({])|(?P<close>[\])}])|(?P<comma>,)""",
    re.DOTALL | re.VERBOSE,
)
_KEYWORD_HEAD = re.compile(rf"\s*({_IDENTIFIER})\s*=(?!=)")
_JSON_NAMES = {"true": True, "false": False, "null": None}


class _NotJson(ValueError):
    """A literal that has no JSON value."""


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, float) and not math.isfinite(value):
            raise _NotJson(f"{value!r} is not a finite number")
        if value is None or isinstance(value, bool | int | float | str):
            return value
        raise _NotJson(f"{value!r} is not a JSON value")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = node.operand
        if isinstance(operand, ast.Constant) and type(operand.value) in (int, float):
            number = -operand.value if isinstance(node.op, ast.USub) else operand.value
            return _value(ast.Constant(number))
    if isinstance(node, ast.List | ast.Tuple):
        return [_value(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        result: dict[str, Any] = {}
        for key, item in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise _NotJson("a dict key that is not a string")
            result[key.value] = _value(item)
        return result
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise _NotJson(f"{ast.unparse(node)!r} is not a literal")


def _parse(source: str) -> ast.expr:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.parse(source.strip(), mode="eval").body


def _calls(index: int, raw: str) -> list[ParsedToolCall]:
    """The attempts in one whole list's text ``raw``; all of them fail when it is not a
    list of calls."""
    try:
        tree = _parse(raw)
    except (SyntaxError, ValueError) as exc:
        return [ParsedToolCall(status="invalid_json", raw=raw, error=f"not Python: {exc}")]
    if not isinstance(tree, ast.List) or not all(isinstance(e, ast.Call) for e in tree.elts):
        return [
            ParsedToolCall(status="invalid_json", raw=raw, error="not a list of function calls")
        ]
    attempts = []
    for call in tree.elts:
        assert isinstance(call, ast.Call)
        attempts.append(_call(index + len(attempts), call, ast.get_source_segment(raw, call)))
    return attempts


def _call(index: int, call: ast.Call, source: str | None) -> ParsedToolCall:
    raw = source or ast.unparse(call)
    if not isinstance(call.func, ast.Name):
        return ParsedToolCall(
            status="missing_name", raw=raw, error="the called function is not a plain name"
        )
    name = call.func.id
    if call.args or any(k.arg is None for k in call.keywords):
        return ParsedToolCall(
            status="invalid_json",
            raw=raw,
            error=f"{name} is called with positional arguments; only name=value is read",
        )
    given = [k.arg for k in call.keywords]
    if len(set(given)) < len(given):
        return ParsedToolCall(
            status="invalid_json", raw=raw, error=f"{name} is given an argument twice"
        )
    try:
        arguments = {k.arg: _value(k.value) for k in call.keywords if k.arg is not None}
    except _NotJson as exc:
        return ParsedToolCall(status="invalid_json", raw=raw, error=f"{name}: {exc}")
    text = json.dumps(arguments, ensure_ascii=False)
    return ParsedToolCall(
        status="ok", raw=raw, call=ToolCall(id=f"call_{index}", name=name, arguments=text)
    )


def _list_end(text: str, start: int) -> int | None:
    """Where the list opening at ``text[start]`` closes, ``None`` when the text ends first,
    ``-1`` when a string never closes on its line or a bracket does not match."""
    stack: list[str] = []
    for piece in _PIECE.finditer(text, start):
        if piece.group("open_quote"):
            return None if piece.group() not in text[piece.end() :] else -1
        if piece.group("open"):
            stack.append(piece.group())
        elif piece.group("close"):
            if not stack or "([{".index(stack.pop()) != ")]}".index(piece.group()):
                return -1
            if not stack:
                return piece.end()
    return None


def _read(text: str) -> tuple[str, list[ParsedToolCall], int]:
    """Content before the calls, the attempts, and where the text after them starts."""
    start = _START.search(text)
    if start is None:
        return text, [], len(text)
    content = text[: start.start()]
    pos = start.start()
    wrapped = text.startswith(PYTHON_START, pos)
    if wrapped:
        pos = _skip_space(text, pos + len(PYTHON_START))
        if pos == len(text) or text[pos] != "[":
            raw = text[pos:].strip()
            if raw.endswith(PYTHON_END):
                raw = raw[: -len(PYTHON_END)].strip()
            status = "unterminated" if not raw else "invalid_json"
            error = f"no list of calls after {PYTHON_START}"
            return content, [ParsedToolCall(status=status, raw=raw, error=error)], len(text)
    end = _list_end(text, pos)
    if end is None:
        raw = text[pos:].strip()
        error = "the list of calls never closes"
        return content, [ParsedToolCall(status="unterminated", raw=raw, error=error)], len(text)
    if end < 0:
        raw = text[pos:].strip()
        error = "a string or bracket in the list of calls does not close"
        return content, [ParsedToolCall(status="invalid_json", raw=raw, error=error)], len(text)
    attempts = _calls(0, text[pos:end])
    end = _skip_space(text, end)
    if wrapped and text.startswith(PYTHON_END, end):
        end += len(PYTHON_END)
    return content, attempts, end


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _literal(value: Any, where: str) -> str:
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int | str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value!r}, which JSON cannot hold")
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v, where) for v in value) + "]"
    if isinstance(value, dict):
        items = (
            f"{json.dumps(k, ensure_ascii=False)}: {_literal(v, where)}" for k, v in value.items()
        )
        return "{" + ", ".join(items) + "}"
    raise ValueError(f"{where} holds {value!r}, which is not a JSON value")


def _identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


class Llama4Pythonic:
    """The Llama 4 pythonic tool-call format; see the module docstring."""

    name = "llama4-pythonic"
    families = ("llama-4", "llama-3.2")
    vllm_tool_parser = "llama4_pythonic"
    vllm_reasoning_parser: str | None = None

    def split(
        self, text: str, tools: Sequence[ToolSpec] = ()
    ) -> tuple[str, str | None, list[ParsedToolCall]]:
        # The arguments are Python literals, typed by their own syntax: the offered tools
        # change nothing.
        content, attempts, rest = _read(text)
        return add_trailing(content, text[rest:]), None, attempts

    def write(self, content: str, reasoning: str | None, calls: Sequence[ToolCall]) -> str:
        if reasoning:
            raise ValueError(
                f"llama4-pythonic has no syntax for reasoning, got {reasoning[:40]!r}: pass "
                "reasoning=None, or pick the tool_call_format of a reasoning family"
            )
        if not calls:
            return content
        written = []
        for call in calls:
            if not _identifier(call.name):
                raise ValueError(
                    f"tool call {call.id!r} is named {call.name!r}, which is not a Python "
                    "identifier: llama4-pythonic can only call tools named like one"
                )
            try:
                arguments = json.loads(call.arguments)
            except ValueError as exc:
                raise ValueError(
                    f"tool call {call.id!r} ({call.name}) has arguments that are not JSON: "
                    f"{call.arguments[:80]!r} ({exc})"
                ) from exc
            if not isinstance(arguments, dict):
                raise ValueError(
                    f"tool call {call.id!r} ({call.name}) has arguments "
                    f"{call.arguments[:80]!r}, not a JSON object"
                )
            pairs = []
            for key, value in arguments.items():
                if not _identifier(key):
                    raise ValueError(
                        f"tool call {call.id!r} ({call.name}) has an argument named {key!r}, "
                        "which is not a Python identifier: llama4-pythonic cannot write it"
                    )
                pairs.append(f"{key}={_literal(value, f'argument {key!r} of {call.name}')}")
            written.append(f"{call.name}({', '.join(pairs)})")
        return f"{content}[{', '.join(written)}]"

    def stream(self, tools: Sequence[ToolSpec] = ()) -> ToolCallStream:
        return ProgressStream(_progress, self.split)

    def detects(self, chat_template: str) -> bool:
        # Llama 4's pythonic templates speak of <|python_start|>; Llama 4 templates that
        # write a JSON object ("parameters") are llama3-json's.
        return PYTHON_START in chat_template or (
            "<|header_start|>" in chat_template and '"parameters"' not in chat_template
        )


def _progress(text: str) -> Progress:
    start = _START.search(text)
    if start is None:
        tail = _PARTIAL_START.search(text)
        cut = tail.start() if tail is not None else len(text)
        return Progress(content=text[: cut - held_back(text[:cut], [PYTHON_START])])
    progress = Progress(content=text[: start.start()])
    pos = start.start()
    if text.startswith(PYTHON_START, pos):
        pos = _skip_space(text, pos + len(PYTHON_START))
        if pos == len(text) or text[pos] != "[":
            return progress
    # Walk the list: each call's name once its "(" is read, each keyword argument once the
    # "," or ")" after its value is read.
    depth = 0
    item_start = pos + 1
    arguments: dict[str, Any] = {}
    for piece in _PIECE.finditer(text, pos):
        if piece.group("open_quote"):
            return progress
        if piece.group("open"):
            depth += 1
            if depth == 2:
                if piece.group() != "(":
                    return progress
                name = text[item_start : piece.start()].strip()
                if not _identifier(name):
                    return progress
                progress.calls.append((name, "{"))
                arguments = {}
                item_start = piece.end()
        elif piece.group("close") or piece.group("comma"):
            if depth == 2:
                chunk = text[item_start : piece.start()]
                if chunk.strip():
                    head = _KEYWORD_HEAD.match(chunk)
                    if head is None:
                        return progress
                    try:
                        value = _value(_parse(chunk[head.end() :]))
                    except (SyntaxError, ValueError):
                        return progress
                    arguments[head.group(1)] = value
                    name, _ = progress.calls[-1]
                    # json.dumps of the dict so far, less its close: a prefix of the final.
                    progress.calls[-1] = (
                        name,
                        json.dumps(arguments, ensure_ascii=False)[:-1],
                    )
                item_start = piece.end()
            if piece.group("close"):
                if depth == 2:
                    name, so_far = progress.calls[-1]
                    progress.calls[-1] = (name, so_far + "}")
                depth -= 1
                if depth == 0:
                    return progress
            elif depth == 1:
                item_start = piece.end()
    return progress


LLAMA4_PYTHONIC = Llama4Pythonic()
