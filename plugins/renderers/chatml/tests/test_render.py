"""Rendering details checked token by token: attribution, scaffold, defaults and refusals."""

from __future__ import annotations

import shutil

import pytest
from rllm_core.types import Message, ToolCall, ToolSpec
from rllm_renderer_chatml.plugin import ChatMLConfig
from rllm_renderer_chatml.renderer import ChatMLRenderer
from rllm_renderer_chatml.templates import Qwen25Template, SmolLM2Template


def _m(role: str, content: str = "", **kw) -> Message:
    return Message(role=role, content=content, **kw)


@pytest.fixture(scope="module")
def qwen(qwen25_tokenizer_dir) -> ChatMLRenderer:
    return ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(qwen25_tokenizer_dir)))


@pytest.fixture(scope="module")
def smol(smollm2_tokenizer_dir) -> ChatMLRenderer:
    return ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(smollm2_tokenizer_dir)))


def test_qwen25_attribution_by_hand(qwen):
    r = qwen.render([_m("system", "Be brief."), _m("user", "Hi"), _m("assistant", "Hello!")])
    # <|im_start|> system \n Be ' brief' . <|im_end|> \n
    system = [151644, 8948, 198, 3430, 9814, 13, 151645, 198]
    user = [151644, 872, 198, 13048, 151645, 198]
    # <|im_start|> assistant \n | Hello ! <|im_end|> | \n
    assistant = [151644, 77091, 198, 9707, 0, 151645, 198]
    assert r.token_ids == system + user + assistant
    assert r.message_indices == [0] * 8 + [1] * 6 + [2] * 7
    assert r.sampled_mask == [False] * 17 + [True, True, True, False]


def test_smollm2_default_system_is_scaffold(smol):
    r = smol.render([_m("user", "Hi"), _m("assistant", "Hello!")], add_generation_prompt=True)
    default = "<|im_start|>system\n" + SmolLM2Template.DEFAULT_SYSTEM + "<|im_end|>\n"
    n = len(smol.encode(default))
    assert smol.decode(r.token_ids[:n]) == default
    assert r.message_indices[:n] == [-1] * n
    # <|im_start|> user \n Hi <|im_end|> \n, then <|im_start|> ass istant \n Hello ! <|im_end|> \n
    assert r.token_ids[n:] == [
        1,
        4093,
        198,
        26843,
        2,
        198,
        1,
        520,
        9531,
        198,
        19556,
        17,
        2,
        198,
        1,
        520,
        9531,
        198,
    ]
    assert r.message_indices[n:] == [0] * 6 + [1] * 8 + [-1] * 4
    assert r.sampled_mask[n:] == [False] * 10 + [True, True, True] + [False] * 5


def test_token_straddling_two_messages_goes_to_the_first(qwen):
    # Without added <tool_response> tokens (Qwen2.5), '>' and the newline that opens the next
    # tool block merge into one token, '>\n' (397).
    r = qwen.render([_m("tool", "A", tool_call_id="1"), _m("tool", "B", tool_call_id="2")])
    text = (
        "<|im_start|>user\n<tool_response>\nA\n</tool_response>"
        "\n<tool_response>\nB\n</tool_response><|im_end|>\n"
    )
    default = f"<|im_start|>system\n{Qwen25Template.DEFAULT_SYSTEM}<|im_end|>\n"
    assert r.token_ids == qwen.encode(default + text)
    n = len(qwen.encode(default))
    first = qwen.encode("<|im_start|>user\n<tool_response>\nA\n</tool_response>\n")
    assert first[-1] == 397
    assert r.message_indices == [-1] * n + [0] * len(first) + [1] * (
        len(r.token_ids) - n - len(first)
    )
    assert not any(r.sampled_mask)


def test_default_system_override(qwen25_tokenizer_dir, smollm2_tokenizer_dir):
    for folder in (qwen25_tokenizer_dir, smollm2_tokenizer_dir):
        config = ChatMLConfig(tokenizer=str(folder), default_system="Answer in French.")
        r = ChatMLRenderer.from_config(config)
        got = r.decode(r.render([_m("user", "Hi")]).token_ids)
        assert (
            got
            == "<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        )


def test_qwen25_tools_go_into_the_system_message(qwen):
    tool = ToolSpec(name="ping", description="Ping.", parameters={"type": "object"})
    text = qwen.decode(qwen.render([_m("system", "S"), _m("user", "go")], [tool]).token_ids)
    spec = (
        '{"type": "function", "function": {"name": "ping", "description": "Ping.",'
        ' "parameters": {"type": "object"}}}'
    )
    assert text.startswith("<|im_start|>system\nS\n\n# Tools\n\nYou may call one or more functions")
    assert f"<tools>\n{spec}\n</tools>" in text
    assert text.endswith("</tool_call><|im_end|>\n<|im_start|>user\ngo<|im_end|>\n")


def test_qwen25_tool_call_arguments_are_reserialized(qwen):
    call = ToolCall(id="c", name="f", arguments='{"b":1,"a":"é"}')
    r = qwen.render([_m("user", "go"), _m("assistant", "", tool_calls=(call,))])
    body = qwen.decode([t for t, s in zip(r.token_ids, r.sampled_mask, strict=True) if s])
    assert (
        body
        == '<tool_call>\n{"name": "f", "arguments": {"b": 1, "a": "é"}}\n</tool_call><|im_end|>'
    )


def test_qwen25_writes_non_json_arguments_as_they_are(qwen):
    call = ToolCall(id="c", name="f", arguments='{"path": "x"')
    r = qwen.render([_m("user", "go"), _m("assistant", "On it.", tool_calls=(call,))])
    span = [t for t, s in zip(r.token_ids, r.sampled_mask, strict=True) if s]
    assert (
        qwen.decode(span)
        == 'On it.\n<tool_call>\n{"name": "f", "arguments": {"path": "x"}\n</tool_call><|im_end|>'
    )
    (attempt,) = qwen.parse_response(span).tool_calls
    assert attempt.status == "invalid_json"


def test_smollm2_refuses_tools(smol):
    with pytest.raises(
        ValueError, match="smollm2 template has no tool format and cannot render 1 offered tools"
    ):
        smol.render([_m("user", "hi")], [ToolSpec(name="f")])
    call = ToolCall(id="c", name="f", arguments="{}")
    with pytest.raises(ValueError, match=r"cannot render 1 tool calls; use template='qwen2\.5'"):
        smol.render([_m("user", "hi"), _m("assistant", "", tool_calls=(call,))])


def test_smollm2_renders_any_role_as_a_plain_turn(smol):
    r = smol.render([_m("system", "S"), _m("tool", "out", tool_call_id="1")])
    assert (
        smol.decode(r.token_ids)
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>tool\nout<|im_end|>\n"
    )


def test_bad_inputs(qwen):
    with pytest.raises(ValueError, match="at least one message"):
        qwen.render([])
    with pytest.raises(ValueError, match="message 1 has role 'developer'"):
        qwen.render([_m("user", "a"), Message(role="developer", content="b")])  # type: ignore[arg-type]


def test_auto_detects_the_template(qwen25_tokenizer_dir, smollm2_tokenizer_dir):
    auto = ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(qwen25_tokenizer_dir)))
    assert isinstance(auto.template, Qwen25Template)
    auto = ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(smollm2_tokenizer_dir)))
    assert isinstance(auto.template, SmolLM2Template)
    forced = ChatMLRenderer.from_config(
        ChatMLConfig(tokenizer=str(smollm2_tokenizer_dir), template="qwen2.5")
    )
    assert isinstance(forced.template, Qwen25Template)


def test_auto_refuses_templates_it_does_not_know(qwen25_tokenizer_dir, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(qwen25_tokenizer_dir / "tokenizer.json", bare / "tokenizer.json")
    with pytest.raises(ValueError, match="the folder has no chat template"):
        ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(bare)))
    (bare / "chat_template.jinja").write_text("{{ '<think>' }}")
    with pytest.raises(ValueError, match="use the qwen3 renderer"):
        ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(bare)))
    explicit = ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(bare), template="smollm2"))
    assert explicit.decode(explicit.encode("ok")) == "ok"


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"has no tokenizer\.json"):
        ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(tmp_path)))


def test_stop_tokens_and_parse(qwen, smol):
    assert qwen.stop_token_ids() == [151645, 151643]
    assert smol.stop_token_ids() == [2, 0]
    ids = [*qwen.encode("Done."), 151645, *qwen.encode("junk")]
    parsed = qwen.parse_response(ids)
    assert (parsed.content, parsed.stopped, parsed.reasoning) == ("Done.", True, None)
    assert qwen.parse_response(qwen.encode("Do")).stopped is False
    eot = qwen.parse_response([*qwen.encode("Done."), 151643])
    assert (eot.content, eot.stopped) == ("Done.", True)
