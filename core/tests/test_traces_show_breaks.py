"""``rllm-core traces show`` on a recorded trace store of a conversation the agent summarized
mid-episode: a marker line before the call that reset, and the break in --json."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from reference.history_breaks import summarized_conversation
from rllm_core.cli import main
from rllm_core.run.folder import RunFolder

deltachain = pytest.importorskip("rllm_trace_store_deltachain.store")

MARKER = (
    "── reset at turn 3: history_summarized (4 messages replaced by a 1-message summary, 3 kept) ──"
)


def recorded_run(root) -> RunFolder:
    """A run folder whose one episode is the summarized conversation, its traces in a
    deltachain store."""
    folder = RunFolder.create(root, "summary")
    traces = folder.path / "traces"
    resolved = {
        "path": "plan.toml",
        "plan": {"run": {"name": "summary"}},
        "components": [
            {
                "where": "[trace_store]",
                "kind": "trace_store",
                "name": "deltachain",
                "provider": "rllm-trace-store-deltachain",
                "config": {"path": str(traces)},
            }
        ],
    }
    folder.write_plan("# plan\n", resolved)
    with deltachain.DeltaChainTraceStore(traces) as store:
        run = summarized_conversation(store, session="episode-1")
    episode = {
        "episode_id": f"{folder.path.name}-s1-fix-0-a0",
        "session_id": "episode-1",
        "task_id": "fix",
        "step": 1,
        "reward": 1.0,
        "termination": "done",
        "signals": {},
        "completion_tokens": sum(len(r.completion_token_ids) for r in run.results),
        "trajectories": [{"lineage_id": "main", "trace_ids": [r.trace_id for r in run.results]}],
    }
    folder.append(folder.episodes, [episode])
    return folder


def show(folder: RunFolder, *args: str):
    result = CliRunner().invoke(
        main, ["traces", "show", str(folder.path), "--episode", "s1-fix-0-a0", *args]
    )
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_call_after_a_summary_is_marked_with_the_reason_and_where(tmp_path) -> None:
    folder = recorded_run(tmp_path / "runs")
    lines = show(folder).splitlines()
    assert lines.count(MARKER) == 1
    headings = [line for line in lines if line.startswith("# main · turn ")]
    assert headings == [f"# main · turn {n}" for n in range(6)]
    # the marker comes right before the call that reset, and only there
    assert lines[lines.index(MARKER) + 1] == "# main · turn 3"
    assert sum("reset at turn" in line for line in lines) == 1


def test_json_gives_every_call_its_reset_reason_and_history_break(tmp_path) -> None:
    folder = recorded_run(tmp_path / "runs")
    turns = json.loads(show(folder, "--json"))["turns"]
    assert [t["reset_reason"] for t in turns] == [None] * 3 + ["history_summarized"] + [None] * 2
    assert [t["history_break"] for t in turns] == [None] * 3 + [
        {
            "reason": "history_summarized",
            "at": 1,
            "kept": 3,
            "dropped": 4,
            "inserted": 1,
            "source": None,
        }
    ] + [None] * 2
    assert turns[3]["parent_trace_id"] is None
    assert [m["role"] for m in turns[3]["messages"]] == [
        "system",
        "user",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
