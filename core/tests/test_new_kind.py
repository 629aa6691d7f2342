"""A new component kind takes three places: its port, its registry hookspec and, for plans that
select it, its plan section. This test adds one, ``widget``, in a fixture and checks that the
plugin manager, ``rllm-core plugins`` and plan resolution handle it with nothing else changed.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Iterator
from typing import Protocol, runtime_checkable

import pytest
from click.testing import CliRunner
from rllm_core import ComponentSpec, hookimpl
from rllm_core.plan.resolve import resolve_plan
from rllm_core.plan.schema import ComponentRef, Plan, component_section, component_sections
from rllm_core.plugins import Kind, PluginManager, component_hookspec
from rllm_core.plugins import manager as manager_module


@runtime_checkable
class Widget(Protocol):
    """1. The port: what a widget does."""

    def turn(self) -> int: ...


class WidgetPlan(Plan):
    """3. The plan section that selects a widget."""

    widget: ComponentRef | None = component_section("widget", "Widget.")


class Gear:
    def __init__(self, config: object) -> None:
        self.config = config

    def turn(self) -> int:
        return 3


class GearPlugin:
    @hookimpl
    def rllm_widgets(self) -> Iterator[ComponentSpec]:
        yield ComponentSpec(kind="widget", name="gear", factory=Gear, summary="turns three times")


@pytest.fixture
def widget_manager() -> Iterator[PluginManager]:
    """2. The registry hookspec, declared in a module of its own."""
    module = types.ModuleType("widget_hookspecs")

    @component_hookspec("widget", port=Widget)
    def rllm_widgets() -> Iterable[ComponentSpec]:
        """Yield the widgets this plugin provides."""

    module.rllm_widgets = rllm_widgets
    try:
        manager = PluginManager(load_entry_points=False, strict=True, hookspecs_modules=[module])
        manager.register(GearPlugin(), name="gears", distribution="rllm-widget-gears")
        previous = manager_module._DEFAULT
        manager_module._DEFAULT = manager
        yield manager
        manager_module._DEFAULT = previous
    finally:
        Kind.forget("widget")


def test_the_manager_finds_and_builds_the_new_kind(widget_manager):
    assert Kind.WIDGET is Kind("widget") and Kind.WIDGET.port is Widget
    assert Kind.WIDGET.hook_name == "rllm_widgets"
    assert widget_manager.names("widget") == ["gear"]
    widget = widget_manager.get("widget", "gear").build()
    assert isinstance(widget, Widget) and widget.turn() == 3
    (record,) = widget_manager.plugins()
    assert record.components == ["widget:gear"]


def test_rllm_core_plugins_lists_it(widget_manager):
    from rllm_core.cli import main

    result = CliRunner().invoke(main, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    assert '"widget:gear"' in result.output


def test_a_plan_section_selects_it(widget_manager):
    assert component_sections(WidgetPlan)["widget"] is Kind.WIDGET
    resolved = resolve_plan(WidgetPlan(widget={"name": "gear"}), manager=widget_manager)
    assert resolved.get("[widget]").spec.key == "widget:gear"


def test_a_spec_of_another_kind_in_its_hook_is_refused(widget_manager):
    class Confused:
        @hookimpl
        def rllm_widgets(self) -> Iterator[ComponentSpec]:
            yield ComponentSpec(kind="loss", name="gear2", factory=Gear, summary="s")

    widget_manager.strict = False
    widget_manager.register(Confused(), name="confused", distribution="rllm-confused")
    record = {r.name: r for r in widget_manager.plugins()}["confused"]
    assert record.status.value == "error"
    assert "rllm_widgets() yielded a loss spec, expected a ComponentSpec of kind 'widget'" in (
        record.error or ""
    )
