"""`rllm-core traces show` on a run folder whose traces were written by the real deltachain
store and tokenized by the real chatml renderer (SmolLM2), both built from the quickstart plan
through the plugin manager exactly as a run builds them."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import msgspec
import pytest
from reference.cli_process import run_cli
from rllm_core.run.components import prepare_plan
from rllm_core.run.folder import RunFolder
from rllm_core.run.metrics import episode_record
from rllm_core.testing.suites.storage import make_trace_chain
from rllm_core.types import Episode, Message, Step, TraceRecord, Trajectory

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "quickstart" / "plan.toml"

SYSTEM = Message(role="system", content="You are a shell agent.")
USER = Message(role="user", content="List the files.")
OUTPUT = Message(role="user", content="total 0\nnotes.txt")


cli = partial(run_cli, timeout=120)


def step(record: TraceRecord, prompt: list[int]) -> Step:
    return Step(
        trace_id=record.trace_id,
        prompt_token_ids=prompt,
        completion_token_ids=record.completion_token_ids,
        logprobs=record.logprobs,
        finish_reason=record.finish_reason,
    )


@pytest.fixture(scope="module")
def run(smollm2_model_dir, tmp_path_factory):
    """``<tmp>/runs/<run>``: a two-turn chat, a completions-style call and an episode whose
    trace the store lacks; ``plan.resolved.json`` names the store relative to ``<tmp>``, as a
    run started in ``<tmp>`` does."""
    base = tmp_path_factory.mktemp("inspect")
    folder = RunFolder.create(base / "runs", "quickstart")
    run_id = folder.path.name
    resolved = prepare_plan(PLAN, [], run_dir=Path("runs") / run_id)
    folder.write_plan(PLAN.read_text(encoding="utf-8"), resolved.to_dict())
    renderer = resolved.get("[renderer]").build()
    store_component = resolved.get("[trace_store]")
    store = store_component.spec.build(
        store_component.config.model_copy(update={"path": folder.traces})
    )

    session = f"{run_id}-s1-list-files-0-a0"
    prompt0 = renderer.render([SYSTEM, USER], add_generation_prompt=True).token_ids
    completion0 = renderer.encode("ls") + renderer.stop_token_ids()[:1]
    root = TraceRecord(
        trace_id="t0",
        session_id=session,
        prompt_delta_token_ids=prompt0,
        completion_token_ids=completion0,
        logprobs=[-0.5] * len(completion0),
        messages_delta=(SYSTEM, USER, Message(role="assistant", content="ls")),
    )
    prompt1 = renderer.bridge_to_next_turn(prompt0, completion0, [OUTPUT])
    assert prompt1 is not None
    completion1 = renderer.encode("The only file is notes")
    child = TraceRecord(
        trace_id="t1",
        session_id=session,
        turn=1,
        parent_trace_id="t0",
        prompt_delta_token_ids=prompt1[len(prompt0) + len(completion0) :],
        completion_token_ids=completion1,
        logprobs=[-1.0, -2.0] * (len(completion1) // 2) + [-1.5] * (len(completion1) % 2),
        finish_reason="length",
        weight_version=1,
        messages_delta=(OUTPUT, Message(role="assistant", content="The only file is notes")),
    )
    completion = TraceRecord(
        trace_id="t2",
        session_id=session,
        lineage_id="completions",
        prompt_delta_token_ids=renderer.encode("2 + 2 ="),
        completion_token_ids=renderer.encode(" 4"),
        logprobs=[-0.1] * len(renderer.encode(" 4")),
    )
    for record in (root, child, completion):
        store.append(record)
    store.close()

    chat = Episode(
        episode_id=session,
        task_id="list-files",
        group_id="1-list-files",
        session_id=session,
        trajectories=(
            Trajectory(lineage_id="main", steps=(step(root, prompt0), step(child, prompt1))),
            Trajectory(lineage_id="completions", steps=(step(completion, []),)),
        ),
        reward=1.0,
        signals={"parsed": 1.0},
    )
    broken = with_lost_trace(chat, f"{run_id}-s1-list-files-1-a0")
    folder.append(folder.episodes, [episode_record(1, chat), episode_record(1, broken)])
    return {
        "base": base,
        "folder": folder,
        "prompt0": prompt0,
        "prompt1": prompt1,
        "completion1": completion1,
        "renderer": renderer,
    }


def with_lost_trace(episode: Episode, episode_id: str) -> Episode:
    """The same session, with a trajectory naming a trace the store never got."""
    lost = Step(trace_id="never-written", prompt_token_ids=[], completion_token_ids=[], logprobs=[])
    trajectories = (*episode.trajectories, Trajectory(lineage_id="lost", steps=(lost,)))
    return msgspec.structs.replace(episode, episode_id=episode_id, trajectories=trajectories)


def test_turns_count_the_stored_token_ids(run):
    folder = run["folder"]
    result = cli(
        "traces",
        "show",
        f"runs/{folder.path.name}",
        "--episode",
        "s1-list-files-0",
        "--json",
        cwd=run["base"],
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["episode"]["reward"] == 1.0 and data["episode"]["termination"] == "done"
    first, second, completion = data["turns"]
    assert (first["prompt_tokens"], first["prompt_delta_tokens"]) == (len(run["prompt0"]),) * 2
    assert first["finish_reason"] == "stop" and first["mean_logprob"] == pytest.approx(-0.5)
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant"]
    assert second["prompt_tokens"] == len(run["prompt1"])
    assert second["prompt_delta_tokens"] == len(run["prompt1"]) - len(run["prompt0"]) - len(
        run["renderer"].encode("ls") + run["renderer"].stop_token_ids()[:1]
    )
    assert second["completion_tokens"] == len(run["completion1"])
    assert second["finish_reason"] == "length" and second["weight_version"] == 1
    assert second["messages"][0]["content"] == "total 0\nnotes.txt"
    assert completion["lineage_id"] == "completions" and completion["messages"] == []
    assert completion["text"] == {"prompt_delta": "2 + 2 =", "completion": " 4"}


def test_the_conversation_prints_from_another_directory_within_100_columns(
    run, tmp_path, monkeypatch
):
    monkeypatch.setenv("RLLM_CORE_OUTPUT", "rich")
    result = cli(
        "traces", "show", str(run["folder"].path), "--episode", "s1-list-files-0", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert all(len(line) <= 100 for line in out.splitlines()), out
    for text in ("You are a shell agent.", "List the files.", "notes.txt", "The only file is"):
        assert text in out
    prompt0, prompt1 = len(run["prompt0"]), len(run["prompt1"])
    assert f"prompt {prompt0} tokens (+{prompt0} new)" in out
    assert f"prompt {prompt1} tokens" in out and "finish length" in out
    assert "2 + 2 =" in out and "reward   1.000 · termination done · parsed=1" in out


def test_the_conversation_piped_is_one_line_per_message(run, tmp_path):
    result = cli(
        "traces", "show", str(run["folder"].path), "--episode", "s1-list-files-0", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "reward\t1.000 · termination done · parsed=1" in lines
    assert "user\ttotal 0\\nnotes.txt" in lines
    assert not any(set(line) & set("─━│┃") for line in lines)


def test_raw_shows_the_template_tokens(run, tmp_path):
    result = cli(
        "traces",
        "show",
        str(run["folder"].path),
        "--episode",
        "s1-list-files-0",
        "--raw",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "<|im_start|>user" in result.stdout


def test_a_trace_the_store_lacks_is_marked_not_invented(run, tmp_path):
    result = cli(
        "traces",
        "show",
        str(run["folder"].path),
        "--episode",
        "s1-list-files-1",
        "--json",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lost = json.loads(result.stdout)["turns"][-1]
    assert lost == {"lineage_id": "lost", "trace_id": "never-written", "missing": True}
    shown = cli(
        "traces", "show", str(run["folder"].path), "--episode", "s1-list-files-1", cwd=tmp_path
    )
    assert "trace never-written is not in the trace store" in shown.stdout


def test_a_store_held_by_a_live_run_is_read_without_disturbing_it(run, tmp_path):
    folder = run["folder"]
    component = prepare_plan(PLAN, [], run_dir=folder.path).get("[trace_store]")
    held = component.build()
    try:
        before = {p.name: p.read_bytes() for p in folder.traces.iterdir()}
        result = cli(
            "traces", "show", str(folder.path), "--episode", "s1-list-files-0", cwd=tmp_path
        )
        assert {p.name: p.read_bytes() for p in folder.traces.iterdir()} == before
        (record,) = make_trace_chain("written-after-the-read", 1, seed=1)
        held.append(record)  # the holder writes on
        assert held.chain(record.session_id) == [record]
    finally:
        held.close()
    assert result.returncode == 0, result.stderr
    assert "List the files." in result.stdout
