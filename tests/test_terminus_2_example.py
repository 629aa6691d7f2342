"""examples/terminus-2/plan.toml for one step, its model replaced by a scripted fake.

The plan runs as shipped except for its size (one task, 2 rollouts) and its model: a tiny
random Llama over SmolLM2's tokenizer trains, and the rollouts sample from a fake vLLM server
(``[sampler] name = "vllm"``) that answers in Terminus-2's JSON format. Harbor's agent runs
unchanged in its side environment and types into a tmux session in a real bubblewrap sandbox.
Of the two rollouts, one types the command that solves the shipped ``hello-file`` task, the
other marks the task complete at once; both then confirm (the agent ends an episode only
after two replies in a row mark it complete). So the group has rewards 1 and 0, and both
episodes train.

With a small context window, the solver's history (its command prints a screenful) crosses
the agent's proactive summarization threshold, and the agent summarizes it: three more model
calls, and a fresh conversation whose first reply confirms the task complete.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from reference.cli_process import run_cli, run_folder, vllm_group_overrides
from rllm_core.testing.fakevllm import FakeVllmServer
from rllm_core.types import Termination

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "terminus-2" / "plan.toml"
TASK = ROOT / "examples" / "tasks" / "shell" / "hello-file"
SOLVE = "printf 'Hello, world!\\n' > /app/hello.txt"
# 60 lines of output: the agent's history holds them from the call after the one that typed
# this command.
LOUD = "yes 'the quick brown fox jumps over the lazy dog' | head -n 60"

# The prompts of the agent's summarization calls (harbor's Terminus2._summarize), each found
# in the last user message of the call it starts.
SUMMARY = "hand off your work"
QUESTIONS = "asking several questions"
ANSWERS = "next agent has a few questions"
# In every prompt of the solver's episode after its first (its command, its terminal, its
# summary), in none of the quitter's.
MARK = "> /app/hello.txt"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def side_environment() -> Path:
    """Harbor's side environment, built once (about a minute) before the run needs it, where
    the local sandbox can run the agent's tmux session."""
    testing = pytest.importorskip("rllm_sandbox_backend_local.testing")
    testing.require_bubblewrap("run this plan")
    from rllm_core.testing.system import require_program

    require_program("tmux", "tmux", "run Terminus-2's terminal in the local sandbox")
    sideenv = pytest.importorskip("rllm_harness_terminus_2.sideenv")
    from rllm_core.errors import AssetError

    try:
        return sideenv.side_python()
    except AssetError as exc:
        reason = f"needs harbor's side environment (Python 3.12 or newer): {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


class FakeAgentModel:
    """The fake model, called with each prompt's tokens. A summarization call gets a one-line
    answer; an agent's first call alternates between typing ``commands`` (the solver) and
    marking the task complete (the quitter); every later agent call marks the task complete.

    :attr:`calls` holds ``(episode, kind)`` per call: the episode is ``"solver"`` when the
    prompt holds the solver's command (or its summary, which names it), else ``"quitter"``."""

    def __init__(self, model_dir: Path, *commands: str) -> None:
        from rllm_harness_terminus_2.testing import json_reply
        from transformers import AutoTokenizer

        self.json_reply = json_reply
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.commands = commands
        self.calls: list[tuple[str, str]] = []
        self._first_turns = itertools.count()
        self._lock = threading.Lock()

    def __call__(self, prompt: list[int], max_tokens: int, stops: list[int]) -> list[int]:
        json_reply = self.json_reply
        text = self.tokenizer.decode(prompt)
        last_user = text.rpartition("<|im_start|>user")[2]
        episode = "solver" if MARK in text else "quitter"
        if SUMMARY in last_user:
            kind, answer = "summary", f"I ran {SOLVE} and marked the task complete."
        elif QUESTIONS in last_user:
            kind, answer = "questions", "1. Does /app/hello.txt hold the greeting?"
        elif ANSWERS in last_user:
            kind, answer = "answers", "1. Yes."
        elif text.count("<|im_start|>assistant") > 1:
            kind, answer = "agent", json_reply(complete=True)
        else:
            with self._lock:
                solver = next(self._first_turns) % 2 == 0
            kind = "agent"
            episode = "solver" if solver else "quitter"
            answer = json_reply(*self.commands) if solver else json_reply(complete=True)
        with self._lock:
            self.calls.append((episode, kind))
        ids = self.tokenizer.encode(answer, add_special_tokens=False)
        return (ids + stops[:1])[:max_tokens]


def run_one_step(
    tiny_smol_long_model_dir: Path, tmp_path: Path, server: FakeVllmServer, *settings: str
) -> Path:
    result = run_cli(
        "run",
        str(PLAN),
        "--plain",
        "--record-datums",
        *vllm_group_overrides(
            tiny_smol_long_model_dir, server.url, tmp_path, TASK, "run.steps=1", *settings
        ),
        cwd=tmp_path,
        timeout=240,
        columns=200,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return run_folder(result, tmp_path, "terminus-2")


def turns(episode: dict[str, Any]) -> int:
    """The episode's model calls: one trace each, over all its lineages."""
    return sum(len(t["trace_ids"]) for t in episode["trajectories"])


def test_one_step_of_the_example_trains_a_solved_and_an_unsolved_episode(
    tiny_smol_long_model_dir, tmp_path, side_environment
):
    model = FakeAgentModel(tiny_smol_long_model_dir, SOLVE)
    with FakeVllmServer(reply=model) as server:
        run_dir = run_one_step(tiny_smol_long_model_dir, tmp_path, server)

    episodes = sorted(read_jsonl(run_dir / "episodes.jsonl"), key=lambda e: e["reward"])
    assert [Termination(e["termination"]) for e in episodes] == [Termination.DONE] * 2
    assert [e["reward"] for e in episodes] == [0.0, 1.0]
    # The quitter marked the task complete and confirmed it; the solver typed its command
    # first. Each model call is a turn, and each episode is one lineage of them all.
    calls = Counter(episode for episode, _ in model.calls)
    assert [turns(e) for e in episodes] == [calls["quitter"], calls["solver"]] == [2, 3]
    assert [[len(t["trace_ids"]) for t in e["trajectories"]] for e in episodes] == [[2], [3]]

    (metrics,) = read_jsonl(run_dir / "metrics.jsonl")
    assert metrics["episodes"] == 2.0 and metrics["infra_failures"] == 0.0
    assert metrics["trained"] == 1.0 and metrics["datums"] == 2.0
    datums = read_jsonl(run_dir / "datums.jsonl")
    assert sorted(d["episode_id"] for d in datums) == sorted(e["episode_id"] for e in episodes)
    assert len(server.completions) == len(model.calls) == 5


def test_a_summarization_adds_one_lineage_to_the_episode(
    tiny_smol_long_model_dir, tmp_path, side_environment
):
    model = FakeAgentModel(tiny_smol_long_model_dir, SOLVE, LOUD)
    with FakeVllmServer(reply=model) as server:
        # The agent summarizes before a call when fewer than 900 of its 2000 tokens are free,
        # counting the history it has sent (the new prompt aside) with tiktoken: 750 to 820
        # tokens before either episode's second call, about 1500 before the solver's third,
        # whose history holds the 60 lines its commands printed.
        run_dir = run_one_step(
            tiny_smol_long_model_dir,
            tmp_path,
            server,
            "harness.context_window=2000",
            "harness.proactive_summarization_threshold=900",
        )

    episodes = sorted(read_jsonl(run_dir / "episodes.jsonl"), key=lambda e: e["reward"])
    assert [Termination(e["termination"]) for e in episodes] == [Termination.DONE] * 2
    assert [e["reward"] for e in episodes] == [0.0, 1.0]
    # The solver typed its commands, marked the task complete, then summarized (three
    # calls) and confirmed from the fresh conversation; the quitter never summarized.
    assert [kind for episode, kind in model.calls if episode == "solver"] == [
        "agent",
        "agent",
        "summary",
        "questions",
        "answers",
        "agent",
    ]
    calls = Counter(episode for episode, _ in model.calls)
    assert [turns(e) for e in episodes] == [calls["quitter"], calls["solver"]] == [2, 6]
    # The gateway tells lineages apart by their first message. The summary and answers calls
    # send the agent's history plus their requests, so they extend its lineage; the
    # conversation the agent goes on with keeps its first message (then the questions
    # prompt, the questions and the answers), so it stays in that lineage as a reset
    # (history_summarized), which starts a new datum. Only the questions call starts from a
    # message of its own: one lineage more per summarization, 2 in all; the agent's holds 5
    # calls (its first two, the summary, the answers, the confirmation).
    assert [sorted(len(t["trace_ids"]) for t in e["trajectories"]) for e in episodes] == [
        [2],
        [1, 5],
    ]

    (metrics,) = read_jsonl(run_dir / "metrics.jsonl")
    assert metrics["episodes"] == 2.0 and metrics["infra_failures"] == 0.0
    assert metrics["trained"] == 1.0 and metrics["resets/history_summarized"] == 1.0
    datums = Counter(d["episode_id"] for d in read_jsonl(run_dir / "datums.jsonl"))
    assert [datums[e["episode_id"]] for e in episodes] == [1, 3]
    assert len(server.completions) == len(model.calls) == 8
