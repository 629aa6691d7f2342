"""A shipped Harbor task, end to end: the task read and its sandbox prepared by the ``harbor``
task source in the real local sandbox, the shell harness driven by a scripted model (the
task's solution commands, one per turn) through the real gateway, the verifier's reward (the
source's grade), and the trace chain the gateway recorded. Every component is built through
the plugin manager from the installed distributions, as a plan would build it."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from reference.toy_renderer import ToyChatRenderer
from rllm_core.gateway.server import Gateway
from rllm_core.plugins import PluginManager
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import Termination

TASKS = Path(__file__).resolve().parents[4] / "examples" / "tasks" / "shell"


def solution_commands(task_dir: Path) -> list[str]:
    """The command lines of the task's ``solution/solve.sh``, without the shebang, comments,
    ``set`` options and blank lines."""
    lines = (task_dir / "solution" / "solve.sh").read_text().splitlines()
    return [
        line
        for line in lines
        if line.strip() and not line.startswith("#") and not line.startswith("set ")
    ]


def require_bubblewrap() -> None:
    """Harbor tasks use absolute paths (/app, /tests, /logs) that only the bubblewrap sandbox
    makes private; skip without it, fail in CI (which installs it)."""
    testing = pytest.importorskip("rllm_sandbox_backend_local.testing")
    testing.require_bubblewrap()


@pytest.fixture(scope="module")
def manager() -> PluginManager:
    require_bubblewrap()
    return PluginManager(disabled=())


def play(manager: PluginManager, task_name: str, script: list[str]):
    """Run one episode of a shipped task; returns the outcome, the grade, the recorded traces
    and the renderer that rendered them."""
    source = manager.get("task_source", "harbor").build({"path": str(TASKS / task_name)})
    (task,) = source.tasks()
    toy = ToyChatRenderer()
    store = manager.get("trace_store", "memory").build({})
    sampler = ScriptedSampler(script, renderer=toy)
    harness = manager.get("harness", "shell").build({"max_turns": 10, "max_retries": 0})
    backend = manager.get("sandbox_backend", "local").build({"isolation": "bwrap"})

    async def episode():
        sandbox = await backend.create(task.environment)
        try:
            await source.prepare(task, sandbox)
            outcome = await harness.run(task, gateway.endpoint("episode-1"), sandbox)
            grade = await source.grade(task, outcome, sandbox)
        finally:
            await backend.close()
        return outcome, grade

    with Gateway(renderer=toy, sampler=sampler, trace_store=store) as gateway:
        outcome, grade = asyncio.run(episode())
    return outcome, grade, store.session("episode-1"), toy


def test_the_shell_harness_solves_a_shipped_task(manager):
    commands = solution_commands(TASKS / "site-skeleton")
    assert len(commands) == 2
    replies = ["I'll look first.\n```bash\nls -la /app\n```"]
    replies += [f"```bash\n{command}\n```" for command in commands]
    replies.append("The site skeleton is in place.\nDONE")

    outcome, grade, traces, toy = play(manager, "site-skeleton", replies)

    assert outcome.termination is Termination.DONE
    assert outcome.turns == 4
    assert [c["command"] for c in outcome.metadata["commands"]] == ["ls -la /app", *commands]
    assert [c["exit_code"] for c in outcome.metadata["commands"]] == [0, 0, 0]
    assert grade.reward == 1.0

    assert len(traces) == outcome.turns
    assert [t.record.turn for t in traces] == [0, 1, 2, 3]
    assert {t.record.lineage_id for t in traces} == {"main"}
    assert traces[0].record.parent_trace_id is None
    for parent, child in itertools.pairwise(traces):
        assert child.record.parent_trace_id == parent.record.trace_id
        assert child.chain_complete
        assert child.prompt_token_ids[: len(parent.prompt_token_ids)] == parent.prompt_token_ids
    for trace, reply in zip(traces, replies, strict=True):
        assert toy.decode(trace.record.completion_token_ids) == reply + "<|im_end|>"
    last_prompt = toy.decode(traces[3].prompt_token_ids)
    assert last_prompt.startswith("<|im_start|>system\nYou are an agent")
    assert "<|im_start|>user\nExit code: 0\nOutput:\n(no output)<|im_end|>" in last_prompt


def test_an_agent_that_does_nothing_scores_zero(manager):
    outcome, grade, traces, _ = play(manager, "site-skeleton", ["DONE"])
    assert (outcome.termination, outcome.turns) == (Termination.DONE, 1)
    assert outcome.metadata["commands"] == []
    assert grade.reward == 0.0
    assert len(traces) == 1
