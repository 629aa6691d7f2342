"""The ChatML chat templates this package renders, written as Python over text pieces.

Every template renders a message as ``<|im_start|>{role}\\n{body}<|im_end|>\\n``; they differ
in the default system message, in how tools and tool results are written, and in what an
assistant body holds. Each class mirrors its model's Jinja template exactly (the parity tests
compare them token for token) and adds what the Jinja cannot say: which text is scaffold,
which message each piece belongs to, and which text the model sampled (an assistant body and
its ``<|im_end|>``).

- :class:`SmolLM2Template`: SmolLM2-Instruct. A default system message when the first message
  is not a system message; every message, whatever its role, as a plain ChatML turn. It has no
  tool format, so offering tools or rendering tool calls is an error rather than a silent drop.
- :class:`Qwen25Template`: Qwen2.5-Instruct. A default system message; offered tools go into
  the system message as a ``# Tools`` block; an assistant's calls follow its content as
  ``<tool_call>`` JSON blocks, their arguments re-serialized (``json.dumps`` with
  ``ensure_ascii=False``, which is what the template's ``tojson`` does; arguments that are not
  JSON are written as they are, see :func:`_arguments_as_tojson`); consecutive tool results
  share one user turn as ``<tool_response>`` blocks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

from rllm_core.kit.toolformats.hermes import HERMES, format_tool_call
from rllm_core.types import Message, ParsedToolCall, ToolSpec

from rllm_renderer_chatml.tokenizer import Piece

__all__ = [
    "GENERATION_PROMPT",
    "TEMPLATES",
    "ChatTemplate",
    "Qwen25Template",
    "SmolLM2Template",
    "assistant_turn",
    "check_roles",
    "detect_template",
    "plain_turn",
    "tool_result",
    "tool_spec_json",
    "tools_system_block",
]

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
GENERATION_PROMPT = f"{IM_START}assistant\n"

_ROLES = frozenset({"system", "user", "assistant", "tool"})


def plain_turn(index: int, role: str, content: str) -> list[Piece]:
    """A ChatML turn; its content is a literal piece."""
    return [
        Piece(f"{IM_START}{role}\n", index),
        Piece(content, index, False, True),
        Piece(f"{IM_END}\n", index),
    ]


def assistant_turn(index: int, body: str, *, scaffold: str = "") -> list[Piece]:
    """An assistant turn: header, ``scaffold`` (text after the header that the model did not
    sample), the sampled body (a literal piece: its markup, ``<think>`` or ``<tool_call>``, is
    made of added tokens that are not special) and its closing token, then the newline after
    the close."""
    return [
        Piece(GENERATION_PROMPT + scaffold, index),
        Piece(body, index, True, True),
        Piece(IM_END, index, True),
        Piece("\n", index),
    ]


def tool_result(messages: Sequence[Message], index: int) -> list[Piece]:
    """A tool message as a ``<tool_response>`` block; a run of tool messages shares one user
    turn, opened by the first and closed by the last. The result is a literal piece."""
    opens = index == 0 or messages[index - 1].role != "tool"
    closes = index == len(messages) - 1 or messages[index + 1].role != "tool"
    head = f"{IM_START}user" if opens else ""
    tail = "\n</tool_response>" + (f"{IM_END}\n" if closes else "")
    return [
        Piece(head + "\n<tool_response>\n", index),
        Piece(messages[index].content, index, False, True),
        Piece(tail, index),
    ]


def tool_spec_json(tool: ToolSpec) -> str:
    """A tool in the OpenAI function-tool shape, serialized as the templates' ``tojson``."""
    spec = {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }
    return json.dumps(spec, ensure_ascii=False)


def tools_system_block(tools: Sequence[ToolSpec]) -> str:
    """The ``# Tools`` text Qwen templates put into the system message."""
    listed = "".join("\n" + tool_spec_json(t) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        + listed
        + "\n</tools>\n\nFor each function call, return a json object with function name and"
        " arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def check_roles(messages: Sequence[Message]) -> None:
    """Raise ``ValueError`` for an empty conversation or a message of a role no ChatML
    template renders."""
    if not messages:
        raise ValueError("render needs at least one message; got an empty list")
    for n, m in enumerate(messages):
        if m.role not in _ROLES:
            raise ValueError(
                f"message {n} has role {m.role!r}; use one of system, user, assistant, tool"
            )


class ChatTemplate:
    """What a renderer needs from a template.

    ``pieces`` renders a whole conversation; ``continuation`` renders, as pieces, what follows
    a closed assistant turn when ``new_messages`` (never assistant messages) are added: the
    newline after ``<|im_end|>``, the new turns and the generation prompt (by default from
    ``_turns``, which a template then defines). ``parse`` reads the text of an assistant body
    back into content, reasoning and tool-call attempts.
    """

    name: ClassVar[str]
    default_system: str
    supports_tools: ClassVar[bool] = False

    def generation_prompt(self) -> str:
        return GENERATION_PROMPT

    def pieces(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None, generation: bool
    ) -> list[Piece]:
        raise NotImplementedError

    def continuation(
        self, new_messages: Sequence[Message], tools: Sequence[ToolSpec] | None
    ) -> list[Piece]:
        after = [Message(role="assistant"), *new_messages]
        return [Piece("\n", -1), *self._turns(after, 1), Piece(self.generation_prompt(), -1)]

    def parse(self, text: str) -> tuple[str, str | None, list[ParsedToolCall]]:
        raise NotImplementedError

    def _turns(self, messages: Sequence[Message], start: int) -> list[Piece]:
        """The turns of ``messages[start:]``, each message's pieces owned by its index."""
        raise NotImplementedError


class SmolLM2Template(ChatTemplate):
    name = "smollm2"
    DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

    def __init__(self, default_system: str | None = None) -> None:
        self.default_system = self.DEFAULT_SYSTEM if default_system is None else default_system

    def _refuse_tools(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None) -> None:
        calls = sum(len(m.tool_calls) for m in messages)
        if tools or calls:
            what = f"{len(tools)} offered tools" if tools else f"{calls} tool calls"
            raise ValueError(
                f"the smollm2 template has no tool format and cannot render {what}; use"
                " template='qwen2.5', or the hf renderer with a tokenizer whose chat template"
                " handles tools"
            )

    def _turn(self, index: int, m: Message) -> list[Piece]:
        if m.role == "assistant":
            return assistant_turn(index, m.content)
        return plain_turn(index, m.role, m.content)

    def pieces(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None, generation: bool
    ) -> list[Piece]:
        check_roles(messages)
        self._refuse_tools(messages, tools)
        out: list[Piece] = []
        if messages[0].role != "system":
            out += plain_turn(-1, "system", self.default_system)
        for n, m in enumerate(messages):
            out += self._turn(n, m)
        if generation:
            out.append(Piece(GENERATION_PROMPT, -1))
        return out

    def continuation(
        self, new_messages: Sequence[Message], tools: Sequence[ToolSpec] | None
    ) -> list[Piece]:
        self._refuse_tools(new_messages, None)
        turns = [p for n, m in enumerate(new_messages) for p in self._turn(n, m)]
        return [Piece("\n", -1), *turns, Piece(GENERATION_PROMPT, -1)]

    def parse(self, text: str) -> tuple[str, str | None, list[ParsedToolCall]]:
        return text, None, []


def _arguments_as_tojson(arguments: str) -> str:
    """What ``tool_call.arguments | tojson`` prints for arguments given the Hugging Face way
    (decoded from their JSON text). Text that is not JSON is written as it is: the template
    would print it as a quoted JSON string, which would turn a malformed call the model wrote
    into a well-formed call with string arguments."""
    try:
        value: Any = json.loads(arguments)
    except ValueError:
        return arguments
    return json.dumps(value, ensure_ascii=False)


class Qwen25Template(ChatTemplate):
    name = "qwen2.5"
    supports_tools = True
    DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

    def __init__(self, default_system: str | None = None) -> None:
        self.default_system = self.DEFAULT_SYSTEM if default_system is None else default_system

    @staticmethod
    def assistant_body(m: Message) -> str:
        calls = "\n".join(
            format_tool_call(c.name, _arguments_as_tojson(c.arguments)) for c in m.tool_calls
        )
        if not calls:
            return m.content
        return f"{m.content}\n{calls}" if m.content else calls

    def _turns(self, messages: Sequence[Message], start: int) -> list[Piece]:
        out: list[Piece] = []
        for n in range(start, len(messages)):
            m = messages[n]
            if m.role == "assistant":
                out += assistant_turn(n, self.assistant_body(m))
            elif m.role == "tool":
                out += tool_result(messages, n)
            else:
                out += plain_turn(n, m.role, m.content)
        return out

    def pieces(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None, generation: bool
    ) -> list[Piece]:
        check_roles(messages)
        has_system = messages[0].role == "system"
        system = messages[0].content if has_system else self.default_system
        owner = 0 if has_system else -1
        if tools:
            system = f"{system}\n\n{tools_system_block(tools)}"
        out = plain_turn(owner, "system", system)
        out += self._turns(messages, 1 if has_system else 0)
        if generation:
            out.append(Piece(GENERATION_PROMPT, -1))
        return out

    def parse(self, text: str) -> tuple[str, str | None, list[ParsedToolCall]]:
        return HERMES.split(text)


TEMPLATES: dict[str, type[ChatTemplate]] = {
    SmolLM2Template.name: SmolLM2Template,
    Qwen25Template.name: Qwen25Template,
}


def detect_template(chat_template: str | None, where: str) -> str:
    """The name of the template a tokenizer's Jinja chat template is, recognised by the
    default system message it writes; raises when it is none of :data:`TEMPLATES`."""
    if chat_template and SmolLM2Template.DEFAULT_SYSTEM in chat_template:
        return SmolLM2Template.name
    if chat_template and Qwen25Template.DEFAULT_SYSTEM in chat_template:
        return Qwen25Template.name
    if chat_template and "<think>" in chat_template:
        hint = "it looks like Qwen3's: use the qwen3 renderer"
    elif chat_template:
        hint = "use the hf renderer, which runs any chat template"
    else:
        hint = "the folder has no chat template"
    raise ValueError(
        f"template='auto' cannot tell which ChatML template the tokenizer in {where!r} uses"
        f" ({hint}); set template to one of {sorted(TEMPLATES)} explicitly"
    )
