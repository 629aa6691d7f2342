"""A corpus of chat conversations for renderer tests, and the tools to use it.

- :func:`corpus`: more than fifty :class:`Case` objects (system, user, assistant and tool
  turns, tool calls, reasoning, non-ASCII text, empty and very long content), each tagged so
  that a renderer's tests can leave out what its template cannot express.
- :func:`hf_messages` / :func:`hf_tools`: the records as the dictionaries Hugging Face chat
  templates read, so a test can compare ``render`` with ``apply_chat_template``.
- :func:`simulate_rollout`: multi-turn sampling through a renderer: each assistant message is
  "sampled" as the template renders it, optionally cut short, and the next prompt is built
  with ``bridge_to_next_turn``; every turn is returned with the full render to compare with.
- :class:`SmolLM2Reference` / :class:`Qwen25Reference`: the ``conversations`` and
  ``reference_render`` of a renderer conformance test over one of those chat templates.

Assistant content never starts or ends with whitespace and never contains text the template
would read back differently (a stop token, a ``<tool_call>`` tag), except in cases tagged
``parity_only``, so that every other case round-trips through ``parse_response``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from rllm_core.chat_dicts import message_dicts, tool_dicts
from rllm_core.ports import Renderer
from rllm_core.testing.suites.renderers import (
    READ_FILE_TOOL,
    Conversation,
    ReferenceRender,
    check_bridge_contract,
    sampled_span,
)
from rllm_core.testing.tokenizers import reference_render
from rllm_core.types import Message, ToolCall, ToolSpec

__all__ = [
    "TAGS",
    "Case",
    "Qwen25Reference",
    "SimulatedTurn",
    "SmolLM2Reference",
    "conversations",
    "corpus",
    "hf_messages",
    "hf_tools",
    "simulate_rollout",
]

TAGS = {
    "tools": "tools are offered to the model",
    "tool_calls": "an assistant message calls tools (and tool messages answer)",
    "reasoning": "an assistant message carries reasoning",
    "raw_think": "assistant content holds literal <think>...</think> text",
    "unicode": "non-ASCII text",
    "long": "a message of several thousand characters",
    "empty": "a message with empty content",
    "special_text": "user text spelling special tokens such as <|im_end|>",
    "mid_system": "a system message after the first message",
    "tool_response_text": "a user message whose content is a <tool_response> block",
    "ends_with_assistant": "the last message is an assistant message",
    "parity_only": "an assistant message does not round-trip through parse_response",
}
"""Every tag a :class:`Case` may carry, with what it means."""


@dataclass(frozen=True)
class Case:
    """One conversation of the corpus: an id for test reports, the messages, the tools offered
    (``None`` for none) and its tags (keys of :data:`TAGS`)."""

    id: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] | None = None
    tags: frozenset[str] = frozenset()

    @property
    def conversation(self) -> Conversation:
        return list(self.messages), list(self.tools) if self.tools else None


def conversations(cases: Iterable[Case]) -> list[Conversation]:
    """The ``(messages, tools)`` pairs of ``cases``, as the renderer suite's fixture wants."""
    return [case.conversation for case in cases]


# ---------------------------------------------------------------- building blocks


def _sys(text: str) -> Message:
    return Message(role="system", content=text)


def _user(text: str) -> Message:
    return Message(role="user", content=text)


def _bot(text: str, *calls: ToolCall, reasoning: str | None = None) -> Message:
    return Message(role="assistant", content=text, tool_calls=calls, reasoning=reasoning)


def _tool(text: str, call_id: str) -> Message:
    return Message(role="tool", content=text, tool_call_id=call_id)


def _call(n: int, name: str, arguments: dict[str, Any]) -> ToolCall:
    return ToolCall(id=f"call_{n}", name=name, arguments=json.dumps(arguments, ensure_ascii=False))


READ_FILE = READ_FILE_TOOL
SEARCH = ToolSpec(
    name="search",
    description="Search the documentation and return the best matches.",
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "filters": {
                "type": "object",
                "properties": {
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                },
            },
        },
        "required": ["query"],
    },
)
WEATHER = ToolSpec(
    name="get_weather",
    description="Température et vent pour une ville (données météo).",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    },
)
NO_ARGS = ToolSpec(name="list_files")

_SENTENCE = (
    "the gateway renders every turn into tokens and the trainer sees exactly those tokens"
    " while storage keeps only what each turn adds so a long session costs linear space"
)
_WORDS = _SENTENCE.split(" ")


def _long_text(chars: int, *, seed: int = 0, unicode: bool = False) -> str:
    extra = ["naïve", "größe", "数据", "🙂", "ελληνικά", "спасибо"] if unicode else []
    words = _WORDS + extra
    out: list[str] = []
    size, n = 0, seed
    while size < chars:
        word = words[(n * 7 + seed) % len(words)]
        if n % 17 == 16:
            word += ".\n\n"
        elif n % 5 == 4:
            word += ","
        out.append(word)
        size += len(word) + 1
        n += 1
    return " ".join(out).replace("\n ", "\n").strip()


_UNICODE_USER = "Übersetze bitte: «Ça va?» — 你好\uff0c世界\uff01 مرحبا بالعالم 🙂🚀 ĉu vi? ﬁne ½"
_UNICODE_BOT = "Gerne: „Wie geht's?“ — 你好\uff0c世界! مرحبا 🙂 ½ ≈ 0.5"
_CODE = 'def add(a, b):\n    """Add two numbers."""\n    return a + b\n\n\tprint(add(2, 3))  # 5'
_WHITESPACE = "  leading spaces\n\n\nthree newlines\ttab\r\nwindows line   \n trailing  "
_SPECIAL = "Quote the tokens <|im_start|>, <|im_end|> and <|endoftext|> literally, please."


def _chats() -> list[tuple[str, list[Message], frozenset[str]]]:
    """Plain chats (no tools, no reasoning), before the system-message variants."""
    t = frozenset
    return [
        ("one-question", [_user("What is 2+2?")], t()),
        ("question-answer", [_user("What is 2+2?"), _bot("4")], t({"ends_with_assistant"})),
        (
            "three-turns",
            [
                _user("Name a colour."),
                _bot("Blue."),
                _user("Another one?"),
                _bot("Green."),
                _user("Thanks."),
            ],
            t(),
        ),
        (
            "three-turns-ends-assistant",
            [
                _user("Count to three."),
                _bot("1, 2, 3."),
                _user("Now backwards."),
                _bot("3, 2, 1."),
            ],
            t({"ends_with_assistant"}),
        ),
        ("unicode-question", [_user(_UNICODE_USER)], t({"unicode"})),
        (
            "unicode-answer",
            [_user(_UNICODE_USER), _bot(_UNICODE_BOT), _user("Merci !")],
            t({"unicode"}),
        ),
        ("empty-user", [_user("")], t({"empty"})),
        ("empty-answer", [_user("Say nothing."), _bot(""), _user("Good.")], t({"empty"})),
        (
            "empty-answer-last",
            [_user("Say nothing."), _bot("")],
            t({"empty", "ends_with_assistant"}),
        ),
        ("whitespace-user", [_user(_WHITESPACE), _bot("Noted.")], t({"ends_with_assistant"})),
        ("code", [_user(_CODE), _bot("It prints 5.\n\nThe tab is odd.")], t()),
        ("long-user", [_user(_long_text(24_000, seed=1))], t({"long"})),
        (
            "long-user-unicode",
            [_user(_long_text(12_000, seed=2, unicode=True)), _bot("Summarised."), _user("More?")],
            t({"long", "unicode"}),
        ),
        (
            "long-answer",
            [_user("Explain the gateway."), _bot(_long_text(1_500, seed=3)), _user("Shorter?")],
            t({"long"}),
        ),
        ("special-text", [_user(_SPECIAL), _bot("Done.")], t({"special_text"})),
        (
            "mid-system",
            [
                _user("Hi."),
                _bot("Hello!"),
                _sys("From now on answer in French."),
                _user("How are you?"),
            ],
            t({"mid_system"}),
        ),
        (
            "digits-and-punctuation",
            [_user("Compute 123456789 * 987654321 = ?"), _bot("121932631112635269."), _user("!")],
            t(),
        ),
        (
            "many-turns",
            [
                m
                for i in range(8)
                for m in (_user(f"Step {i}: add {i}."), _bot(f"Total is {i * (i + 1) // 2}."))
            ]
            + [_user("Done?")],
            t(),
        ),
        (
            "newlines-inside-answer",
            [_user("List two."), _bot("- one\n- two\n\n(end)"), _user("ok")],
            t(),
        ),
        ("markdown", [_user("# Title\n\n* a\n* b\n\n> quote"), _bot("**Bold** and `code`.")], t()),
    ]


_SYSTEMS = {
    "": None,
    "sys": "You are a terse assistant.",
    "sys-unicode": "Tu es un assistant concis. 回答要简短。",
    "sys-empty": "",
}


def _tool_cases() -> list[Case]:
    t = frozenset
    tools1 = (READ_FILE,)
    tools3 = (READ_FILE, SEARCH, WEATHER)
    read = _call(1, "read_file", {"path": "notes.txt"})
    cases: list[tuple[str, list[Message], tuple[ToolSpec, ...], frozenset[str]]] = [
        (
            "tool-call-and-answer",
            [
                _user("What is in notes.txt?"),
                _bot("", read),
                _tool("buy milk", "call_1"),
                _bot("It says: buy milk."),
                _user("Thanks!"),
            ],
            tools1,
            t(),
        ),
        (
            "tool-call-with-content",
            [
                _user("What is in notes.txt?"),
                _bot("Let me look.", read),
                _tool("buy milk\nand eggs", "call_1"),
                _bot("Milk and eggs."),
            ],
            tools1,
            t({"ends_with_assistant"}),
        ),
        (
            "parallel-calls",
            [
                _user("Weather in Paris and Tokyo?"),
                _bot(
                    "",
                    _call(1, "get_weather", {"city": "Paris", "unit": "celsius"}),
                    _call(2, "get_weather", {"city": "東京"}),
                ),
                _tool('{"temp": 21, "wind": "5 km/h"}', "call_1"),
                _tool('{"temp": 18, "wind": "calme"}', "call_2"),
                _bot("Paris 21 °C, Tokyo 18 °C."),
                _user("Merci."),
            ],
            tools3,
            t({"unicode"}),
        ),
        (
            "parallel-calls-with-content",
            [
                _user("Search twice."),
                _bot(
                    "Searching both.",
                    _call(1, "search", {"query": "tokens", "filters": {"tags": ["a", "b"]}}),
                    _call(2, "search", {"query": "deltas", "filters": {"limit": 3}}),
                ),
                _tool("3 results", "call_1"),
                _tool("", "call_2"),
            ],
            tools3,
            t({"empty"}),
        ),
        (
            "multi-step-tools",
            [
                _user("Find the config and read it."),
                _bot("", _call(1, "search", {"query": "config file"})),
                _tool("config.toml", "call_1"),
                _bot("", _call(2, "read_file", {"path": "config.toml"})),
                _tool('[run]\nname = "x"', "call_2"),
                _bot("The run is named x."),
                _user("Great."),
            ],
            tools3,
            t(),
        ),
        (
            "call-without-arguments",
            [_user("What files are there?"), _bot("", _call(1, "list_files", {}))],
            (NO_ARGS, READ_FILE),
            t({"ends_with_assistant"}),
        ),
        (
            "call-with-nested-arguments",
            [
                _user("Search with filters."),
                _bot(
                    "",
                    _call(
                        1,
                        "search",
                        {"query": "naïve “quotes”", "filters": {"tags": [], "limit": 50}},
                    ),
                ),
                _tool("nothing found", "call_1"),
                _user("Try again."),
            ],
            tools3,
            t({"unicode"}),
        ),
        ("tools-offered-unused", [_user("Just say hi."), _bot("Hi!")], tools3, t()),
        ("tools-offered-question", [_user("Can you read files?")], tools1, t()),
        (
            "long-tool-result",
            [
                _user("Read the essay."),
                _bot("", _call(1, "read_file", {"path": "essay.md"})),
                _tool(_long_text(8_000, seed=4, unicode=True), "call_1"),
            ],
            tools1,
            t({"long", "unicode"}),
        ),
        (
            "tool-result-then-user",
            [
                _user("Read a.txt."),
                _bot("", _call(1, "read_file", {"path": "a.txt"})),
                _tool("alpha", "call_1"),
                _user("Also b.txt please."),
            ],
            tools1,
            t(),
        ),
    ]
    out = []
    for name, messages, tools, tags in cases:
        for system_key in ("", "sys"):
            system = _SYSTEMS[system_key]
            prefix = [] if system is None else [_sys(system)]
            out.append(
                Case(
                    id=f"{name}-{system_key}" if system_key else name,
                    messages=tuple(prefix + messages),
                    tools=tools,
                    tags=tags | ({"tools", "tool_calls"} if _has_calls(messages) else {"tools"}),
                )
            )
    return out


def _has_calls(messages: Sequence[Message]) -> bool:
    return any(m.tool_calls for m in messages)


def _reasoning_cases() -> list[Case]:
    t = frozenset
    read = _call(1, "read_file", {"path": "notes.txt"})
    specs: list[tuple[str, list[Message], tuple[ToolSpec, ...] | None, frozenset[str]]] = [
        (
            "reasoning-last",
            [_user("What is 2+2?"), _bot("4", reasoning="Two plus two is four.")],
            None,
            t({"ends_with_assistant"}),
        ),
        (
            "reasoning-stripped-before-query",
            [
                _user("What is 2+2?"),
                _bot("4", reasoning="Simple addition."),
                _user("And 3+3?"),
            ],
            None,
            t(),
        ),
        (
            "reasoning-multi-turn",
            [
                _sys("Think step by step."),
                _user("2+2?"),
                _bot("4", reasoning="Add."),
                _user("Times 3?"),
                _bot("12", reasoning="4 \u00d7 3 = 12."),
            ],
            None,
            t({"ends_with_assistant", "unicode"}),
        ),
        (
            "reasoning-empty",
            [_user("Hi"), _bot("Hello!", reasoning=""), _user("Bye")],
            None,
            t({"empty"}),
        ),
        (
            "reasoning-unicode-long",
            [
                _user("Explique."),
                _bot("Voilà.", reasoning=_long_text(3_000, seed=5, unicode=True)),
            ],
            None,
            t({"unicode", "long", "ends_with_assistant"}),
        ),
        (
            "reasoning-with-tools",
            [
                _user("What is in notes.txt?"),
                _bot("", read, reasoning="I should read the file."),
                _tool("buy milk", "call_1"),
                _bot("It says buy milk.", reasoning="The tool answered."),
            ],
            (READ_FILE,),
            t({"ends_with_assistant"}),
        ),
        (
            "reasoning-tools-then-query",
            [
                _user("What is in notes.txt?"),
                _bot("Checking.", read, reasoning="Read it first."),
                _tool("buy milk", "call_1"),
                _bot("Buy milk.", reasoning="Done."),
                _user("Thanks, anything else?"),
            ],
            (READ_FILE,),
            t(),
        ),
        (
            "reasoning-multi-step-no-reasoning-middle",
            [
                _user("Read a then b."),
                _bot("", _call(1, "read_file", {"path": "a"}), reasoning="Start with a."),
                _tool("A", "call_1"),
                _bot("", _call(2, "read_file", {"path": "b"})),
                _tool("B", "call_2"),
            ],
            (READ_FILE,),
            t(),
        ),
        (
            "reasoning-tool-response-as-user",
            [
                _user("Check the file."),
                _bot("Reading.", reasoning="Need the file."),
                _user("<tool_response>\nfile body\n</tool_response>"),
            ],
            None,
            t({"tool_response_text"}),
        ),
        (
            "raw-think-in-content",
            [_user("Hi"), _bot("<think>\nhidden\n</think>\n\nHello!"), _user("Again")],
            None,
            t({"raw_think", "parity_only"}),
        ),
        (
            "raw-think-last",
            [_user("Hi"), _bot("<think>\nhidden\n</think>\n\nHello!")],
            None,
            t({"raw_think", "parity_only", "ends_with_assistant"}),
        ),
    ]
    out = []
    for name, messages, tools, tags in specs:
        tags = tags | ({"reasoning"} if any(m.reasoning is not None for m in messages) else set())
        if tools:
            tags = tags | {"tools"} | ({"tool_calls"} if _has_calls(messages) else set())
        out.append(Case(id=name, messages=tuple(messages), tools=tools, tags=frozenset(tags)))
    return out


def corpus(*, exclude: Iterable[str] = (), require: Iterable[str] = ()) -> list[Case]:
    """The corpus: plain chats, each with no system message, a system message, a non-ASCII
    system message and an empty one; tool conversations with and without a system message;
    reasoning conversations. Cases carrying a tag in ``exclude`` are left out, and only cases
    carrying every tag in ``require`` are kept."""
    excluded, required = frozenset(exclude), frozenset(require)
    unknown = (excluded | required) - TAGS.keys()
    if unknown:
        raise ValueError(f"unknown corpus tags {sorted(unknown)}; known: {sorted(TAGS)}")
    cases: list[Case] = []
    for name, messages, tags in _chats():
        for key, system in _SYSTEMS.items():
            prefix = [] if system is None else [_sys(system)]
            extra = {"unicode"} if key == "sys-unicode" else set()
            extra |= {"empty"} if key == "sys-empty" else set()
            cases.append(
                Case(
                    id=f"{name}-{key}" if key else name,
                    messages=tuple(prefix + messages),
                    tags=tags | extra,
                )
            )
    cases += _tool_cases()
    cases += _reasoning_cases()
    return [c for c in cases if not (c.tags & excluded) and required <= c.tags]


# ---------------------------------------------------------------- Hugging Face format


hf_tools = tool_dicts
hf_messages = message_dicts


# ---------------------------------------------------------------- multi-turn sampling


class SmolLM2Reference:
    """Mixed into a :class:`~rllm_core.testing.suites.renderers.RendererConformance` subclass
    whose renderer uses SmolLM2's chat template: the corpus without what that template has no
    way to write (tools, reasoning), checked against the template's own render."""

    supports_tools: ClassVar[bool] = False

    @pytest.fixture
    def conversations(self) -> list[Conversation]:
        return conversations(
            corpus(exclude=("tools", "tool_calls", "reasoning", "raw_think", "parity_only"))
        )

    @pytest.fixture
    def reference_render(self, smollm2_tokenizer_dir: Any) -> ReferenceRender:
        return reference_render(smollm2_tokenizer_dir)


class Qwen25Reference:
    """Mixed into a :class:`~rllm_core.testing.suites.renderers.RendererConformance` subclass
    whose renderer uses Qwen2.5's chat template: the corpus without reasoning (the template
    has none), checked against the template's own render."""

    @pytest.fixture
    def conversations(self) -> list[Conversation]:
        return conversations(corpus(exclude=("reasoning", "raw_think", "parity_only")))

    @pytest.fixture
    def reference_render(self, qwen25_tokenizer_dir: Any) -> ReferenceRender:
        return reference_render(qwen25_tokenizer_dir)


@dataclass(frozen=True)
class SimulatedTurn:
    """One sampled assistant turn of :func:`simulate_rollout`.

    ``prompt`` is what the model was given (the first render, the bridged prompt, or after a
    refused bridge a fresh render), ``completion`` what it "sampled" (cut short when
    ``truncated``). ``following`` are the messages after it, ``bridged`` the next prompt from
    ``bridge_to_next_turn`` (``None`` when refused or when nothing follows), and ``full`` the
    full render of the conversation up to the next assistant turn with the generation prompt,
    the sampled message replaced by what ``parse_response`` read back.
    """

    index: int
    prompt: list[int]
    completion: list[int]
    truncated: bool
    following: list[Message]
    bridged: list[int] | None
    full: list[int] | None


def _as_message(
    renderer: Renderer,
    completion: Sequence[int],
    original: Message,
    tools: Sequence[ToolSpec] | None,
) -> Message:
    parsed = renderer.parse_response(completion, tools)
    calls = tuple(
        ToolCall(id=original_call.id, name=got.call.name, arguments=got.call.arguments)
        for got, original_call in zip(parsed.tool_calls, original.tool_calls, strict=False)
        if got.call is not None
    )
    return Message(
        role="assistant", content=parsed.content, reasoning=parsed.reasoning, tool_calls=calls
    )


def simulate_rollout(
    renderer: Renderer,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec] | None = None,
    *,
    truncate: Mapping[int, int] | None = None,
) -> list[SimulatedTurn]:
    """Replay ``messages`` as a rollout: every assistant message is sampled, the rest is input.

    At assistant message ``k`` the model "samples" the tokens the template gives that message
    when it is the last one (its sampled span). ``truncate[k] = n`` drops the last ``n`` of
    them, as a sampler stopped by ``max_tokens`` would. The history then holds what
    ``parse_response`` reads back, and the messages up to the next assistant message are
    bridged with ``bridge_to_next_turn``, whose prefix contract is asserted with
    :func:`~rllm_core.testing.suites.renderers.check_bridge_contract`. When the bridge refuses,
    the next prompt is a fresh render, as a gateway would do on a reset.
    """
    cuts = dict(truncate or {})
    prompt: list[int] | None = None
    turns: list[SimulatedTurn] = []
    assistant_at = [i for i, m in enumerate(messages) if m.role == "assistant"]
    history = list(messages[: assistant_at[0]]) if assistant_at else list(messages)
    for n, k in enumerate(assistant_at):
        if prompt is None:
            prompt = renderer.render(history, tools, add_generation_prompt=True).token_ids
        target = messages[k]
        rendered = renderer.render([*history, target], tools)
        completion = sampled_span(rendered, len(history))
        cut = cuts.get(k, 0)
        if cut:
            completion = completion[: max(len(completion) - cut, 0)]
        history.append(_as_message(renderer, completion, target, tools) if cut else target)
        end = assistant_at[n + 1] if n + 1 < len(assistant_at) else len(messages)
        following = list(messages[k + 1 : end])
        bridged = full = None
        if following:
            bridged = check_bridge_contract(renderer, prompt, completion, following, tools)
            history += following
            full = renderer.render(history, tools, add_generation_prompt=True).token_ids
        turns.append(
            SimulatedTurn(
                index=k,
                prompt=prompt,
                completion=completion,
                truncated=bool(cut),
                following=following,
                bridged=bridged,
                full=full,
            )
        )
        prompt = bridged if bridged is not None else full
    return turns
