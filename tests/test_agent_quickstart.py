"""examples/agent-quickstart: its generated task sets and transcripts, and its RL plan for two
steps.

The sets are what ``make_tasks.py`` writes, every reference solution earns reward 1 and doing
nothing earns 0 in the real bubblewrap sandbox, the train, held-out and SFT instances are
disjoint, and each SFT transcript is a conversation the ``shell`` harness would hold. The RL
plan runs as shipped but for its size and model: a tiny random Llama over SmolLM2's tokenizer
trains, and the rollouts sample from a fake vLLM server that plays the agent (look with grep,
then write the code it saw, right on one rollout and wrong on the other, then DONE).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import shutil
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from reference.cli_process import run_cli, run_folder, vllm_group_overrides
from rllm_core.testing.fakevllm import FakeVllmServer

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "examples" / "agent-quickstart"
TASKS = HERE / "tasks"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_agent_tasks", HERE / "make_tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_shipped_sets_are_what_the_generator_writes():
    assert generator().main(["--check"]) == 0


def test_the_sets_are_large_enough_and_disjoint():
    make = generator()
    train = list((TASKS / "train").iterdir())
    held_out = list((TASKS / "held-out").iterdir())
    assert len(train) >= 30 and len(held_out) >= 30
    kinds = {path.name.split("-", 2)[0] for path in held_out}
    assert len(kinds) == 3  # find-code, count-matches, run-program

    def environments(split: str, count: int) -> set[str]:
        return {instance.dockerfile() for _, instance in make.instances(split, count)}

    train_envs = environments("train", make.TRAIN)
    held_envs = environments("held-out", make.HELD_OUT)
    sft_envs = environments("sft", make.SFT)
    assert len(train_envs) == make.TRAIN and len(held_envs) == make.HELD_OUT
    assert not train_envs & held_envs and not sft_envs & (train_envs | held_envs)


def test_each_transcript_is_the_shell_harness_solving_in_two_commands():
    from rllm_harness_shell.plugin import ShellConfig
    from rllm_harness_shell.reply import parse_reply

    config = ShellConfig()
    rows = read_jsonl(HERE / "sft.jsonl")
    assert len(rows) == generator().SFT
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
        replies = [parse_reply(m["content"], config.done_marker) for m in row["messages"][2::2]]
        assert [r.command is not None for r in replies] == [True, True, False]
        assert replies[1].command.startswith("echo ") and replies[2].done
        assert row["messages"][3]["content"].startswith("Exit code: 0\nOutput:\n")


def test_every_solution_passes_and_doing_nothing_fails(tmp_path):
    testing = pytest.importorskip("rllm_sandbox_backend_local.testing")
    testing.require_bubblewrap("check these tasks")
    for split in ("train", "held-out"):
        done = run_cli(
            "tasks", "check", str(TASKS / split), "--solve", "--noop", "--jobs", "2",
            cwd=tmp_path, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "got the expected reward" in done.stdout


def agent_replies(tiny_smol_long_model_dir: Path) -> Any:
    """The fake agent: look first; after the look, write the code it saw (every other episode
    writes a wrong one); after the write, DONE."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_smol_long_model_dir))
    writes = itertools.count()
    lock = threading.Lock()

    def reply(prompt: list[int], max_tokens: int, stops: list[int]) -> list[int]:
        text = tokenizer.decode(prompt)
        seen = text.count("Exit code:")
        if seen == 0:
            answer = "```bash\ngrep -r code /data\n```"
        elif seen == 1:
            code = re.findall(r"access code: (\d+)", text)[-1]
            with lock:
                right = next(writes) % 2 == 0
            answer = f"```bash\necho {code if right else '0000'} > /app/answer.txt\n```"
        else:
            answer = "DONE"
        return (tokenizer.encode(answer, add_special_tokens=False) + stops[:1])[:max_tokens]

    return reply


def test_two_steps_of_the_rl_plan_train_multi_turn_episodes_without_resets(
    tiny_smol_long_model_dir, tmp_path
):
    testing = pytest.importorskip("rllm_sandbox_backend_local.testing")
    testing.require_bubblewrap("run this plan")
    tasks = tmp_path / "tasks"
    for name in ("find-code-train-000", "find-code-train-001"):
        shutil.copytree(TASKS / "train" / name, tasks / name)
    with FakeVllmServer(reply=agent_replies(tiny_smol_long_model_dir)) as server:
        result = run_cli(
            "run",
            str(HERE / "rl.toml"),
            "--plain",
            *vllm_group_overrides(
                tiny_smol_long_model_dir,
                server.url,
                tmp_path,
                tasks,
                "run.steps=2",
                f'tasks.eval_path="{tasks}"',
            ),
            cwd=tmp_path,
            timeout=300,
            columns=200,
        )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    run_dir = run_folder(result, tmp_path, "agent-rl")

    lines = read_jsonl(run_dir / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert line["resets"] == 0.0 and line["infra_failures"] == 0.0
        assert line["trained"] == 1.0 and line["groups/filtered"] == 0.0
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    assert sorted(e["reward"] for e in episodes) == [0.0, 0.0, 1.0, 1.0]
    # Three model calls an episode (look, write, DONE), one cumulative lineage each.
    assert all([len(t["trace_ids"]) for t in e["trajectories"]] == [3] for e in episodes)

    solved = next(e for e in episodes if e["reward"] == 1.0)
    shown = run_cli("traces", "show", str(run_dir), "--episode", solved["episode_id"], cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "grep -r code /data" in shown.stdout and "access code:" in shown.stdout
    assert "> /app/answer.txt" in shown.stdout
