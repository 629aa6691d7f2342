"""The plugin system: hook specifications, specs and the manager."""

from rllm_core.plugins.hookspecs import hookimpl, hookspec
from rllm_core.plugins.manager import (
    ComponentRecord,
    PluginManager,
    PluginRecord,
    PluginStatus,
    get_plugin_manager,
    reset_plugin_manager,
)
from rllm_core.plugins.specs import (
    AdvantageEstimatorSpec,
    ComponentSpec,
    HarnessSpec,
    Kind,
    LoggerSpec,
    LossSpec,
    NoConfig,
    ObjectStoreSpec,
    RendererSpec,
    SampleBufferSpec,
    SandboxBackendSpec,
    TaskSourceSpec,
    TraceStoreSpec,
    TrainerBackendSpec,
    lazy,
)

__all__ = [
    "AdvantageEstimatorSpec",
    "ComponentRecord",
    "ComponentSpec",
    "HarnessSpec",
    "Kind",
    "LoggerSpec",
    "LossSpec",
    "NoConfig",
    "ObjectStoreSpec",
    "PluginManager",
    "PluginRecord",
    "PluginStatus",
    "RendererSpec",
    "SampleBufferSpec",
    "SandboxBackendSpec",
    "TaskSourceSpec",
    "TraceStoreSpec",
    "TrainerBackendSpec",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "lazy",
    "reset_plugin_manager",
]
