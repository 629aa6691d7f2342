"""A ChatML-style renderer over a byte-level toy tokenizer, used to exercise the renderer suite.

Token ids 0-255 are raw UTF-8 bytes; the special tokens below sit above them. Every message is
``<|im_start|>{role}\\n{body}<|im_end|>\\n``. An assistant body is an optional
``<think>\\n{reasoning}\\n</think>\\n\\n`` block, the content, then one
``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` block per call (separated from
non-empty content by a newline). Offered tools go into the system message, or into a scaffold
system message when the conversation has none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from rllm_core.types import (
    Message,
    ParsedResponse,
    ParsedToolCall,
    RenderedTokens,
    ToolCall,
    ToolSpec,
)

SPECIAL_TOKENS = {
    "<|im_start|>": 256,
    "<|im_end|>": 257,
    "<|endoftext|>": 258,
    "<tool_call>": 259,
    "</tool_call>": 260,
    "<think>": 261,
    "</think>": 262,
}
IM_START, IM_END, END_OF_TEXT = 256, 257, 258
TOOL_CALL, TOOL_CALL_END, THINK, THINK_END = 259, 260, 261, 262

_SPECIAL_RE = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")
_SPECIAL_TEXT = {v: k for k, v in SPECIAL_TOKENS.items()}


class ToyTokenizer:
    """Bytes in, ids out; special token strings in the text become their single id."""

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _SPECIAL_RE.split(text):
            if piece in SPECIAL_TOKENS:
                ids.append(SPECIAL_TOKENS[piece])
            else:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        out: list[str] = []
        run = bytearray()
        for i in ids:
            if i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run.clear()
            out.append(_SPECIAL_TEXT[i])
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)


def tools_block(tools: Sequence[ToolSpec]) -> str:
    lines = [
        json.dumps(
            {"name": t.name, "description": t.description, "parameters": t.parameters},
            sort_keys=True,
            ensure_ascii=False,
        )
        for t in tools
    ]
    return "# Tools\n<tools>\n" + "\n".join(lines) + "\n</tools>"


def assistant_body(message: Message) -> str:
    body = ""
    if message.reasoning is not None:
        body += f"<think>\n{message.reasoning}\n</think>\n\n"
    body += message.content
    for n, call in enumerate(message.tool_calls):
        if n or message.content:
            body += "\n"
        name = json.dumps(call.name, ensure_ascii=False)
        body += f'<tool_call>\n{{"name": {name}, "arguments": {call.arguments}}}\n</tool_call>'
    return body


class ToyChatRenderer:
    """A correct renderer for the toy template: prefix stable, with a checked bridge."""

    def __init__(self) -> None:
        self.tokenizer = ToyTokenizer()

    # ---------------------------------------------------------------- render

    def _message_ids(self, message: Message, tools: Sequence[ToolSpec] | None, first: bool):
        """(header ids, body ids, footer ids) of one message."""
        enc = self.tokenizer.encode
        if message.role == "assistant":
            body = enc(assistant_body(message))
        elif message.role == "system" and first and tools:
            body = enc(message.content + "\n\n" + tools_block(tools))
        else:
            body = enc(message.content)
        return [IM_START, *enc(message.role + "\n")], body, [IM_END, *enc("\n")]

    def generation_prompt(self) -> list[int]:
        return [IM_START, *self.tokenizer.encode("assistant\n")]

    def _messages(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None,
        ids: list[int],
        indices: list[int],
        sampled: list[bool],
        *,
        offset: int,
        at_start: bool,
    ) -> None:
        for n, message in enumerate(messages):
            header, body, footer = self._message_ids(message, tools, at_start and n == 0)
            is_assistant = message.role == "assistant"
            ids += header + body + footer
            indices += [offset + n] * (len(header) + len(body) + len(footer))
            sampled += [False] * len(header)
            sampled += [is_assistant] * (len(body) + 1)
            sampled += [False] * (len(footer) - 1)

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        add_generation_prompt: bool = False,
    ) -> RenderedTokens:
        ids: list[int] = []
        indices: list[int] = []
        sampled: list[bool] = []
        if tools and (not messages or messages[0].role != "system"):
            scaffold = [IM_START, *self.tokenizer.encode(f"system\n{tools_block(tools)}")]
            scaffold += [IM_END, *self.tokenizer.encode("\n")]
            ids += scaffold
            indices += [-1] * len(scaffold)
            sampled += [False] * len(scaffold)
        self._messages(messages, tools, ids, indices, sampled, offset=0, at_start=True)
        if add_generation_prompt:
            gen = self.generation_prompt()
            ids += gen
            indices += [-1] * len(gen)
            sampled += [False] * len(gen)
        return RenderedTokens(token_ids=ids, message_indices=indices, sampled_mask=sampled)

    # ---------------------------------------------------------------- parse

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def stop_token_ids(self) -> list[int]:
        return [IM_END, END_OF_TEXT]

    def _parse_call(self, n: int, ids: Sequence[int], terminated: bool) -> ParsedToolCall:
        raw = self.tokenizer.decode(ids).strip()
        if not terminated:
            return ParsedToolCall(status="unterminated", raw=raw, error="no </tool_call>")
        try:
            payload = json.loads(raw)
        except ValueError as exc:
            return ParsedToolCall(status="invalid_json", raw=raw, error=str(exc))
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return ParsedToolCall(status="missing_name", raw=raw, error="no string 'name'")
        arguments = payload.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        call = ToolCall(id=f"call_{n}", name=payload["name"], arguments=arguments)
        return ParsedToolCall(status="ok", raw=raw, call=call)

    def parse_response(
        self, token_ids: Sequence[int], tools: Sequence[ToolSpec] | None = None
    ) -> ParsedResponse:
        # Its calls carry JSON arguments, typed by the text itself: the offered tools add nothing.
        ids = list(token_ids)
        stops = [i for i, t in enumerate(ids) if t in (IM_END, END_OF_TEXT)]
        stopped = bool(stops)
        if stopped:
            ids = ids[: stops[0]]
        reasoning = None
        if ids[:1] == [THINK]:
            end = ids.index(THINK_END) if THINK_END in ids else len(ids)
            reasoning = self.tokenizer.decode(ids[1:end]).removeprefix("\n").removesuffix("\n")
            ids = ids[end + 1 :]
            prefix = self.tokenizer.encode("\n\n")
            if ids[:2] == prefix:
                ids = ids[2:]
        first_call = ids.index(TOOL_CALL) if TOOL_CALL in ids else len(ids)
        content = self.tokenizer.decode(ids[:first_call])
        calls: list[ParsedToolCall] = []
        rest = ids[first_call:]
        if rest:
            content = content.removesuffix("\n")
        while rest:
            rest = rest[1:]
            end = rest.index(TOOL_CALL_END) if TOOL_CALL_END in rest else None
            calls.append(self._parse_call(len(calls), rest[:end], end is not None))
            if end is None:
                break
            rest = rest[end + 1 :]
            nxt = rest.index(TOOL_CALL) if TOOL_CALL in rest else len(rest)
            tail = self.tokenizer.decode(rest[:nxt])
            if tail.strip():
                content += "\n" + tail.strip()
            rest = rest[nxt:]
        return ParsedResponse(
            content=content, reasoning=reasoning, tool_calls=tuple(calls), stopped=stopped
        )

    # ---------------------------------------------------------------- bridge

    def bridge_to_next_turn(
        self,
        prev_prompt_ids: Sequence[int],
        prev_completion_ids: Sequence[int],
        new_messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
    ) -> list[int] | None:
        """Append the close token when missing, then the new messages and a generation prompt.

        Returns ``None`` when a new message is an assistant message, when the previous prompt
        did not end by opening an assistant turn, or when the completion stopped on
        ``<|endoftext|>`` without closing its turn (the template never renders that).
        """
        if any(m.role == "assistant" for m in new_messages):
            return None
        gen = self.generation_prompt()
        prompt, completion = list(prev_prompt_ids), list(prev_completion_ids)
        if prompt[-len(gen) :] != gen:
            return None
        delta: list[int] = []
        if IM_END not in completion:
            if END_OF_TEXT in completion:
                return None
            delta.append(IM_END)
        delta += self.tokenizer.encode("\n")
        indices: list[int] = []
        sampled: list[bool] = []
        self._messages(new_messages, tools, delta, indices, sampled, offset=0, at_start=False)
        return prompt + completion + delta + gen


def reference_chat_template(
    messages: Sequence[Message], tools: Sequence[ToolSpec] | None, add_generation_prompt: bool
) -> list[int]:
    """The toy template written as text, then tokenized: what ``apply_chat_template`` does."""
    text = ""
    if tools and (not messages or messages[0].role != "system"):
        text += f"<|im_start|>system\n{tools_block(tools)}<|im_end|>\n"
    for n, m in enumerate(messages):
        if m.role == "assistant":
            body = assistant_body(m)
        elif m.role == "system" and n == 0 and tools:
            body = m.content + "\n\n" + tools_block(tools)
        else:
            body = m.content
        text += f"<|im_start|>{m.role}\n{body}<|im_end|>\n"
    if add_generation_prompt:
        text += "<|im_start|>assistant\n"
    return ToyTokenizer().encode(text)
