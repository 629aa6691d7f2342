"""The Modal trainer launcher against the SDK-typed fake: a sandbox per incarnation, tagged,
with the command's plan written into it and the trainer command run there; waiting, and
releasing a job that still runs."""

from __future__ import annotations

import asyncio
import sys

import msgspec
import pytest
from rllm_core.training.island import CommandFile, TrainerJobError
from rllm_object_store_file.objects import FileObjectStore
from rllm_sandbox_backend_modal.launcher import ModalTrainerLauncher, _trainer_argv

KEY = "runs/demo/island/000002/command.json"


def launcher(tmp_path, fake_modal, argv):
    store = FileObjectStore(tmp_path / "store")
    command = CommandFile(
        incarnation=2, run="demo", plan_path="plan.toml", plan="[run]\n", overrides=["a=1"]
    )
    store.put(KEY, msgspec.json.encode(command))
    return ModalTrainerLauncher(
        store,
        image="ghcr.io/example/rllm:1",
        gpu="H100",
        plan_path=str(tmp_path / "in-sandbox" / "plan.toml"),
        argv=argv,
        client=fake_modal,
    )


def test_a_job_runs_the_trainer_command_in_a_tagged_sandbox(tmp_path, fake_modal):
    seen = []

    def argv(command, plan_path):
        seen.append(_trainer_argv(command, plan_path))
        return [sys.executable, "-c", f"print(open({plan_path!r}).read())"]

    async def scenario():
        job = await launcher(tmp_path, fake_modal, argv).launch(2, KEY)
        status = await job.wait(30)
        await job.release()
        return job, status

    job, status = asyncio.run(scenario())
    assert status == 0
    plan_path = str(tmp_path / "in-sandbox" / "plan.toml")
    command = ["rllm-core", "run", plan_path, "--plain", "--role", "trainer"]
    assert seen == [[*command, "--incarnation", "2", "--set", "a=1"]]
    ((_name, created),) = [call for call in fake_modal.calls if call[0] == "Sandbox.create"]
    assert created["tags"] == {"rllm-run": "demo", "rllm-incarnation": "2"}
    assert (created["gpu"], created["timeout"]) == ("H100", 24 * 3600)
    sandbox = fake_modal.sandboxes[0]
    assert job.job_id == f"modal sandbox {sandbox.object_id}"
    assert sandbox.terminated


def test_release_ends_a_running_job(tmp_path, fake_modal):
    def argv(command, plan_path):
        return [sys.executable, "-c", "import time; time.sleep(60)"]

    async def scenario():
        job = await launcher(tmp_path, fake_modal, argv).launch(2, KEY)
        running = await job.wait(0)
        await job.release()
        return running, await job.wait(5)

    running, ended = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert running is None
    assert ended is not None and ended != 0
    assert fake_modal.sandboxes[0].terminated


def test_a_command_of_another_incarnation_is_refused(tmp_path, fake_modal):
    with pytest.raises(TrainerJobError, match="incarnation 2, not 3"):
        asyncio.run(launcher(tmp_path, fake_modal, _trainer_argv).launch(3, KEY))
    assert fake_modal.sandboxes == []
