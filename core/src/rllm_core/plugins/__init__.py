"""The plugin system: hook specifications, specs and the manager."""

from rllm_core.plugins.hookspecs import component_hookspec, hookimpl, hookspec
from rllm_core.plugins.manager import (
    ComponentRecord,
    PluginManager,
    PluginRecord,
    PluginStatus,
    get_plugin_manager,
    reset_plugin_manager,
)
from rllm_core.plugins.specs import (
    ComponentSpec,
    Credential,
    Kind,
    NoConfig,
    PlanPath,
    Trait,
    lazy,
)

__all__ = [
    "ComponentRecord",
    "ComponentSpec",
    "Credential",
    "Kind",
    "NoConfig",
    "PlanPath",
    "PluginManager",
    "PluginRecord",
    "PluginStatus",
    "Trait",
    "component_hookspec",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "lazy",
    "reset_plugin_manager",
]
