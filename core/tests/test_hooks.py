"""One test per hook, named after it (a docs test checks that every hook has one)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict
from reference.hook_recorder import Recorder
from rllm_core import (
    ComponentSpec,
    hookimpl,
)
from rllm_core.plugins import Kind, PluginManager
from rllm_core.types import RunInfo, RunStatus


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = 1


def provide(register_plugin, kind: Kind, name: str = "thing"):
    """Register a plugin whose registry hook for ``kind`` yields one spec."""

    def impl():
        yield ComponentSpec(
            kind=kind,
            name=name,
            factory=lambda config: ("built", name, config.size),
            config=Config,
            summary=f"a {kind.label}",
        )

    impl.__name__ = kind.hook_name
    plugin = type("Plugin", (), {kind.hook_name: staticmethod(hookimpl(impl))})
    return register_plugin(plugin, name=f"provides-{kind.hook_name}")


def check_registry_hook(plugin_manager, register_plugin, kind: str):
    kind = Kind(kind)
    record = provide(register_plugin, kind)
    assert record.components == [f"{kind.value}:thing"]
    spec = plugin_manager.get(kind, "thing")
    assert spec.kind is kind
    assert spec.build({"size": 4}) == ("built", "thing", 4)
    assert plugin_manager.names(kind) == ["thing"]


def test_rllm_losses(plugin_manager, register_plugin):
    check_registry_hook(plugin_manager, register_plugin, "loss")


def test_rllm_advantage_estimators(plugin_manager, register_plugin):
    check_registry_hook(plugin_manager, register_plugin, "advantage_estimator")


def test_rllm_renderers(plugin_manager, register_plugin):
    check_registry_hook(plugin_manager, register_plugin, "renderer")


def test_rllm_sandbox_backends(plugin_manager, register_plugin):
    check_registry_hook(plugin_manager, register_plugin, "sandbox_backend")


def test_rllm_trainer_backends(plugin_manager, register_plugin):
    check_registry_hook(plugin_manager, register_plugin, "trainer_backend")


def test_rllm_harnesses(plugin_manager, register_plugin):
    check_registry_hook(plugin_manager, register_plugin, "harness")


def test_rllm_task_sources(plugin_manager, register_plugin):
    check_registry_hook(plugin_manager, register_plugin, "task_source")


def test_rllm_trace_stores(plugin_manager, register_plugin):
    check_registry_hook(plugin_manager, register_plugin, "trace_store")


def test_rllm_sample_buffers(plugin_manager, register_plugin):
    check_registry_hook(plugin_manager, register_plugin, "sample_buffer")


def test_rllm_object_stores(plugin_manager, register_plugin):
    check_registry_hook(plugin_manager, register_plugin, "object_store")


def test_rllm_loggers(plugin_manager, register_plugin):
    check_registry_hook(plugin_manager, register_plugin, "logger")


def test_rllm_samplers(plugin_manager, register_plugin):
    check_registry_hook(plugin_manager, register_plugin, "sampler")


def test_rllm_trainer_launchers(plugin_manager, register_plugin):
    check_registry_hook(plugin_manager, register_plugin, "trainer_launcher")


RUN = RunInfo(run_id="r1", name="demo", output_dir="runs/demo-1")


class Failing:
    @hookimpl
    def rllm_step_end(self, run, step, metrics):
        raise RuntimeError("observer failed")


def test_rllm_run_start(plugin_manager, register_plugin):
    recorder = Recorder()
    register_plugin(recorder, name="recorder")
    plugin_manager.notify_run_start(RUN)
    assert recorder.calls == [("run_start", RUN)]


def test_rllm_step_start(plugin_manager, register_plugin):
    recorder = Recorder()
    register_plugin(recorder, name="recorder")
    plugin_manager.notify_step_start(RUN, 3)
    assert recorder.calls == [("step_start", 3)]


def test_rllm_step_end(plugin_manager, register_plugin, caplog):
    first, last = Recorder(), Recorder()
    register_plugin(first, name="first")
    register_plugin(Failing(), name="failing", distribution="rllm-bad-observer")
    register_plugin(last, name="last")
    plugin_manager.strict = False
    plugin_manager.notify_step_end(RUN, 2, {"reward/mean": 0.5})
    assert first.calls == last.calls == [("step_end", 2, {"reward/mean": 0.5})]
    assert "rllm-bad-observer 0+test: rllm_step_end raised RuntimeError: observer failed" in (
        caplog.text
    )
    plugin_manager.strict = True
    with pytest.raises(RuntimeError, match="observer failed"):
        plugin_manager.notify_step_end(RUN, 3, {})


def test_rllm_run_end(plugin_manager, register_plugin):
    recorder = Recorder()
    register_plugin(recorder, name="recorder")
    error = ValueError("x")
    plugin_manager.notify_run_end(RUN, RunStatus.FAILED, error)
    plugin_manager.notify_run_end(RUN, RunStatus.COMPLETED)
    assert recorder.calls == [
        ("run_end", RunStatus.FAILED, error),
        ("run_end", RunStatus.COMPLETED, None),
    ]


def test_lifecycle_hooks_run_in_registration_order(plugin_manager, register_plugin):
    order = []

    class Named:
        def __init__(self, name):
            self.name = name

        @hookimpl
        def rllm_run_start(self, run):
            order.append(self.name)

    for name in ("a", "b", "c"):
        register_plugin(Named(name), name=name)
    plugin_manager.notify_run_start(RUN)
    assert order == ["a", "b", "c"]


def test_every_kind_has_a_registry_hook():
    from rllm_core.plugins import hookspecs

    assert sorted(k.hook_name for k in Kind) == sorted(
        name
        for name in dir(hookspecs)
        if name.startswith("rllm_") and name.endswith("s") and name not in ("rllm_step_starts",)
    )
    assert isinstance(PluginManager(load_entry_points=False), PluginManager)
