"""A Harbor task's Dockerfile reaches a backend that builds Dockerfiles as the real build with
its context folder, and every other backend as its FROM image plus the replayed steps."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from daytona import CreateSandboxFromImageParams, Image
from rllm_core.ports import BuildsDockerfiles
from rllm_core.ports.sandboxes import task_for_backend
from rllm_core.types import Task
from rllm_sandbox_backend_daytona.backend import DaytonaBackend
from rllm_sandbox_backend_local.backend import LocalBackend
from rllm_sandbox_backend_local.plugin import LocalSandboxConfig
from rllm_task_source_harbor.prepare import prepare_sandbox
from rllm_task_source_harbor.reader import load_task

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1] / "plugins/sandbox-backends/daytona/tests")
)
from fake_daytona import FakeDaytona, fast_config

TASK_TOML = """version = "1.0"

[agent]
timeout_sec = 60.0

[verifier]
timeout_sec = 30.0

[environment]
allow_internet = false
"""


def harbor_task(folder: Path, workdir: Path) -> Task:
    """A Harbor task whose Dockerfile copies a file of its context and runs a step."""
    (folder / "environment" / "app").mkdir(parents=True)
    (folder / "environment" / "app" / "main.py").write_text("print('hi')\n")
    (folder / "environment" / "Dockerfile").write_text(
        f"FROM debian:bookworm-slim\nWORKDIR {workdir}\nCOPY app/ ./app/\n"
        "RUN echo replayed > replayed.txt\n"
    )
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    (folder / "instruction.md").write_text("Say hi.\n")
    (folder / "task.toml").write_text(TASK_TOML)
    return load_task(folder)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_daytona_builds_a_harbor_tasks_dockerfile_with_its_context(tmp_path: Path) -> None:
    workdir = tmp_path / "w"
    task = harbor_task(tmp_path / "task", workdir)
    assert task.environment is not None
    assert (task.environment.image, task.environment.replays_dockerfile) == (
        "debian:bookworm-slim",
        True,
    )
    (tmp_path / "fake-daytona").mkdir()
    client = FakeDaytona(tmp_path / "fake-daytona")
    backend = DaytonaBackend(fast_config(), client=client)
    assert isinstance(backend, BuildsDockerfiles)
    built = task_for_backend(task, backend)
    assert built.environment is not None and built.environment.image is None

    async def body() -> None:
        try:
            async with await backend.create(built.environment) as sandbox:
                await prepare_sandbox(built, sandbox)
        finally:
            await client.destroy_all()

    run(body())
    (params,) = client.created
    assert isinstance(params, CreateSandboxFromImageParams) and isinstance(params.image, Image)
    ((dockerfile, files),) = client.builds
    assert dockerfile == (tmp_path / "task" / "environment" / "Dockerfile").read_text()
    assert files == {"app/main.py": b"print('hi')\n"}
    assert not (workdir / "replayed.txt").exists(), "the build's RUN step was replayed too"

    replaying = DaytonaBackend(fast_config(build_dockerfiles=False), client=client)
    assert task_for_backend(task, replaying) is task


def test_the_local_backend_boots_the_from_image_and_the_steps_are_replayed(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "w"
    task = harbor_task(tmp_path / "task", workdir)
    backend = LocalBackend(LocalSandboxConfig(isolation="none", root_dir=tmp_path / "roots"))
    assert not isinstance(backend, BuildsDockerfiles)
    assert task_for_backend(task, backend) is task
    assert task.environment is not None

    async def body() -> str:
        try:
            async with await backend.create(task.environment) as sandbox:
                await prepare_sandbox(task, sandbox)
                result = await sandbox.exec("cat replayed.txt app/main.py", timeout=10)
                return result.stdout
        finally:
            await backend.close()

    assert run(body()) == "replayed\nprint('hi')\n"
