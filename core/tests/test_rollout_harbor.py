"""A shipped Harbor task end to end through the rollout runner: the shell harness in the
``local`` sandbox, a scripted model, the real gateway and the task's own verifier."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from reference.rollout_stack import gateway_runner
from reference.toy_renderer import IM_END, ToyChatRenderer
from rllm_core.plugins import PluginManager
from rllm_core.rollout import RolloutSettings
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import Termination

REPO_ROOT = Path(__file__).resolve().parents[2]
COUNT_LINES = REPO_ROOT / "examples" / "tasks" / "shell" / "count-lines"
TOY = ToyChatRenderer()
SCRIPTS = {
    "right": ["```bash\nwc -l < /app/access.log > /app/count.txt\n```", "DONE"],
    "wrong": ["```bash\necho 0 > /app/count.txt\n```", "DONE"],
}


def require_bubblewrap() -> None:
    """Harbor tasks use absolute paths (/app, /tests, /logs) that only the bubblewrap sandbox
    makes private; skip without it, fail in CI (which installs it)."""
    testing = pytest.importorskip("rllm_sandbox_backend_local.testing")
    testing.require_bubblewrap()


def test_the_shell_harness_solves_a_harbor_task_in_several_turns():
    require_bubblewrap()
    plugins = PluginManager()
    # Concurrency 1: rollout 0 makes its two calls, then rollout 1. Rollout 0 solves the
    # task, rollout 1 writes a wrong count.
    sampler = ScriptedSampler([*SCRIPTS["right"], *SCRIPTS["wrong"]], renderer=TOY)
    backend = plugins.get("sandbox_backend", "local").build({"isolation": "bwrap"})
    harness = plugins.get("harness", "shell").build({"max_turns": 4, "max_retries": 0})
    # The source prepares each sandbox (workdir, replayed RUN steps) before the harness runs.
    source = plugins.get("task_source", "harbor").build({"path": str(COUNT_LINES)})
    (task,) = source.tasks()
    store = plugins.get("trace_store", "memory").build({})

    async def main() -> Any:
        try:
            async with gateway_runner(
                renderer=TOY,
                source=source,
                harness=harness,
                backend=backend,
                store=store,
                settings=RolloutSettings(group_size=2, max_concurrency=1, max_infra_retries=0),
                sampler=sampler,
                run_id="harbor",
            ) as (runner, _):
                return await runner.run([task], step=0)
        finally:
            await backend.close()

    batch = asyncio.run(main())
    assert batch.infra_failures == []
    right, wrong = batch.groups[0]
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    for episode, script in ((right, "right"), (wrong, "wrong")):
        assert episode.termination is Termination.DONE
        assert episode.metadata["turns"] == 2
        (trajectory,) = episode.trajectories
        first, second = trajectory.steps
        assert first.completion_token_ids == [*TOY.tokenizer.encode(SCRIPTS[script][0]), IM_END]
        assert second.completion_token_ids == [*TOY.tokenizer.encode("DONE"), IM_END]
        # The second prompt extends the first turn with the command's output.
        head = first.prompt_token_ids + first.completion_token_ids
        assert second.prompt_token_ids[: len(head)] == head
        assert len(second.prompt_token_ids) > len(head)
