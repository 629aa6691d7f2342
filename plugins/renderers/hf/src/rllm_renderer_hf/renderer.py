"""The ``hf`` renderer: a tokenizer's own chat template, run by transformers."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from rllm_core.chat_dicts import message_dicts, tool_dicts
from rllm_core.kit import toolformats
from rllm_core.kit.completions import (
    THINK_OPEN,
    assistant_message,
    parse_completion,
    split_at_stop,
)
from rllm_core.kit.toolformats.hermes import Hermes
from rllm_core.models import resolve_tokenizer
from rllm_core.ports.rendering import ToolCallStream
from rllm_core.types import Message, ParsedResponse, RenderedTokens, ToolSpec

if TYPE_CHECKING:
    from rllm_renderer_hf.plugin import HFConfig

__all__ = ["HFRenderer"]

# Turn-close tokens of common chat formats, used as stop tokens when the tokenizer has them.
_CLOSE_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>")


def _restore(text: str, sentinels: dict[str, str], base: int) -> tuple[str, list[int]]:
    """``text`` with each stand-in character replaced by its spelling, and for every position
    of the result (and its end) the position in the original ``text`` plus ``base``."""
    out: list[str] = []
    back: list[int] = []
    for n, char in enumerate(text):
        spelled = sentinels.get(char, char)
        out.append(spelled)
        back += [base + n] * len(spelled)
    back.append(base + len(text))
    return "".join(out), back


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (slice comparisons run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@functools.lru_cache(maxsize=8)
def _load_tokenizer(folder: str, stamp: tuple[tuple[str, int], ...]) -> Any:
    """A tokenizer loaded once per folder and state of its files (``stamp``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


@functools.lru_cache(maxsize=8)
def _load_literal_tokenizer(folder: str, stamp: tuple[tuple[str, int], ...]) -> Any:
    """A copy of the folder's fast tokenizer that reads special-token text as text (a copy:
    the flag belongs to the tokenizer object, which the renderer's tokenizer shares)."""
    from tokenizers import Tokenizer

    backend = _load_tokenizer(folder, stamp).backend_tokenizer
    literal = Tokenizer.from_str(backend.to_str())
    literal.encode_special_tokens = True
    return literal


def _stamp(folder: str) -> tuple[tuple[str, int], ...]:
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(
            f"tokenizer folder {folder!r} does not exist; point `tokenizer` at a local Hugging"
            " Face tokenizer folder"
        )
    return tuple(sorted((p.name, p.stat().st_mtime_ns) for p in root.iterdir() if p.is_file()))


_SENTINELS = 0xF0000
"""The first code point (Supplementary Private Use Area-A) that stands in for a control-token
spelling while a template runs: one character, so no template filter can cut it."""


def _replace_text(message: Message, replace: Any) -> Message:
    """``message`` with ``replace`` applied to its content, reasoning and tool-call arguments
    and names."""
    calls = tuple(
        msgspec.structs.replace(c, name=replace(c.name), arguments=replace(c.arguments))
        for c in message.tool_calls
    )
    reasoning = None if message.reasoning is None else replace(message.reasoning)
    return msgspec.structs.replace(
        message, content=replace(message.content), reasoning=reasoning, tool_calls=calls
    )


def _text_fields(message: Message) -> list[str]:
    fields = [message.content, message.reasoning or ""]
    return fields + [t for c in message.tool_calls for t in (c.name, c.arguments)]


def _digest(ids: Sequence[int]) -> bytes:
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=16).digest()


def _template_format(template: object, tokenizer: str) -> str:
    """The tool-call format a chat template writes: the one whose markers it holds; ``hermes``
    for a template that renders no tool calls (an agent told its tools in a system prompt is
    read as writing ``<tool_call>`` blocks). A template that renders tool calls some other way
    is refused: read with the wrong format, every call would be lost as text."""
    text = template if isinstance(template, str) else ""
    found = toolformats.detect(text)
    if found is not None:
        return found
    if "tool_calls" in text:
        raise ValueError(
            f"the chat template of {tokenizer!r} renders tool calls in a format rllm-core does"
            " not recognize; set [renderer] tool_call_format to the model's format, one of:"
            f" {', '.join(toolformats.names())}"
        )
    return "hermes"


class HFRenderer:
    """Renders with ``apply_chat_template`` and attributes tokens by rendering incrementally.

    ``render`` tokenizes the template's text exactly as ``apply_chat_template(...,
    tokenize=True)`` does. Message ``i`` owns the text up to where the render of the first
    ``i + 1`` messages stops agreeing with the whole render, so text a template writes before
    the first message (a default system message) belongs to message 0, and the generation
    prompt is scaffold (``-1``). An assistant message's sampled tokens are those after the
    part of its turn that matches the generation prompt, up to and including the first stop
    token. For a template that rewrites earlier turns (Qwen3 dropping past reasoning) the
    attribution of a rewritten turn is best effort: its text after the first difference goes
    to the next message.

    ``parse_response`` reads the text before the first stop token: a leading
    ``<think>...</think>`` block becomes the reasoning, ``<tool_call>`` JSON blocks become tool
    calls (the Hermes format Qwen and many ChatML models use), the rest is the content.

    ``bridge_to_next_turn`` cannot see the conversation behind a prompt, so the renderer
    remembers the conversation of the last ``history_size`` prompts it returned (from
    ``render`` with the generation prompt, or from a bridge). It rebuilds the conversation
    with the parsed completion and the new messages, renders it in full, and returns
    ``prompt + completion + the rest of that render`` only when the render starts with
    ``prompt`` plus the completion up to its stop token (plus one stop token when the
    completion was cut short). Otherwise, or for a prompt it does not remember, it returns
    ``None``.
    """

    def __init__(self, config: HFConfig) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.config = config
        folder = str(resolve_tokenizer(config.tokenizer).resolve())
        self.tokenizer = _load_tokenizer(folder, _stamp(folder))
        self._template = config.chat_template
        if not (self._template or getattr(self.tokenizer, "chat_template", None)):
            raise ValueError(
                f"the tokenizer in {config.tokenizer!r} has no chat template; give one with the"
                " chat_template key, or use a tokenizer folder that has one"
            )
        self._stops = self._stop_ids(config.stop_tokens)
        template_text = self._template or self.tokenizer.chat_template
        self.tool_call_format = toolformats.get(
            config.tool_call_format or _template_format(template_text, config.tokenizer)
        )
        self._history: OrderedDict[bytes, tuple[tuple[Message, ...], tuple[ToolSpec, ...]]]
        self._history = OrderedDict()
        self._lock = threading.Lock()
        self._generation_text = self._probe_generation_prompt()
        if isinstance(self.tool_call_format, Hermes) and self._generation_text.rstrip(
            "\n"
        ).endswith(THINK_OPEN):
            self.tool_call_format = dataclasses.replace(self.tool_call_format, opened_think=True)
        self._control: re.Pattern[str] | None = None
        if config.literal_control_tokens:
            self._setup_literal()

    @classmethod
    def from_config(cls, config: HFConfig) -> HFRenderer:
        return cls(config)

    def _stop_ids(self, extra: Sequence[str]) -> list[int]:
        added = self.tokenizer.get_added_vocab()
        ids: list[int] = []
        eos = self.tokenizer.eos_token_id
        if isinstance(eos, int):
            ids.append(eos)
        ids += [added[t] for t in _CLOSE_TOKENS if t in added]
        for token in extra:
            if token not in added and self.tokenizer.convert_tokens_to_ids(token) in (
                None,
                self.tokenizer.unk_token_id,
            ):
                raise ValueError(
                    f"stop token {token!r} is not in the vocabulary of {self.config.tokenizer!r};"
                    " list tokens exactly as the tokenizer spells them"
                )
            ids.append(added.get(token, self.tokenizer.convert_tokens_to_ids(token)))
        return list(dict.fromkeys(ids))

    def _setup_literal(self) -> None:
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(
                f"literal_control_tokens needs a fast tokenizer (a tokenizer.json) in"
                f" {self.config.tokenizer!r}; use a folder that has one or set"
                " literal_control_tokens = false"
            )
        decoder = self.tokenizer.added_tokens_decoder
        controls = sorted(
            {t.content for t in decoder.values() if t.special and t.content},
            key=lambda t: (-len(t), t),
        )
        self._control_ids = frozenset(i for i, t in decoder.items() if t.special and t.content)
        self._control = re.compile("|".join(map(re.escape, controls))) if controls else None
        folder = str(resolve_tokenizer(self.config.tokenizer).resolve())
        self._literal_tokenizer = _load_literal_tokenizer(folder, _stamp(folder))

    def _probe_generation_prompt(self) -> str:
        probe = [Message(role="user", content="x")]
        try:
            plain, opened = self._text(probe, None, False), self._text(probe, None, True)
        except Exception:  # a template that cannot render a lone user message
            return ""
        return opened[len(plain) :] if opened.startswith(plain) else ""

    # ---------------------------------------------------------------- render

    def _text(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None, generation: bool
    ) -> str:
        return self.tokenizer.apply_chat_template(
            message_dicts(messages, arguments=self.config.tool_arguments),
            tools=tool_dicts(tools),
            add_generation_prompt=generation,
            tokenize=False,
            chat_template=self._template,
            **self.config.template_kwargs,
        )

    def _mask(
        self, messages: list[Message], tools: Sequence[ToolSpec] | None
    ) -> tuple[list[Message], dict[str, str]]:
        """With literal control tokens, ``messages`` with every control-token spelling in
        their text replaced by a private-use character, and those characters' spellings;
        ``(messages, {})`` when the option is off or no text spells one."""
        control = self._control
        if control is None or not any(control.search(f) for m in messages for f in _text_fields(m)):
            return messages, {}
        used = "".join(f for m in messages for f in _text_fields(m))
        used += "".join(t.name + t.description + repr(t.parameters) for t in tools or ())
        chars: dict[str, str] = {}
        code = _SENTINELS

        def sentinel(match: re.Match[str]) -> str:
            nonlocal code
            spelled = match.group()
            if spelled not in chars:
                while chr(code) in used:
                    code += 1
                chars[spelled] = chr(code)
                code += 1
            return chars[spelled]

        masked = [_replace_text(m, lambda t: control.sub(sentinel, t)) for m in messages]
        return masked, {c: spelled for spelled, c in chars.items()}

    def _tokens(
        self, text: str, sentinels: dict[str, str] | None = None
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """The ids of ``text`` and their offsets in it. With ``sentinels`` (see
        :meth:`_mask`), ``text`` holds stand-ins for control-token spellings: the control
        tokens found in it are the template's own, and each stretch between two of them that
        holds a stand-in is encoded, spellings restored, with special tokens read as text
        (offsets of its tokens point back into ``text``)."""
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(encoding["input_ids"])
        offsets = [tuple(o) for o in encoding["offset_mapping"]]
        if not sentinels:
            return ids, offsets
        pattern = re.compile("|".join(map(re.escape, sentinels)))
        out_ids: list[int] = []
        out_offsets: list[tuple[int, int]] = []
        first = 0
        bounds = [n for n, t in enumerate(ids) if t in self._control_ids] + [len(ids)]
        for bound in bounds:
            start = offsets[first - 1][1] if first else 0
            end = offsets[bound][0] if bound < len(ids) else len(text)
            if start < end and pattern.search(text, start, end):
                restored, back = _restore(text[start:end], sentinels, start)
                piece = self._literal_tokenizer.encode(restored, add_special_tokens=False)
                out_ids += piece.ids
                out_offsets += [(back[a], back[b]) for a, b in piece.offsets]
            else:
                out_ids += ids[first:bound]
                out_offsets += offsets[first:bound]
            if bound < len(ids):
                out_ids.append(ids[bound])
                out_offsets.append(offsets[bound])
            first = bound + 1
        return out_ids, out_offsets

    def _encode(
        self, messages: list[Message], tools: Sequence[ToolSpec] | None, generation: bool
    ) -> list[int]:
        masked, sentinels = self._mask(messages, tools)
        return self._tokens(self._text(masked, tools, generation), sentinels)[0]

    def _remember(
        self, ids: list[int], messages: Sequence[Message], tools: Sequence[ToolSpec] | None
    ) -> None:
        key = _digest(ids)
        with self._lock:
            self._history[key] = (tuple(messages), tuple(tools or ()))
            self._history.move_to_end(key)
            while len(self._history) > self.config.history_size:
                self._history.popitem(last=False)

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        add_generation_prompt: bool = False,
    ) -> RenderedTokens:
        messages = list(messages)
        if not messages:
            raise ValueError("render needs at least one message; got an empty list")
        original = messages
        messages, sentinels = self._mask(messages, tools)
        text = self._text(messages, tools, add_generation_prompt)
        ends = []
        for n in range(len(messages)):
            last = n == len(messages) - 1
            upto = (
                text
                if last and not add_generation_prompt
                else self._text(messages[: n + 1], tools, False)
            )
            ends.append(max(_common_prefix(upto, text), ends[-1] if ends else 0))
        ids, offsets = self._tokens(text, sentinels)
        indices: list[int] = []
        message = 0
        for start, _ in offsets:
            while message < len(ends) and start >= ends[message]:
                message += 1
            indices.append(message if message < len(ends) else -1)
        sampled = [False] * len(ids)
        for n, m in enumerate(messages):
            if m.role == "assistant":
                self._mark_sampled(text, ids, offsets, indices, sampled, n, ends)
        if add_generation_prompt:
            self._remember(ids, original, tools)
        return RenderedTokens(token_ids=ids, message_indices=indices, sampled_mask=sampled)

    def _mark_sampled(
        self,
        text: str,
        ids: list[int],
        offsets: list[tuple[int, int]],
        indices: list[int],
        sampled: list[bool],
        n: int,
        ends: list[int],
    ) -> None:
        begin = ends[n - 1] if n else 0
        head = _common_prefix(
            self._generation_text, text[begin : begin + len(self._generation_text)]
        )
        if not head:
            return
        body = begin + head
        for pos, (start, _) in enumerate(offsets):
            if indices[pos] != n or start < body:
                continue
            sampled[pos] = True
            if ids[pos] in self._stops:
                return

    # ---------------------------------------------------------------- tokens and text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(
            list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def stop_token_ids(self) -> list[int]:
        return list(self._stops)

    def parse_response(
        self, token_ids: Sequence[int], tools: Sequence[ToolSpec] | None = None
    ) -> ParsedResponse:
        split = functools.partial(self.tool_call_format.split, tools=tools or ())
        return parse_completion(token_ids, self._stops, self.decode, split)

    def tool_call_stream(self, tools: Sequence[ToolSpec] | None = None) -> ToolCallStream:
        return self.tool_call_format.stream(tools=tools or ())

    # ---------------------------------------------------------------- bridge

    def bridge_to_next_turn(
        self,
        prev_prompt_ids: Sequence[int],
        prev_completion_ids: Sequence[int],
        new_messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
    ) -> list[int] | None:
        if any(m.role == "assistant" for m in new_messages):
            return None
        prompt, completion = list(prev_prompt_ids), list(prev_completion_ids)
        with self._lock:
            known = self._history.get(_digest(prompt))
        if known is None or known[1] != tuple(tools or ()):
            return None
        said = assistant_message(self.parse_response(completion, tools))
        if said is None:
            return None
        conversation = [*known[0], said, *new_messages]
        full = self._encode(conversation, tools, True)
        _, stop = split_at_stop(completion, self._stops)
        kept = prompt + (completion if stop is None else completion[: stop + 1])
        if full[: len(kept)] != kept:
            return None
        if stop is None and (len(full) <= len(kept) or full[len(kept)] not in self._stops):
            return None
        bridged = prompt + completion + full[len(kept) :]
        self._remember(bridged, conversation, tools)
        return bridged
