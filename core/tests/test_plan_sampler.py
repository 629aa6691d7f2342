"""A ``[sampler]`` section: refused by plan check without a trainer that exports weights, checked
at build to follow the policy, and kept on it by PolicySync."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from rllm_core import ComponentSpec, hookimpl
from rllm_core.errors import PlanError, UpstreamError
from rllm_core.ports import PolicyFollower
from rllm_core.rollout.policy_sync import PolicySync
from rllm_core.run.components import BuildError, build_components
from rllm_core.types import ExportedWeights, SampleRequest, SampleResult


class Exporter:
    """A trainer whose weights are one number, exported as a file in the folder."""

    def __init__(self, config: Any = None) -> None:
        self.weight_version = 0
        self.exports: list[str] = []

    def sampler(self) -> Any:
        raise AssertionError("a run with [sampler] never builds the trainer's own sampler")

    def export_weights(self, path: str) -> ExportedWeights:
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "weights.txt").write_text(str(self.weight_version))
        self.exports.append(path)
        return ExportedWeights(
            path=path, version=self.weight_version, kind="lora", base_model="base", lora_rank=2
        )


class NoExport:
    def __init__(self, config: Any = None) -> None:
        self.weight_version = 0


class Follower:
    """A sampler that records the weights it was given, refusing them ``fail`` times first."""

    root = Path(".")

    def __init__(self, config: Any = None, *, fail: int = 0) -> None:
        self.loaded: list[ExportedWeights] = []
        self.fail = fail

    def export_path(self, version: int) -> str:
        return str(self.root / f"v{version}")

    async def update_weights(self, exported: ExportedWeights) -> None:
        if self.fail:
            self.fail -= 1
            raise UpstreamError(f"http://server-1: reload of {exported.path} answered 500")
        assert (Path(exported.path) / "weights.txt").read_text() == str(exported.version)
        self.loaded.append(exported)

    async def sample(self, request: SampleRequest) -> SampleResult:
        raise NotImplementedError


class PlainSampler:
    def __init__(self, config: Any = None) -> None:
        pass

    async def sample(self, request: SampleRequest) -> SampleResult:
        raise NotImplementedError


class Parts:
    @hookimpl
    def rllm_trainer_backends(self):
        yield ComponentSpec(
            kind="trainer_backend",
            name="exporting",
            factory=Exporter,
            summary="exports weights",
            traits={"exports_weights": True},
        )
        yield ComponentSpec(
            kind="trainer_backend", name="hosted", factory=NoExport, summary="cannot export"
        )
        yield ComponentSpec(
            kind="trainer_backend",
            name="boasting",
            factory=NoExport,
            summary="declares the trait without the method",
            traits={"exports_weights": True},
        )

    @hookimpl
    def rllm_samplers(self):
        yield ComponentSpec(kind="sampler", name="servers", factory=Follower, summary="follows")
        yield ComponentSpec(kind="sampler", name="fixed", factory=PlainSampler, summary="fixed")

    @hookimpl
    def rllm_renderers(self):
        yield ComponentSpec(kind="renderer", name="r", factory=dict, summary="renderer")

    @hookimpl
    def rllm_harnesses(self):
        yield ComponentSpec(kind="harness", name="h", factory=dict, summary="harness")

    @hookimpl
    def rllm_task_sources(self):
        yield ComponentSpec(kind="task_source", name="t", factory=dict, summary="tasks")

    @hookimpl
    def rllm_trace_stores(self):
        yield ComponentSpec(kind="trace_store", name="s", factory=dict, summary="store")


@pytest.fixture
def parts(register_plugin):
    return register_plugin(Parts(), name="parts", distribution="rllm-test-sampler-parts")


def plan(trainer: str, sampler: str | None = "servers") -> dict[str, Any]:
    data: dict[str, Any] = {
        "trainer": trainer,
        "renderer": "r",
        "harness": "h",
        "tasks": "t",
        "trace_store": "s",
    }
    if sampler is not None:
        data["sampler"] = sampler
    return data


def test_plan_check_refuses_a_sampler_with_a_trainer_that_cannot_export_naming_both(
    plan_builder, parts
):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(plan("hosted"))
    (only,) = info.value.issues
    assert only.location == "[sampler].name"
    text = str(only)
    assert (
        "sampler 'servers' needs weights exported by the trainer; trainer backend 'hosted'"
        " cannot export them" in text
    )
    assert "remove [sampler]" in text


def test_plan_check_accepts_a_sampler_with_a_trainer_that_exports(plan_builder, parts):
    resolved = plan_builder.resolve(plan("exporting"))
    assert resolved.get("[sampler]").name == "servers"
    # Without [sampler] any trainer is fine: the rollouts use its own sampler.
    assert plan_builder.resolve(plan("hosted", sampler=None)).get("[sampler]") is None


def test_the_built_sampler_is_the_components_sampler(plan_builder, parts):
    components = build_components(plan_builder.resolve(plan("exporting")), training=False)
    assert isinstance(components.sampler, Follower)
    assert isinstance(components.sampler, PolicyFollower)
    assert (
        build_components(plan_builder.resolve(plan("exporting", None)), training=False).sampler
        is None
    )


def test_a_sampler_that_does_not_follow_the_policy_is_refused_at_build(plan_builder, parts):
    with pytest.raises(BuildError) as info:
        build_components(plan_builder.resolve(plan("exporting", "fixed")), training=False)
    text = str(info.value)
    assert "[sampler]: sampler 'fixed' cannot be kept on the trainer's policy" in text
    assert "PolicyFollower" in text


def test_a_trainer_without_export_weights_is_refused_at_build_naming_both(plan_builder, parts):
    with pytest.raises(BuildError) as info:
        build_components(plan_builder.resolve(plan("boasting")), training=False)
    assert (
        "sampler 'servers' needs weights exported by the trainer; trainer backend 'boasting'"
        " cannot export them" in str(info.value)
    )


def test_policy_sync_exports_each_version_once_and_keeps_the_last_two(tmp_path):
    trainer = Exporter()
    sampler = Follower()
    sampler.root = tmp_path
    sync = PolicySync(trainer, sampler)

    async def scenario() -> None:
        await sync.sync()
        await sync.sync()  # the same version: nothing to do
        for _ in range(3):
            trainer.weight_version += 1
            await sync.sync()

    asyncio.run(scenario())
    assert [w.version for w in sampler.loaded] == [0, 1, 2, 3]
    assert trainer.exports == [str(tmp_path / f"v{v}") for v in range(4)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2", "v3"]
    assert sync.served == sampler.loaded[-1]


def test_policy_sync_runs_exports_through_the_given_call_and_raises_the_samplers_error(tmp_path):
    trainer = Exporter()
    sampler = Follower(fail=1)
    sampler.root = tmp_path
    calls: list[str] = []

    async def on_trainer_thread(call):
        calls.append("trainer")
        return await asyncio.to_thread(call)

    sync = PolicySync(trainer, sampler, call=on_trainer_thread)
    with pytest.raises(UpstreamError, match="http://server-1"):
        asyncio.run(sync.sync())
    assert sync.served is None
    assert calls == ["trainer"]
    asyncio.run(sync.sync())  # the sampler recovered: the same version is tried again
    assert [w.version for w in sampler.loaded] == [0]
