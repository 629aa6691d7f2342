"""Hypothesis strategies for the tool-call format tests: tools offered with typed parameters,
calls of them with nested JSON arguments (unicode, quotes, backslashes, numbers), several calls
a turn, text before and after, reasoning; and :func:`generate`, which draws a fixed batch of
examples to send to the vLLM oracle in one request.

A format's test narrows what its syntax cannot carry with ``forbidden`` (substrings no text
may hold: the family's markers) and its own ``strings`` for parameter values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from rllm_core.types import ToolCall
from toolformats.vllm_oracle import SPECIAL_TOKENS

T = TypeVar("T")

KINDS = ("string", "integer", "number", "boolean", "array", "object")

_LOWER = "abcdefghijklmnopqrstuvwxyz"
_WORD = _LOWER + _LOWER.upper() + "0123456789_"
IDENTIFIERS = st.builds(
    str.__add__, st.sampled_from(_LOWER + _LOWER.upper() + "_"), st.text(_WORD, max_size=15)
)
NAMES = st.builds(
    str.__add__, st.sampled_from(_LOWER), st.text(_LOWER + "0123456789_", max_size=15)
)

# Quotes, backslashes, braces, newlines, markup-ish characters and non-ASCII, more often than
# uniform sampling would give them.
_TRICKY = st.sampled_from([*"\"\\{}[]<>=:,\n\t /'`$", "é", "ü", "日", "😀", "\u2028"])
_CHARACTERS = st.characters(exclude_categories=("Cs", "Cc")) | st.sampled_from(["\n", "\t"])


def texts(
    forbidden: Sequence[str] = (), *, min_size: int = 0, max_size: int = 40
) -> st.SearchStrategy[str]:
    """Text with unicode, quotes and markup-ish characters, holding none of ``forbidden`` and
    none of the oracle's special tokens.

    Hypothesis also draws string constants it finds in the modules loaded so far (the formats'
    own markers among them), so without the second rule which markers appear would depend on
    which tests ran first; every family's special tokens are one token to the oracle, which no
    text of a real completion spells."""
    banned = (*forbidden, *SPECIAL_TOKENS)
    strategy = st.text(_TRICKY | _CHARACTERS, min_size=min_size, max_size=max_size)
    return strategy.filter(lambda text: not any(f in text for f in banned))


def numbers() -> st.SearchStrategy[int | float]:
    return st.integers(min_value=-(2**53), max_value=2**53) | st.floats(
        allow_nan=False, allow_infinity=False
    )


def json_values(strings: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[Any]:
    """Any JSON value, nested up to a few levels."""
    strings = strings if strings is not None else texts()
    leaves = st.none() | st.booleans() | numbers() | strings
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(strings, inner, max_size=4),
        max_leaves=10,
    )


def values_of(kind: str, strings: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[Any]:
    """A value of JSON-schema type ``kind`` (one of :data:`KINDS`)."""
    strings = strings if strings is not None else texts()
    if kind == "string":
        return strings
    if kind == "integer":
        return st.integers(min_value=-(2**53), max_value=2**53)
    if kind == "number":
        return numbers()
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(json_values(strings), max_size=4)
    return st.dictionaries(strings, json_values(strings), max_size=4)


@dataclass(frozen=True)
class Tool:
    """A function offered to the model: its name and each parameter's JSON-schema type."""

    name: str
    parameters: dict[str, str]

    def openai(self) -> dict[str, Any]:
        """The OpenAI function-tool dict (what a request's ``tools`` holds)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": f"the {self.name} tool",
                "parameters": {
                    "type": "object",
                    "properties": {p: {"type": k} for p, k in self.parameters.items()},
                },
            },
        }


_TOOLS = st.lists(
    st.builds(
        Tool,
        name=NAMES,
        parameters=st.dictionaries(IDENTIFIERS, st.sampled_from(KINDS), max_size=4),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda t: t.name,
)


def tools() -> st.SearchStrategy[list[Tool]]:
    """One to three distinct functions, each with up to four typed parameters."""
    return _TOOLS


@dataclass(frozen=True)
class Turn:
    """One assistant turn to write and read back: its content, reasoning, calls, and the
    tools offered (the calls use them)."""

    content: str
    reasoning: str | None
    calls: tuple[ToolCall, ...]
    tools: tuple[Tool, ...] = field(default=())

    def openai_tools(self) -> list[dict[str, Any]]:
        return [tool.openai() for tool in self.tools]

    def arguments(self) -> list[Any]:
        """Each call's arguments as a JSON value."""
        return [json.loads(call.arguments) for call in self.calls]


def turns(
    *,
    forbidden: Sequence[str] = (),
    min_calls: int = 0,
    max_calls: int = 3,
    reasoning: bool = True,
    content: st.SearchStrategy[str] | None = None,
    strings: st.SearchStrategy[str] | None = None,
) -> st.SearchStrategy[Turn]:
    """A turn with ``min_calls`` to ``max_calls`` calls of the tools it offers (ids
    ``call_0``, ...; each call passes some of its tool's parameters); its content
    (``content``, else :func:`texts`), reasoning (when ``reasoning``, else ``None``) and
    string values (``strings``, else :func:`texts`) hold none of ``forbidden``."""
    # Sub-strategies are built once here, not per example: hypothesis validates each new one.
    text = content if content is not None else texts(forbidden)
    string_values = strings if strings is not None else texts(forbidden, max_size=20)
    by_kind = {kind: values_of(kind, string_values) for kind in KINDS}
    thoughts = (st.none() | texts(forbidden, min_size=1)) if reasoning else st.none()
    counts = st.integers(min_value=min_calls, max_value=max_calls)

    @st.composite
    def turn(draw: st.DrawFn) -> Turn:
        offered = draw(tools())
        calls = []
        for n in range(draw(counts)):
            tool = draw(st.sampled_from(offered))
            arguments = {
                parameter: draw(by_kind[kind])
                for parameter, kind in tool.parameters.items()
                if draw(st.booleans())
            }
            calls.append(
                ToolCall(
                    id=f"call_{n}",
                    name=tool.name,
                    arguments=json.dumps(arguments, ensure_ascii=False),
                )
            )
        return Turn(
            content=draw(text),
            reasoning=draw(thoughts),
            calls=tuple(calls),
            tools=tuple(offered),
        )

    return turn()


def generate(strategy: st.SearchStrategy[T], count: int) -> list[T]:
    """``count`` examples of ``strategy``, the same ones every run (derandomized), for one
    batched request to the oracle rather than one round trip per example."""
    drawn: list[T] = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def draw(example: T) -> None:
        drawn.append(example)

    draw()
    return drawn


def disagreements(examples: Sequence[T], check: Callable[[T], None], limit: int = 5) -> list[str]:
    """Run ``check`` on every example; the first ``limit`` failures, each with its example,
    so one run shows several disagreements rather than the first."""
    found: list[str] = []
    for example in examples:
        try:
            check(example)
        except AssertionError as exc:
            found.append(f"{example!r}\n  {exc}")
            if len(found) >= limit:
                break
    return found
