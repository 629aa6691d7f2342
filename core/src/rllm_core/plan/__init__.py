"""``plan.toml``: the schema, loading with overrides, and resolution against installed plugins."""

from rllm_core.plan.load import apply_overrides, load_plan, parse_plan, read_plan_file
from rllm_core.plan.resolve import (
    ResolvedComponent,
    ResolvedPlan,
    resolve_plan,
    resolve_plan_file,
)
from rllm_core.plan.schema import COMPONENT_SECTIONS, ComponentRef, Plan

__all__ = [
    "COMPONENT_SECTIONS",
    "ComponentRef",
    "Plan",
    "ResolvedComponent",
    "ResolvedPlan",
    "apply_overrides",
    "load_plan",
    "parse_plan",
    "read_plan_file",
    "resolve_plan",
    "resolve_plan_file",
]
