"""Run folders written without training, in the format a run writes them, for tests and
benchmarks of what reads run folders (``runs show``, ``traces show``, ``view``).

:func:`write_agent_run` resolves a real plan, writes ``plan.toml`` and ``plan.resolved.json``,
``metrics.jsonl`` rows with the keys a run logs, ``episodes.jsonl`` records made by
:func:`rllm_core.run.metrics.episode_record`, and every model call into the plan's own trace
store (built through the plugin manager as a run builds it) with token ids from the plan's
renderer, that is its real tokenizer. Each episode is a multi-turn agent conversation: the model
calls a ``bash`` tool, reads the result, and answers. Optionally the first episode's agent
summarizes its history mid-episode (a lineage reset recorded as a history break, as the gateway
records one).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rllm_core.run.folder import RunFolder, write_json
from rllm_core.run.metrics import episode_record
from rllm_core.types import Episode, Message, Step, ToolCall, TraceRecord, Trajectory

__all__ = ["WrittenRun", "write_agent_run"]

SYSTEM = "You are a shell agent. Run commands with the bash tool, then answer."
TASKS = ("count-files", "find-todo", "fix-typo", "sum-column")


@dataclass
class WrittenRun:
    """What :func:`write_agent_run` wrote: the folder, and the id of the episode with a reset
    (None without one) and of one with a tool call."""

    folder: RunFolder
    reset_episode: str | None
    tool_episode: str


def _call(
    renderer: Any,
    session: str,
    trace_id: str,
    turn: int,
    parent: str | None,
    new: list[Message],
    reply: Message,
    rng: random.Random,
    *,
    reset_reason: str | None = None,
    flags: tuple[str, ...] = (),
) -> TraceRecord:
    rendered = [Message(role="user", content=m.content) if m.role == "tool" else m for m in new]
    prompt = renderer.render(rendered, add_generation_prompt=True).token_ids
    text = reply.content or "".join(
        f'<tool_call>{{"name": "{c.name}", "arguments": {c.arguments}}}</tool_call>'
        for c in reply.tool_calls
    )
    completion = renderer.encode(text) + renderer.stop_token_ids()[:1]
    return TraceRecord(
        trace_id=trace_id,
        session_id=session,
        turn=turn,
        parent_trace_id=parent,
        prompt_delta_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-abs(rng.gauss(0.0, 1.2)) for _ in completion],
        weight_version=max(0, turn // 2),
        messages_delta=(*new, reply),
        reset_reason=reset_reason,
        flags=flags,
        latency_s=0.05,
    )


def _conversation(
    renderer: Any, session: str, task: str, turns: int, rng: random.Random, *, reset_at: int | None
) -> list[TraceRecord]:
    """``turns`` calls: each but the last calls bash; the last answers. At ``reset_at`` the
    agent replaces its history by a summary (a new root recording the break)."""
    from rllm_core.gateway.history import HISTORY_SUMMARIZED, HistoryBreak

    records: list[TraceRecord] = []
    new = [Message(role="system", content=SYSTEM), Message(role="user", content=f"Task: {task}.")]
    history = list(new)
    for turn in range(turns):
        call_id = f"call-{turn}"
        if turn == turns - 1:
            reply = Message(role="assistant", content=f"Done: {task} is solved.")
        else:
            command = json.dumps({"command": f"ls -la step{turn}"})
            reply = Message(
                role="assistant",
                content="",
                reasoning=f"I should look at step{turn} before changing anything.",
                tool_calls=(ToolCall(id=call_id, name="bash", arguments=command),),
            )
        parent = records[-1].trace_id if records else None
        reason, flags = None, ()
        if reset_at is not None and turn == reset_at:
            summary = Message(role="user", content=f"Summary so far: {turn} commands ran.")
            dropped = len(history) - 2
            found = HistoryBreak(
                reason=HISTORY_SUMMARIZED, at=1, kept=1, dropped=dropped, inserted=1
            )
            new = [history[0], summary, *new]
            history = [history[0], summary]
            parent, reason, flags = None, HISTORY_SUMMARIZED, found.flags()
        record = _call(
            renderer,
            session,
            f"{session}-t{turn}",
            turn,
            parent,
            new,
            reply,
            rng,
            reset_reason=reason,
            flags=flags,
        )
        records.append(record)
        history.append(reply)
        new = [
            Message(
                role="tool",
                content=f"total {turn + 1}\n-rw-r--r-- notes{turn}.txt",
                tool_call_id=call_id,
            )
        ]
        history += new
    return records


def write_agent_run(
    output_dir: str | Path,
    plan: str | Path,
    *,
    name: str = "agent",
    steps: int = 3,
    groups: int = 2,
    group_size: int = 2,
    turns: int = 3,
    reset: bool = True,
    finished: bool = True,
    when: float | None = None,
    seed: int = 0,
) -> WrittenRun:
    """Write a run folder of ``plan`` (a ``plan.toml``; its model and renderer's tokenizer
    must be available) under ``output_dir``: ``steps`` steps of ``groups`` groups of
    ``group_size`` episodes, each of ``turns`` model calls; the first episode summarizes its
    history at its third call when ``reset`` (and ``turns`` > 3). ``finished`` writes
    ``summary.json`` and a checkpoint at the last step; without it the folder reads as a run
    still going."""
    from rllm_core.run.components import prepare_plan

    rng = random.Random(seed)
    plan = Path(plan)
    folder = RunFolder.create(output_dir, name, when=when)
    resolved = prepare_plan(plan, [], run_dir=folder.path)
    folder.write_plan(plan.read_text(encoding="utf-8"), resolved.to_dict())
    renderer = resolved.get("[renderer]").build()
    component = resolved.get("[trace_store]")
    store = component.spec.build(component.config.model_copy(update={"path": folder.traces}))
    reset_episode = None
    tool_episode = ""
    try:
        for step in range(1, steps + 1):
            rewards: list[float] = []
            records = []
            for g in range(groups):
                task = TASKS[g % len(TASKS)]
                for attempt in range(group_size):
                    episode_id = f"{folder.path.name}-s{step}-{task}-{attempt}-a0"
                    first = step == 1 and g == 0 and attempt == 0
                    reset_at = 3 if first and reset and turns > 3 else None
                    calls = _conversation(renderer, episode_id, task, turns, rng, reset_at=reset_at)
                    for record in calls:
                        store.append(record)
                    reward = 1.0 if rng.random() < 0.3 + 0.2 * step else 0.0
                    rewards.append(reward)
                    steps_ = tuple(
                        Step(
                            trace_id=r.trace_id,
                            prompt_token_ids=[],
                            completion_token_ids=r.completion_token_ids,
                            logprobs=r.logprobs,
                            weight_version=r.weight_version,
                        )
                        for r in calls
                    )
                    episode = Episode(
                        episode_id=episode_id,
                        task_id=task,
                        group_id=f"{step}-{task}",
                        session_id=episode_id,
                        trajectories=(Trajectory(lineage_id="main", steps=steps_),),
                        reward=reward,
                        signals={"tests_passed": reward, "commands": float(turns - 1)},
                    )
                    records.append(episode_record(step, episode))
                    if reset_at is not None:
                        reset_episode = episode_id
                    if not tool_episode and turns > 1:
                        tool_episode = episode_id
            folder.append(folder.episodes, records)
            folder.append(folder.metrics, _metrics_row(step, rewards, rng, last=step == steps))
    finally:
        store.close()
    if finished:
        cut = folder.checkpoints / "objects" / "cuts" / f"{steps}-final"
        cut.mkdir(parents=True)
        write_json(cut / "manifest.json", {"step": steps})
        write_json(
            folder.summary,
            {"status": "finished", "last_step": steps, "wall_s": 4.0 * steps, "steps": steps},
        )
    return WrittenRun(folder=folder, reset_episode=reset_episode, tool_episode=tool_episode)


def _metrics_row(
    step: int, rewards: list[float], rng: random.Random, *, last: bool
) -> dict[str, Any]:
    mean = sum(rewards) / len(rewards)
    row: dict[str, Any] = {
        "step": step,
        "reward/mean": mean,
        "reward/std": (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5,
        "accuracy": mean,
        "episodes": len(rewards),
        "train/loss": 0.5 / step + rng.random() * 0.05,
        "train/grad_norm": 1.0 + rng.random(),
        "offpolicy/k3": 0.001 * step,
        "offpolicy/ratio_mean": 1.0 + 0.01 * rng.random(),
        "async/policy_age_mean": 0.5,
        "async/queue_groups": float(step % 2),
        "tokens/sampled": 100.0 * len(rewards),
        "tokens/trained": 100.0 * len(rewards),
        "time/step_s": 4.0,
        "weight_version": step,
    }
    if last:
        row["eval/pass@1"] = mean
        row["eval/mean_reward"] = mean
    return row
