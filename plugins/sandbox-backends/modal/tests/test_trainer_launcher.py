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


# ---------------------------------------------------------------- selected by a plan


PLAN = """
[run]
name = "demo"
pipeline = "async"

[algorithm]
max_policy_age = 1

[object_store]
name = "file"
root = "store"

[scheduler]
ready_timeout_s = 900
launcher = { name = "modal", image = "ghcr.io/example/rllm:1", gpu = "A100", app_name = "trainers" }
"""


def manager():
    from rllm_core.plugins import PluginManager
    from rllm_object_store_file import plugin as file_store
    from rllm_sandbox_backend_modal import plugin

    plugins = PluginManager(load_entry_points=False, strict=True)
    plugins.register(plugin, name="modal", distribution="rllm-sandbox-backend-modal")
    plugins.register(file_store, name="file", distribution="rllm-object-store-file")
    return plugins


def resolve(tmp_path, text):
    from rllm_core.plan.resolve import resolve_plan_file

    path = tmp_path / "plan.toml"
    path.write_text(text, encoding="utf-8")
    return resolve_plan_file(path, manager=manager())


def test_a_plan_table_builds_the_launcher_with_the_run_store_and_it_launches(
    tmp_path, fake_modal, monkeypatch
):
    from rllm_core.plan.findings import find_problems
    from rllm_core.training.island import LAUNCHER_WHERE, build_launcher
    from rllm_sandbox_backend_modal import launcher as launcher_module

    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.modal.toml
    resolved = resolve(tmp_path, PLAN)
    component = resolved.get(LAUNCHER_WHERE)
    assert component.spec.key == "trainer_launcher:modal"
    assert component.provider.startswith("rllm-sandbox-backend-modal")
    assert resolved.plan.scheduler.ready_timeout_s == 900
    missing = [str(issue) for issue in find_problems(resolved, environ={}).warnings]
    assert any("Modal token" in line and "[scheduler].launcher" in line for line in missing), (
        missing
    )

    monkeypatch.setattr(launcher_module, "_modal_module", lambda: fake_modal)
    store = FileObjectStore(tmp_path / "store")
    built = build_launcher(resolved, store)
    assert isinstance(built, ModalTrainerLauncher)
    assert (built.store, built.image, built.gpu, built.app_name) == (
        store,
        "ghcr.io/example/rllm:1",
        "A100",
        "trainers",
    )
    command = CommandFile(incarnation=2, run="demo", plan_path="plan.toml", plan=PLAN)
    store.put(KEY, msgspec.json.encode(command))
    built.plan_path = str(tmp_path / "in-sandbox" / "plan.toml")
    built.argv = lambda command, plan_path: [
        sys.executable,
        "-c",
        f"import sys; sys.exit(0 if open({plan_path!r}).read() == {PLAN!r} else 1)",
    ]

    async def scenario():
        job = await built.launch(2, KEY)
        status = await job.wait(30)
        await job.release()
        return status

    assert asyncio.run(scenario()) == 0
    ((_name, created),) = [call for call in fake_modal.calls if call[0] == "Sandbox.create"]
    assert (created["gpu"], created["tags"]["rllm-incarnation"]) == ("A100", "2")
    assert fake_modal.sandboxes[0].terminated


def test_plan_check_refuses_bad_keys_and_a_missing_object_store(tmp_path):
    from rllm_core.errors import PlanError

    bad = PLAN.replace('gpu = "A100"', 'gpu = "A100", image_tag = "1"')
    with pytest.raises(PlanError) as info:
        resolve(tmp_path, bad)
    (only,) = info.value.issues
    assert only.location == "[scheduler].launcher.image_tag"
    assert "trainer launcher 'modal' has no key 'image_tag'" in str(only)
    without = PLAN.replace('image = "ghcr.io/example/rllm:1", ', "")
    with pytest.raises(PlanError) as info:
        resolve(tmp_path, without)
    (only,) = info.value.issues
    assert only.location == "[scheduler].launcher.image"
    no_store = PLAN.replace('[object_store]\nname = "file"\nroot = "store"\n', "")
    with pytest.raises(PlanError) as info:
        resolve(tmp_path, no_store)
    (only,) = info.value.issues
    assert only.location == "[scheduler].launcher"
    assert "the plan has no [object_store]" in str(only)


def test_a_store_written_in_the_plan_is_refused(tmp_path):
    from rllm_core.errors import PlanError

    with pytest.raises(PlanError) as info:
        resolve(tmp_path, PLAN.replace('app_name = "trainers"', 'store = "s3://b"'))
    (only,) = info.value.issues
    assert only.location == "[scheduler].launcher.store"
    assert "not a plan key" in str(only)


def test_convertible_nodes_are_refused_since_a_modal_job_runs_on_modal(tmp_path):
    from rllm_core.errors import PlanError

    nodes = """
[scheduler.node_classes.h100]
capacity = 80

[[scheduler.nodes]]
name = "gpu-1"
url = "http://10.0.0.7:8000"
class = "h100"

[[scheduler.nodes]]
name = "gpu-2"
url = "http://10.0.0.8:8000"
class = "h100"
"""
    with pytest.raises(PlanError) as info:
        resolve(tmp_path, PLAN + nodes)
    found = [
        issue
        for issue in info.value.issues
        if issue.location == "[scheduler].nodes" and "places_on_nodes" in str(issue)
    ]
    assert len(found) == 1, [str(issue) for issue in info.value.issues]
    assert "launcher 'modal'" in str(found[0]) and found[0].value == "gpu-1"
    assert "remove [scheduler].nodes" in str(found[0])
    # Without nodes the same launcher passes (the plain PLAN resolves).
    resolve(tmp_path, PLAN)
