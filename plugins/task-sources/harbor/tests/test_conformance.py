"""The harbor task source against the core's task source conformance suite, over task folders
the test writes, graded in a fake sandbox that holds the verifier's reward file (or none)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from rllm_core.errors import SandboxFileNotFound
from rllm_core.testing.suites.task_sources import GradeCase, TaskSourceConformance
from rllm_core.types import ExecResult, HarnessOutcome, Termination
from rllm_task_source_harbor.plugin import HarborConfig
from rllm_task_source_harbor.source import HarborTaskSource

TOML = '[agent]\ntimeout_sec = 10\n[verifier]\ntimeout_sec = 5\nuser = "checker"\n'


def write_task(root: Path, name: str) -> None:
    for relative, text in {
        "task.toml": TOML,
        "instruction.md": f"Do {name}.\n",
        "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\n",
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
    }.items():
        path = root / name / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


class RewardSandbox:
    """Runs nothing; reads back the reward files it was given."""

    merges_output = False

    def __init__(self, rewards: dict[str, bytes]) -> None:
        self.rewards = rewards

    async def exec(self, command, timeout, user=None, env=None, cwd=None) -> ExecResult:
        return ExecResult(exit_code=0, stdout="", stderr="")

    async def write_file(self, path, data) -> None:
        pass

    async def read_file(self, path) -> bytes:
        if path in self.rewards:
            return self.rewards[path]
        raise SandboxFileNotFound(path)


class TestHarborDirectories(TaskSourceConformance):
    task_splits = ("train", "eval", "hard")

    @pytest.fixture
    def rebuild_task_source(self, tmp_path: Path) -> Callable[[], HarborTaskSource]:
        for split, names in {"train": ("c", "a", "b"), "eval": ("e1",), "hard": ("h1",)}.items():
            for name in names:
                write_task(tmp_path / split, name)
        config = HarborConfig(
            path=tmp_path / "train", eval_path=tmp_path / "eval", splits={"hard": tmp_path / "hard"}
        )
        return lambda: HarborTaskSource(config)

    @pytest.fixture
    def grade_cases(self) -> list[GradeCase]:
        done = HarnessOutcome(termination=Termination.DONE)
        passed = RewardSandbox({"/logs/verifier/reward.txt": b"1\n"})
        half = RewardSandbox({"/logs/verifier/reward.json": b'{"reward": 0.5}'})
        return [
            GradeCase("a", done, reward=1.0, sandbox=passed),
            GradeCase("e1", done, reward=0.5, split="eval", sandbox=half),
            GradeCase("b", done, reward=None, sandbox=RewardSandbox({})),
            GradeCase("b", done, reward=None, sandbox=None),
        ]
