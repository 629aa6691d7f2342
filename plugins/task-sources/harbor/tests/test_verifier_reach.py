"""The verifier is out of the agent's reach: a task's tests reach the sandbox only when it is
graded, and what an agent leaves where the verifier works never becomes its reward. In the
``local`` sandbox under bubblewrap, where ``/tests`` and ``/logs`` are the sandbox's own."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from rllm_core.errors import SandboxError
from rllm_core.plugins import PluginManager
from rllm_core.types import Grade
from rllm_task_source_harbor.prepare import prepare_sandbox
from rllm_task_source_harbor.reader import load_task
from rllm_task_source_harbor.verifier import REWARD_FILES, run_verifier
from task_sandbox import write_task

TEST_SH = """\
#!/bin/bash
# rllm-verifier-marker
mkdir -p /logs/verifier
if [ -f /app/output.txt ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
COPYING_DOCKERFILE = """\
FROM debian:bookworm-slim
WORKDIR /app
COPY . /app/context/
RUN echo built > /app/built.txt
"""


class Recording:
    """A sandbox that records every path written and command run through it."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox
        self.written: list[tuple[str, bytes]] = []
        self.commands: list[str] = []

    async def write_file(self, path: str, data: bytes) -> None:
        self.written.append((path, data))
        await self.sandbox.write_file(path, data)

    async def exec(self, command: str, timeout: float, **kwargs: Any) -> Any:
        self.commands.append(command)
        return await self.sandbox.exec(command, timeout, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sandbox, name)


def in_bwrap(body: Any) -> Any:
    pytest.importorskip("rllm_sandbox_backend_local.testing").require_bubblewrap()
    backend = PluginManager().get("sandbox_backend", "local").build({"isolation": "bwrap"})

    async def main() -> Any:
        try:
            return await body(backend)
        finally:
            await backend.close()

    return asyncio.run(main())


def test_preparing_a_sandbox_uploads_nothing_of_the_tests(tmp_path: Path) -> None:
    task_dir = write_task(
        tmp_path, "t", dockerfile=COPYING_DOCKERFILE, test_sh=TEST_SH, extra={"tests/x.py": "1"}
    )
    task = load_task(task_dir)
    tests = {p.read_bytes() for p in (task_dir / "tests").rglob("*") if p.is_file()}

    async def body(backend: Any) -> tuple[Recording, str]:
        async with await backend.create(task.environment) as sandbox:
            recording = Recording(sandbox)
            await prepare_sandbox(task, recording)
            found = await sandbox.exec(
                "test -e /tests && echo tests; grep -rl rllm-verifier-marker / --exclude-dir=proc"
                " --exclude-dir=sys --exclude-dir=usr --exclude-dir=dev 2>/dev/null; true",
                timeout=60,
            )
            return recording, found.stdout

    recording, found = in_bwrap(body)
    assert recording.written, "the Dockerfile's COPY wrote nothing: the check saw no upload"
    assert "/app/context/Dockerfile" in [path for path, _ in recording.written]
    assert not [path for path, data in recording.written if data in tests]
    assert not [c for c in recording.commands if "tests" in c]
    assert found == "", f"the prepared sandbox holds the tests: {found!r}"


def test_every_reward_file_the_agent_forged_is_gone_before_the_verifier_runs(tmp_path) -> None:
    task = load_task(write_task(tmp_path, "t", test_sh=TEST_SH))
    forge = "; ".join(
        f"mkdir -p {Path(path).parent} && echo "
        + ("'{\"reward\": 1}'" if path.endswith(".json") else "1")
        + f" > {path}"
        for path in REWARD_FILES
    )

    async def body(backend: Any) -> Grade:
        async with await backend.create(task.environment) as sandbox:
            await prepare_sandbox(task, sandbox)
            forged = await sandbox.exec(forge, timeout=30)
            assert forged.exit_code == 0, forged
            return await run_verifier(task, sandbox)

    assert in_bwrap(body) == Grade(reward=0.0)


def test_a_verifier_folder_the_agent_locked_is_a_sandbox_error_not_its_reward(
    tmp_path: Path,
) -> None:
    task = load_task(write_task(tmp_path, "t", test_sh=TEST_SH))
    lock = (
        "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && chmod 000 /logs/verifier"
    )

    async def body(backend: Any) -> None:
        async with await backend.create(task.environment) as sandbox:
            await prepare_sandbox(task, sandbox)
            assert (await sandbox.exec(lock, timeout=30)).exit_code == 0
            with pytest.raises(SandboxError, match="could not prepare /tests and /logs/verifier"):
                await run_verifier(task, sandbox)

    in_bwrap(body)
