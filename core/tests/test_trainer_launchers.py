"""A trainer launcher a plugin provides, selected by ``[scheduler].launcher``: resolved as the
component ``[scheduler].launcher`` (a name or a table with the launcher's keys), refused by
``plan check`` when no plugin provides it, when its keys are wrong or when the plan has no
``[object_store]``, left out of the components every process builds, and built by the
scheduling trainer role with the run's object store and driven as the local-process launcher
is, ``ready_timeout_s`` included."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console
from rllm_core import ComponentSpec, hookimpl
from rllm_core.cli.plan_cmd import settings_rows
from rllm_core.cli.run_display import PlainDisplay
from rllm_core.errors import PlanError
from rllm_core.plan.schema import ComponentRef, SchedulerSection
from rllm_core.plugins import Kind
from rllm_core.ports import TrainerLauncher
from rllm_core.run.components import BuildError, Components, build_components
from rllm_core.run.folder import RunFolder
from rllm_core.training.island import (
    LAUNCHER_WHERE,
    LocalProcessJob,
    LocalProcessLauncher,
    TrainerNotReady,
    build_launcher,
    read_command,
)
from rllm_core.training.roles import TrainerRole
from rllm_core.training.shared import SharedRun
from rllm_object_store_file.objects import FileObjectStore

RUN = "launch"


class ToyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    store: Any = Field(None, exclude=True, description="the run's object store (run key)")
    zone: str = Field("a", min_length=1, description="where the jobs run")
    logs: Path | None = Field(None, description="a folder on this machine, for its logs")


class ToyLauncher:
    """Launches a process that never gets ready, after reading the command file."""

    def __init__(self, config: ToyConfig) -> None:
        self.config = config
        self.jobs: list[LocalProcessJob] = []
        self.closed = False

    async def launch(self, incarnation: int, command_file_uri: str) -> LocalProcessJob:
        read_command(self.config.store, command_file_uri)
        argv = [sys.executable, "-c", "import time; time.sleep(60)"]
        job = LocalProcessJob(subprocess.Popen(argv), None)
        self.jobs.append(job)
        return job

    def close(self) -> None:
        self.closed = True


class ToyLaunchers:
    @hookimpl
    def rllm_trainer_launchers(self):
        yield ComponentSpec(
            kind="trainer_launcher",
            name="toy",
            factory=ToyLauncher,
            config=ToyConfig,
            summary="a launcher for tests",
            traits={"run_keys": ("store",)},
        )
        yield ComponentSpec(
            kind="trainer_launcher", name="broken", factory=dict, summary="builds no launcher"
        )


class Parts:
    """The object store and the parts of a sampling run, each built as a dict."""

    @hookimpl
    def rllm_object_stores(self):
        yield ComponentSpec(kind="object_store", name="file", factory=dict, summary="objects")

    @hookimpl
    def rllm_trainer_backends(self):
        yield ComponentSpec(
            kind="trainer_backend",
            name="t",
            factory=dict,
            summary="trainer",
            traits={"publishes_weights": True},
        )

    @hookimpl
    def rllm_renderers(self):
        yield ComponentSpec(kind="renderer", name="r", factory=dict, summary="renderer")

    @hookimpl
    def rllm_harnesses(self):
        yield ComponentSpec(kind="harness", name="h", factory=dict, summary="harness")

    @hookimpl
    def rllm_task_sources(self):
        yield ComponentSpec(kind="task_source", name="k", factory=dict, summary="tasks")

    @hookimpl
    def rllm_trace_stores(self):
        yield ComponentSpec(kind="trace_store", name="s", factory=dict, summary="traces")


@pytest.fixture
def launchers(register_plugin):
    register_plugin(Parts(), name="parts", distribution="rllm-test-parts")
    return register_plugin(ToyLaunchers(), name="toys", distribution="rllm-test-launchers")


def plan(launcher: Any, *, store: bool = True, **scheduler: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "run": {"name": RUN, "pipeline": "async"},
        "algorithm": {"max_policy_age": 1},
        "scheduler": {"launcher": launcher, **scheduler},
    }
    if store:
        data["object_store"] = {"name": "file"}
    return data


def problems(info: pytest.ExceptionInfo[PlanError]) -> dict[str, str]:
    return {issue.location: str(issue) for issue in info.value.issues}


def test_the_kind_is_declared_with_its_port_and_run_key():
    assert Kind.TRAINER_LAUNCHER.port is TrainerLauncher
    assert Kind.TRAINER_LAUNCHER.hook_name == "rllm_trainer_launchers"
    assert Kind.TRAINER_LAUNCHER.traits["run_keys"].choices == ("store",)


def test_the_built_in_launchers_stay_names_and_any_other_is_a_component():
    assert SchedulerSection().launcher == "in-process"
    assert SchedulerSection(launcher="local-process").launcher == "local-process"
    assert SchedulerSection(launcher={"name": "Local_Process"}).launcher == "local-process"
    assert SchedulerSection(launcher="modal").launcher == ComponentRef(name="modal")
    table = SchedulerSection(launcher={"name": "modal", "gpu": "A100"}).launcher
    assert isinstance(table, ComponentRef) and table.options == {"gpu": "A100"}
    with pytest.raises(ValidationError, match="'local-process' is built in and takes no keys"):
        SchedulerSection(launcher={"name": "local-process", "zone": "b"})
    assert SchedulerSection(launcher="toy", ready_timeout_s=5).ready_timeout_s == 5


def test_a_name_or_a_table_resolves_to_the_plugin_and_is_shown(plan_builder, launchers):
    resolved = plan_builder.resolve(plan("toy"))
    component = resolved.get(LAUNCHER_WHERE)
    assert component.spec.key == "trainer_launcher:toy" and component.config.zone == "a"
    assert component.provider.startswith("rllm-test-launchers")
    path = plan_builder.write(plan({"name": "toy", "zone": "b", "logs": "logs"}))
    resolved = plan_builder.resolve(plan({"name": "toy", "zone": "b", "logs": "logs"}))
    config = resolved.get(LAUNCHER_WHERE).config
    assert config.zone == "b"
    assert config.logs == path.parent / "logs"  # relative to the plan's folder
    dumped = resolved.to_dict()
    written = {"name": "toy", "zone": "b", "logs": str(path.parent / "logs")}
    assert dumped["plan"]["scheduler"]["launcher"] == written
    assert {"where": LAUNCHER_WHERE, "name": "toy"}.items() <= dumped["components"][-1].items()
    rows = dict(settings_rows(plan_builder.resolve(plan("local-process")).plan))
    assert rows["[scheduler].launcher"] == '"local-process"'
    assert "[scheduler].launcher" not in dict(settings_rows(resolved.plan))


def test_a_launcher_no_plugin_provides_is_refused_naming_the_installed_ones(
    plan_builder, launchers
):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(plan("tyo"))
    (only,) = info.value.issues
    assert only.location == "[scheduler].launcher"
    text = str(only)
    assert "no trainer launcher named 'tyo' is installed; did you mean 'toy'?" in text
    assert "available: broken, toy" in text
    assert '"in-process" or "local-process"' in text and "rllm-core plugins" in text
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(plan({"name": "modal", "image": "x"}))
    text = problems(info)["[scheduler].launcher.name"]
    assert "pip install rllm-sandbox-backend-modal" in text


def test_bad_launcher_keys_are_refused_by_section_and_key(plan_builder, launchers):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(plan({"name": "toy", "zone": "", "zoen": "b"}))
    found = problems(info)
    assert set(found) == {"[scheduler].launcher.zone", "[scheduler].launcher.zoen"}
    assert (
        "trainer launcher 'toy' has no key 'zoen'; did you mean 'zone'?"
        in found["[scheduler].launcher.zoen"]
    )
    assert "at least 1 character" in found["[scheduler].launcher.zone"]


def test_a_launcher_without_an_object_store_is_refused(plan_builder, launchers):
    for launcher in ("toy", "local-process"):
        with pytest.raises(PlanError) as info:
            plan_builder.resolve(plan(launcher, store=False, max_failures=2))
        (only,) = info.value.issues  # not also the generic [scheduler] refusal
        assert only.location == "[scheduler].launcher"
        assert "meets the scheduler only in the run's object store" in str(only)
        assert "add an [object_store] section" in str(only)


def test_the_launcher_is_built_only_by_the_scheduler_with_the_run_store(
    plan_builder, launchers, tmp_path
):
    parts = {"trainer": "t", "renderer": "r", "harness": "h", "tasks": "k", "trace_store": "s"}
    resolved = plan_builder.resolve(plan({"name": "toy", "zone": "b"}) | parts)
    built = build_components(resolved, training=False)  # what every process builds
    assert "[object_store]" in built.placed and LAUNCHER_WHERE not in built.placed
    store = FileObjectStore(tmp_path / "store")
    built = build_launcher(resolved, store)
    assert isinstance(built, ToyLauncher)
    assert (built.config.store, built.config.zone) == (store, "b")
    local = build_launcher(plan_builder.resolve(plan("local-process")), store, logs=tmp_path)
    assert isinstance(local, LocalProcessLauncher) and local.logs == tmp_path
    with pytest.raises(BuildError, match=r"trainer_launcher:broken .* built a dict"):
        build_launcher(plan_builder.resolve(plan("broken")), store)


def role(resolved: Any, root: Path) -> TrainerRole:
    store = FileObjectStore(root / "store")
    components = Components(
        trainer=None,
        renderer=None,
        harness=None,
        tasks=None,
        trace_store=None,  # type: ignore[arg-type]
    )
    components.object_store = store
    components.sample_buffer = object()  # type: ignore[assignment]
    return TrainerRole(
        shared=SharedRun(store, RUN),
        resolved=resolved,
        components=components,
        folder=RunFolder.create(root / "runs", RUN),
        display=PlainDisplay(Console(file=None, quiet=True), 1),
    )


def test_the_trainer_role_launches_through_it_within_ready_timeout_s(
    plan_builder, launchers, tmp_path
):
    resolved = plan_builder.resolve(plan("toy", ready_timeout_s=0.3, poll_s=0.02))
    trainer = role(resolved, tmp_path)
    island = trainer._lifecycle_of_run()
    launcher = island.launcher
    assert isinstance(launcher, ToyLauncher) and launcher.config.store is trainer.shared.store
    assert island.ready_timeout_s == 0.3

    async def start() -> None:
        try:
            with pytest.raises(TrainerNotReady, match=r"within .*ready_timeout_s = 0.3 s"):
                await asyncio.wait_for(island.start(1), 10)
        finally:
            await island.aclose()

    asyncio.run(start())
    (job,) = launcher.jobs
    assert job.process.poll() is not None  # released, not left running
    assert read_command(trainer.shared.store, "runs/launch/island/000001/command.json").run == RUN
