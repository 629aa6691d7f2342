"""A Dockerfile is built with its build context: Modal is handed the spec's ``context_dir``
and sends the files the ``COPY`` lines name from it; without one it gets an empty folder,
never the current directory."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from rllm_core.errors import SandboxCreateError
from rllm_core.types import SandboxSpec
from rllm_sandbox_backend_modal.backend import ModalBackend, build_context
from rllm_sandbox_backend_modal.plugin import ModalConfig
from rllm_sandbox_backend_modal_tests_fake import FakeModal

DOCKERFILE = (
    "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY data ./data/\nCOPY greet.sh bin/greet\n"
    "RUN ./bin/greet\n"
)


class ContextSpec(SandboxSpec, kw_only=True, frozen=True):
    """A spec that names its build context, as a task source sets it."""

    context_dir: str | None = None


def environment(root: Path) -> Path:
    """A task's environment folder: the Dockerfile, what it copies, and a file it does not."""
    (root / "data" / "nested").mkdir(parents=True)
    (root / "Dockerfile").write_text(DOCKERFILE)
    (root / "data" / "prices.csv").write_text("apple,3\n")
    (root / "data" / "nested" / "readme.txt").write_text("hi\n")
    (root / "greet.sh").write_text("#!/bin/sh\necho hello\n")
    (root / "unrelated.key").write_text("not for the image\n")
    return root


def image_for(spec: SandboxSpec, tmp_path: Path):
    fake = FakeModal()
    backend = ModalBackend(ModalConfig(create_interval_s=0.0), client=fake)
    spec = msgspec.structs.replace(spec, workdir=str(tmp_path / "w"))

    async def body():
        async with await backend.create(spec):
            pass

    asyncio.run(body())
    ((_, kwargs),) = [call for call in fake.calls if call[0] == "Sandbox.create"]
    return kwargs["image"]


def test_the_spec_context_is_sent_with_the_files_copy_names(tmp_path):
    context = environment(tmp_path / "environment")
    image = image_for(ContextSpec(dockerfile=DOCKERFILE, context_dir=str(context)), tmp_path)
    assert image.source == ("from_dockerfile", DOCKERFILE)
    assert image.context_dir == context
    assert image.context_files == ("data/nested/readme.txt", "data/prices.csv", "greet.sh")
    assert all((context / name).is_file() for name in image.context_files)


def test_without_a_context_the_build_gets_an_empty_folder_not_the_current_one(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(environment(tmp_path / "cwd"))
    image = image_for(SandboxSpec(dockerfile=DOCKERFILE), tmp_path)
    assert image.context_dir is not None and image.context_dir != Path.cwd()
    assert image.context_files == ()


def test_a_context_that_is_not_a_folder_is_a_create_error(tmp_path):
    spec = ContextSpec(dockerfile=DOCKERFILE, context_dir=str(tmp_path / "gone"))
    with pytest.raises(SandboxCreateError, match=r"build context .*gone is not a directory"):
        image_for(spec, tmp_path)


def test_build_context_reads_the_field_when_the_spec_has_it(tmp_path):
    assert build_context(SandboxSpec()) is None
    assert build_context(ContextSpec()) is None
    assert build_context(ContextSpec(context_dir=str(tmp_path))) == tmp_path
