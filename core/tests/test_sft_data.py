"""SFT data: chat JSONL, ``datasets`` files (parquet, arrow, jsonl, a folder), their errors, and
the supervised datums the renderer's sampled mask makes of them."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
from reference.toy_renderer import ToyChatRenderer
from rllm_core.sft.data import DataError, TokenExample, chat_example, load_examples
from rllm_core.sft.tokens import supervised_datum, tokenize
from rllm_core.types import Message

FIELDS = {"messages_field": "messages", "tools_field": "tools"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ROWS = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": {"city": "Paris"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."},
        ],
        "tools": [WEATHER_TOOL],
    },
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_chat_jsonl_reads_messages_tools_and_tool_calls(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", ROWS)
    examples = load_examples(str(path), format="auto", **FIELDS)
    assert [e.origin for e in examples] == [f"{path}:1", f"{path}:2"]
    first, second = examples
    assert [m.role for m in first.messages] == ["system", "user", "assistant"]
    assert first.tools == ()
    call = second.messages[1].tool_calls[0]
    assert (call.id, call.name, json.loads(call.arguments)) == ("c1", "weather", {"city": "Paris"})
    assert second.messages[2].tool_call_id == "c1"
    assert second.tools[0].name == "weather"
    assert second.tools[0].parameters["properties"]["city"] == {"type": "string"}


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"text": "hi"}, "no 'messages' field"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role is 'robot'"),
        ({"messages": []}, "non-empty list"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": [{}]}]},
            "only assistant messages carry tool_calls",
        ),
    ],
)
def test_a_bad_line_is_named_with_its_file_and_line(tmp_path: Path, row, expected) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], row])
    with pytest.raises(DataError, match=r"bad\.jsonl:2") as caught:
        load_examples(str(path), format="chat-jsonl", **FIELDS)
    assert expected in str(caught.value)


def test_missing_data_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"\[sft\]\.eval_data: .*nope.jsonl does not exist"):
        load_examples(str(tmp_path / "nope.jsonl"), format="auto", key="eval_data", **FIELDS)


def test_other_field_names(tmp_path: Path) -> None:
    rows = [{"conversation": r["messages"], "functions": r.get("tools")} for r in ROWS]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    examples = load_examples(
        str(path), format="auto", messages_field="conversation", tools_field="functions"
    )
    assert examples[1].tools[0].name == "weather"


@pytest.mark.parametrize("suffix", ["parquet", "arrow", "jsonl"])
def test_datasets_files_give_the_same_examples_as_chat_jsonl(tmp_path: Path, suffix) -> None:
    datasets = pytest.importorskip("datasets")
    reference = load_examples(
        str(write_jsonl(tmp_path / "ref.jsonl", ROWS)), format="chat-jsonl", **FIELDS
    )
    # Arrow wants one type per column: tools as JSON text, arguments as text.
    rows = json.loads(json.dumps(ROWS))
    for row in rows:
        row["tools"] = json.dumps(row.get("tools", []))
        for message in row["messages"]:
            for call in message.get("tool_calls", []):
                call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    table = datasets.Dataset.from_list(rows)
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / f"train.{suffix}"
    if suffix == "parquet":
        table.to_parquet(str(path))
    elif suffix == "jsonl":
        table.to_json(str(path), lines=True)
    else:
        saved = tmp_path / "saved"
        table.save_to_disk(str(saved))
        next(saved.glob("*.arrow")).rename(path)
    for target in (path, folder):
        examples = load_examples(str(target), format="datasets", **FIELDS)
        assert [e.messages for e in examples] == [e.messages for e in reference]
        assert [e.tools for e in examples] == [e.tools for e in reference]
        assert examples[0].origin.endswith("row 0")


def test_without_datasets_the_error_says_what_to_install(tmp_path: Path, monkeypatch) -> None:
    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError("No module named 'datasets'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    (tmp_path / "train.parquet").write_bytes(b"")
    with pytest.raises(DataError, match=r"\[sft\]\.data: .*pip install 'rllm-core\[datasets\]'"):
        load_examples(str(tmp_path / "train.parquet"), format="auto", **FIELDS)


def test_datums_train_exactly_the_renderers_sampled_tokens(tmp_path: Path) -> None:
    renderer = ToyChatRenderer()
    examples = load_examples(
        str(write_jsonl(tmp_path / "t.jsonl", ROWS)), format="chat-jsonl", **FIELDS
    )
    tokens, report = tokenize(examples, renderer, max_length=None)
    assert report.kept == 2 and not report.too_long
    for example, token_example in zip(examples, tokens, strict=True):
        rendered = renderer.render(list(example.messages), tools=list(example.tools) or None)
        datum = supervised_datum([token_example])
        assert datum.token_ids == rendered.token_ids
        assert datum.action_mask == rendered.sampled_mask
        assert not any(datum.observation_mask)
        assert set(datum.logprobs) == {0.0} and set(datum.advantages) == {0.0}
        trained = [t for t, m in zip(datum.token_ids, datum.action_mask, strict=True) if m]
        text = renderer.decode(trained)
        assistants = [m for m in example.messages if m.role == "assistant"]
        for message in assistants:
            assert message.content in text
        assert "2+2?" not in text and "sunny" not in text and "Be brief" not in text


def test_long_and_untrained_examples_are_dropped_and_counted_with_overlong_drop() -> None:
    renderer = ToyChatRenderer()
    short = chat_example(ROWS[0], "a:1", **FIELDS)
    long = chat_example(
        {
            "messages": [
                {"role": "user", "content": "x" * 200},
                {"role": "assistant", "content": "y"},
            ]
        },
        "a:2",
        **FIELDS,
    )
    untrained = TokenExample(token_ids=(1, 2, 3), trained=(False, False, False), origin="a:3")
    limit = len(renderer.render(list(short.messages)).token_ids)
    kept, report = tokenize([short, long, untrained], renderer, max_length=limit, overlong="drop")
    assert [e.origin for e in kept] == ["a:1"]
    assert report.too_long == ["a:2"] and report.untrained == ["a:3"] and not report.truncated
    warnings = report.warnings(limit, "[sft] data")
    assert f"1 example(s) longer than [sft].max_length = {limit} tokens were dropped" in warnings[0]
    assert "a:2" in warnings[0] and "a:3" in warnings[1]
    assert short.messages[0] == Message(role="system", content="Be brief.")


def test_long_examples_are_truncated_to_max_length_with_their_masks_by_default() -> None:
    renderer = ToyChatRenderer()
    short = chat_example(ROWS[0], "a:1", **FIELDS)
    long = chat_example(
        {
            "messages": [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "four " * 200},
                {"role": "user", "content": "again"},
                {"role": "assistant", "content": "four"},
            ]
        },
        "a:2",
        **FIELDS,
    )
    whole = tokenize([long], renderer, max_length=None)[0][0]
    (short_tokens,), _ = tokenize([short], renderer, max_length=None)
    limit = len(whole.token_ids) // 2
    assert len(short_tokens.token_ids) <= limit < len(whole.token_ids)
    assert whole.trained[limit - 1] and whole.trained[limit], "the cut falls in the long answer"
    kept, report = tokenize([short, long], renderer, max_length=limit)
    assert [e.origin for e in kept] == ["a:1", "a:2"]
    assert kept[1].token_ids == whole.token_ids[:limit]
    assert kept[1].trained == whole.trained[:limit]
    assert kept[0] == short_tokens, "short ones untouched"
    assert report.truncated == ["a:2"] and report.too_long == [] and report.kept == 2
    datum = supervised_datum(kept[1:])
    assert len(datum.token_ids) == len(datum.action_mask) == limit
    # Over the limit, with only prompt tokens in its first 4: nothing left to train.
    prompt_first = TokenExample(
        token_ids=tuple(range(9)), trained=(False,) * 4 + (True,) * 5, origin="a:3"
    )
    kept, report = tokenize([prompt_first], renderer, max_length=4)
    assert kept == [] and report.too_long == ["a:3"] and not report.truncated
    (warning,) = tokenize([short, long], renderer, max_length=limit)[1].warnings(
        limit, "[sft] data"
    )
    assert (
        f"[sft] data: 1 example(s) longer than [sft].max_length = {limit} tokens were truncated"
        f" to their first {limit} tokens (first: a:2)"
    ) in warning
    assert '[sft].overlong = "drop"' in warning


TWO_ANSWERS = {
    "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "five", "trainable": False},
        {"role": "user", "content": "Wrong, again."},
        {"role": "assistant", "content": "4"},
    ]
}


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            {"role": "user", "content": "hi", "trainable": True},
            "messages[2].trainable is true on a user message; only assistant messages",
        ),
        (
            {"role": "tool", "content": "x", "trainable": True},
            "messages[2].trainable is true on a tool message",
        ),
        (
            {"role": "assistant", "content": "x", "trainable": "no"},
            "messages[2].trainable is 'no' (str); use true or false",
        ),
        (
            {"role": "assistant", "content": "x", "trainable": 0},
            "messages[2].trainable is 0 (int); use true or false",
        ),
    ],
)
def test_a_bad_trainable_flag_names_file_line_and_message(tmp_path: Path, message, expected):
    row = {"messages": [*ROWS[0]["messages"][1:], message]}
    row["messages"].append({"role": "assistant", "content": "ok"})
    path = write_jsonl(tmp_path / "flags.jsonl", [ROWS[0], row])
    with pytest.raises(DataError, match=r"flags\.jsonl:2: messages\[2\]\.trainable") as caught:
        load_examples(str(path), format="chat-jsonl", **FIELDS)
    assert expected in str(caught.value)


def test_trainable_false_keeps_an_answer_in_context_and_trains_none_of_it(tmp_path: Path):
    renderer = ToyChatRenderer()
    rows = [TWO_ANSWERS, {"messages": [*TWO_ANSWERS["messages"][:2]]}]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    examples = load_examples(str(path), format="chat-jsonl", **FIELDS)
    assert examples[0].untrained == frozenset({1})
    # trainable: false on a user message is allowed (it is never trained anyway).
    user_false = {"role": "user", "content": "hi", "trainable": False}
    assert chat_example({"messages": [user_false, *TWO_ANSWERS["messages"][3:]]}, "a:1", **FIELDS)
    kept, report = tokenize(examples, renderer, max_length=None)
    assert report.untrained == [f"{path}:2"]
    assert "(none, or all marked trainable: false)" in report.warnings(None, "[sft] data")[0]
    (example,) = kept
    rendered = renderer.render(list(examples[0].messages))
    assert example.token_ids == tuple(rendered.token_ids)
    assert "five" in renderer.decode(list(example.token_ids))
    pairs = zip(example.token_ids, example.trained, strict=True)
    trained = renderer.decode([t for t, m in pairs if m])
    assert "4" in trained and "five" not in trained
    expected = [
        m and i != 1 for m, i in zip(rendered.sampled_mask, rendered.message_indices, strict=True)
    ]
    assert list(example.trained) == expected
    # the renderer did mark the untrained answer as sampled: the flag is what removed it
    marks = zip(rendered.sampled_mask, rendered.message_indices, strict=True)
    assert any(m for m, i in marks if i == 1)
