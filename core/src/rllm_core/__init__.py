"""rllm-core: reinforcement-learning post-training for LLM agents.

The public API for plugin authors is re-exported here: ``hookimpl``, the spec classes,
``lazy``, ``NoConfig`` and ``PlanPath`` (marks a config key that holds a path). Contracts live
in :mod:`rllm_core.ports`, shared records in :mod:`rllm_core.types`.
"""

from importlib.metadata import PackageNotFoundError, version

from rllm_core.plugins import (
    AdvantageEstimatorSpec,
    HarnessSpec,
    LoggerSpec,
    LossSpec,
    NoConfig,
    ObjectStoreSpec,
    PlanPath,
    RendererSpec,
    SampleBufferSpec,
    SamplerSpec,
    SandboxBackendSpec,
    TaskSourceSpec,
    TraceStoreSpec,
    TrainerBackendSpec,
    hookimpl,
    lazy,
)

try:
    __version__ = version("rllm-core")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0+unknown"

__all__ = [
    "AdvantageEstimatorSpec",
    "HarnessSpec",
    "LoggerSpec",
    "LossSpec",
    "NoConfig",
    "ObjectStoreSpec",
    "PlanPath",
    "RendererSpec",
    "SampleBufferSpec",
    "SamplerSpec",
    "SandboxBackendSpec",
    "TaskSourceSpec",
    "TraceStoreSpec",
    "TrainerBackendSpec",
    "__version__",
    "hookimpl",
    "lazy",
]
