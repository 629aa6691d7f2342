"""``rllm-core dataset from-eval`` on an evaluation folder written with the evaluation's own
writers and a real trace store, and ``dataset import``'s think-tag bridge both ways, with the
refusals of each; every row written loads as SFT data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from rllm_core.cli import main
from rllm_core.evaluation import EvalFolder, summarize, task_results
from rllm_core.rollout import RolloutBatch
from rllm_core.sft.chat_rows import join_think, split_think
from rllm_core.sft.data import DataError, load_examples
from rllm_core.types import Episode, Message, Step, Task, ToolCall, TraceRecord, Trajectory

deltachain = pytest.importorskip("rllm_trace_store_deltachain.store")

FIELDS = {"messages_field": "messages", "tools_field": "tools"}


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------------- from-eval


def record(session: str, trace_id: str, turn: int, parent: str | None, *messages, **kw):
    return TraceRecord(
        trace_id=trace_id,
        session_id=session,
        turn=turn,
        parent_trace_id=parent,
        prompt_delta_token_ids=[1, 2, turn],
        completion_token_ids=[7, 8],
        logprobs=[-0.1, -0.2],
        messages_delta=tuple(messages),
        **kw,
    )


SYSTEM = Message(role="system", content="Use the shell.")
USER = Message(role="user", content="List the files.")
CALL = Message(
    role="assistant",
    content="",
    reasoning="I should run ls.",
    tool_calls=(ToolCall(id="c1", name="shell", arguments='{"cmd": "ls"}'),),
)
RESULT = Message(role="tool", content="a.txt", tool_call_id="c1")
ANSWER = Message(role="assistant", content="One file: a.txt.", reasoning="Done.")


def eval_folder(root: Path, *, with_messages: bool = True) -> EvalFolder:
    """An evaluation of task ``t`` (3 attempts: a two-turn tool call with reward 1, then the
    same agent resetting its history into a second chain, reward 1, and a wrong one-turn
    answer, reward 0) with its trace store, written with the evaluation's writers."""
    folder = EvalFolder.create(root, "quick")
    traces = folder.path / "traces"
    folder.write_plan(
        "# plan\n",
        {
            "path": "plan.toml",
            "plan": {"run": {"name": "quick"}},
            "components": [
                {
                    "where": "[trace_store]",
                    "kind": "trace_store",
                    "name": "deltachain",
                    "provider": "rllm-trace-store-deltachain",
                    "config": {"path": str(traces)},
                }
            ],
        },
    )
    keep = (lambda *m: m) if with_messages else (lambda *m: ())
    sessions = {
        "s0": [
            record("s0", "a0", 0, None, *keep(SYSTEM, USER, CALL)),
            record("s0", "a1", 1, "a0", *keep(RESULT, ANSWER)),
        ],
        "s1": [
            record("s1", "b0", 0, None, *keep(SYSTEM, USER, CALL)),
            # the agent summarized its history: the gateway started a new chain (a root)
            record(
                "s1",
                "b1",
                1,
                None,
                *keep(USER, Message(role="assistant", content="Summary."), ANSWER),
                reset_reason="history_summarized",
            ),
        ],
        "s2": [record("s2", "c0", 0, None, *keep(USER, Message(role="assistant", content="No.")))],
    }
    with deltachain.DeltaChainTraceStore(traces) as store:
        for records in sessions.values():
            for r in records:
                store.append(r)

    def episode(index: int, session: str, reward: float) -> Episode:
        steps = tuple(
            Step(trace_id=r.trace_id, prompt_token_ids=[1], completion_token_ids=[7], logprobs=[0])
            for r in sessions[session]
        )
        return Episode(
            episode_id=f"quick-s0-t-{index}",
            task_id="t",
            group_id="0-t",
            session_id=session,
            trajectories=(Trajectory(lineage_id="main", steps=steps),),
            reward=reward,
            metadata={"index": index},
        )

    episodes = [episode(0, "s0", 1.0), episode(1, "s1", 1.0), episode(2, "s2", 0.0)]
    batch = RolloutBatch(groups=[episodes], infra_failures=[])
    results = task_results([Task(task_id="t", instruction="list")], batch)
    folder.write_results(results, summarize(results, attempts=3, wall_s=1.0), episodes)
    return folder


def test_from_eval_writes_each_passing_attempts_conversations_with_reasoning(tmp_path):
    folder = eval_folder(tmp_path / "runs")
    out = tmp_path / "sft" / "passed.jsonl"
    result = invoke("dataset", "from-eval", folder.path, "-o", out, "--min-reward", "1")
    assert result.exit_code == 0, result.output
    assert f"wrote 3 row(s) from 2 of 3 attempt(s); 1 below --min-reward 1 to {out}" in (
        result.stdout
    )
    rows = read_rows(out)
    assert [(r["episode_id"], r["reward"], r["task_id"]) for r in rows] == [
        ("quick-s0-t-0", 1.0, "t"),
        ("quick-s0-t-1", 1.0, "t"),
        ("quick-s0-t-1", 1.0, "t"),
    ]
    assert rows[0]["messages"] == [
        {"role": "system", "content": "Use the shell."},
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should run ls.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"cmd": "ls"}'},
                }
            ],
        },
        {"role": "tool", "content": "a.txt", "tool_call_id": "c1"},
        {"role": "assistant", "content": "One file: a.txt.", "reasoning_content": "Done."},
    ]
    # the reset attempt: its first chain, then the summarized one, each a conversation
    assert [m["role"] for m in rows[1]["messages"]] == ["system", "user", "assistant"]
    assert [m["content"] for m in rows[2]["messages"]] == [
        "List the files.",
        "Summary.",
        "One file: a.txt.",
    ]
    examples = load_examples(str(out), format="auto", **FIELDS)
    assert examples[0].messages[2].reasoning == "I should run ls."
    assert examples[0].messages[2].tool_calls[0].name == "shell"

    everything = tmp_path / "all.jsonl"
    result = invoke("dataset", "from-eval", folder.path, "-o", everything, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary | {"warnings": []} == {
        "out": str(everything),
        "attempts": 3,
        "kept": 3,
        "rows": 4,
        "below_min_reward": 0,
        "without_messages": 0,
        "missing_traces": 0,
        "warnings": [],
    }
    assert read_rows(everything)[-1]["messages"][-1] == {"role": "assistant", "content": "No."}


def test_from_eval_skips_attempts_without_messages_or_traces_and_says_so(tmp_path):
    folder = eval_folder(tmp_path / "runs", with_messages=False)
    out = tmp_path / "none.jsonl"
    result = invoke("dataset", "from-eval", folder.path, "-o", out)
    assert result.exit_code == 0, result.output
    assert read_rows(out) == []
    assert "3 attempt(s) were stored without messages and were skipped" in result.stderr
    assert "(first: quick-s0-t-0)" in result.stderr

    folder = eval_folder(tmp_path / "other")
    lost = read_rows(folder.episodes)[0] | {"episode_id": "quick-s0-t-9"}
    lost["trajectories"] = [{"lineage_id": "main", "trace_ids": ["a0", "gone"]}]
    folder.append(folder.episodes, [lost])
    result = invoke("dataset", "from-eval", folder.path, "-o", out, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["rows"], report["kept"], report["missing_traces"]) == (4, 3, 1)
    assert "1 attempt(s) miss traces in the trace store" in report["warnings"][0]
    assert "(first: quick-s0-t-9)" in report["warnings"][0]


def test_from_eval_refuses_what_is_not_an_evaluation_folder(tmp_path):
    out = tmp_path / "out.jsonl"
    result = invoke("dataset", "from-eval", tmp_path / "nope", "-o", out)
    assert result.exit_code == 2 and "does not exist" in result.stderr
    folder = eval_folder(tmp_path / "runs")
    folder.episodes.unlink()  # an evaluation written before episodes.jsonl
    result = invoke("dataset", "from-eval", folder.path, "-o", out)
    assert result.exit_code == 2
    assert "has results.jsonl but no episodes.jsonl" in result.stderr
    assert "evaluate again" in result.stderr
    assert not out.exists()


# ---------------------------------------------------------------------------- import


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


FIELD_ROWS = [
    {
        "id": "r1",
        "conversation": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\n4"},
        ],
    },
    {
        "id": "r2",
        "conversation": [
            {"role": "user", "content": "3+3?"},
            # the opening tag was in the generation prompt, as Qwen3's templates put it
            {"role": "assistant", "content": "Three and three.\n</think>\n\n6", "trainable": True},
            {"role": "user", "content": "Thanks. <think> is just text here."},
            {"role": "assistant", "content": "You are welcome."},
        ],
    },
]


def test_import_moves_think_blocks_to_reasoning_content_and_back(tmp_path):
    source = write_jsonl(tmp_path / "field.jsonl", FIELD_ROWS)
    out = tmp_path / "train.jsonl"
    result = invoke(
        "dataset", "import", source, "-o", out, "--messages-field", "conversation", "--json"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["messages_converted"] == 2
    first, second = read_rows(out)
    assert first == {
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Two and two."},
        ],
        "id": "r1",
    }
    assert second["messages"][1] == {
        "role": "assistant",
        "content": "6",
        "trainable": True,
        "reasoning_content": "Three and three.",
    }
    assert second["messages"][2:] == FIELD_ROWS[1]["conversation"][2:]
    examples = load_examples(str(out), format="auto", **FIELDS)
    assert examples[0].messages[1] == Message(
        role="assistant", content="4", reasoning="Two and two."
    )

    back = tmp_path / "tags.jsonl"
    result = invoke("dataset", "import", out, "-o", back, "--to-think-tags")
    assert result.exit_code == 0, result.output
    assert "2 message(s) had their thinking moved into think blocks" in result.stdout
    rows = read_rows(back)
    assert rows[0]["messages"] == FIELD_ROWS[0]["conversation"]
    assert rows[1]["messages"][1]["content"] == "<think>\nThree and three.\n</think>\n\n6"
    assert "reasoning_content" not in rows[1]["messages"][1]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("<think>\nhmm, 4", "opens <think> but never closes it"),
        ("Sure. <think>x</think>4", "has text before <think> ('Sure.')"),
        ("<think>a</think><think>b</think>4", "has 2 think blocks"),
    ],
)
def test_import_refuses_a_malformed_think_block_with_file_and_line(tmp_path, content, expected):
    bad = {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": content}]
    }
    source = write_jsonl(tmp_path / "in.jsonl", [{"messages": FIELD_ROWS[0]["conversation"]}, bad])
    out = tmp_path / "out.jsonl"
    result = invoke("dataset", "import", source, "-o", out)
    assert result.exit_code == 2
    assert f"{source}:2: messages[1].content" in result.stderr
    assert expected in result.stderr
    assert not out.exists() and not list(tmp_path.glob(".out.jsonl*"))


def test_import_refuses_rows_sft_would_refuse_and_double_reasoning(tmp_path):
    both = {"role": "assistant", "content": "<think>x</think>4", "reasoning_content": "y"}
    cases = [
        ("not json\n", "in.jsonl:1: not JSON"),
        (json.dumps({"messages": [{"role": "user", "content": "q"}]}), "no assistant message"),
        (
            json.dumps({"messages": [{"role": "user", "content": "q", "trainable": True}, both]}),
            "messages[0].trainable is true on a user message",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "q"}, both]}),
            "in.jsonl:1: messages[1] has both reasoning_content and a think block",
        ),
    ]
    for line, expected in cases:
        source = tmp_path / "in.jsonl"
        source.write_text(line + "\n")
        result = invoke("dataset", "import", source, "-o", tmp_path / "out.jsonl")
        assert result.exit_code == 2, line
        assert expected in result.stderr, result.stderr
    result = invoke("dataset", "import", tmp_path / "missing.jsonl", "-o", tmp_path / "o.jsonl")
    assert result.exit_code == 2 and "missing.jsonl does not exist" in result.stderr


def test_split_and_join_think_are_inverse_on_what_a_template_writes():
    assert split_think(join_think("a\nb", "c"), "m") == ("a\nb", "c")
    assert split_think("plain", "m") == (None, "plain")
    assert split_think("<think></think>x", "m") == ("", "x")
    with pytest.raises(DataError, match=r"m\.content opens <think>"):
        split_think("<think>x", "m")
