"""The contracts every plugin kind implements.

Each Protocol's docstring is the reference for its kind; the conformance suites in
:mod:`rllm_core.testing` check them.
"""

from rllm_core.ports.agents import Harness, TaskSource
from rllm_core.ports.loggers import Logger
from rllm_core.ports.losses import (
    NATIVE_KERNELS,
    AdvantageEstimator,
    AdvantageResult,
    Aggregate,
    Loss,
    LossContext,
    LossOutput,
    NativeLoss,
    TokenAdvantages,
)
from rllm_core.ports.rendering import Renderer, StreamsToolCalls, ToolCallStream
from rllm_core.ports.sandboxes import BuildsDockerfiles, EndsProcesses, Sandbox, SandboxBackend
from rllm_core.ports.scheduling import (
    NodeConverter,
    StopTrigger,
    TrainerJob,
    TrainerLauncher,
    TrainerLifecycle,
    TrainerReattach,
)
from rllm_core.ports.storage import ObjectStore, SampleBuffer, TraceStore
from rllm_core.ports.training import (
    BusyClock,
    DrainablePool,
    Interruptible,
    LogprobScorer,
    LossRouting,
    NumericsReport,
    ParallelSettings,
    ParallelTrainer,
    PolicyFollower,
    ReferenceScorer,
    Sampler,
    SharedPool,
    StreamingSampler,
    SupervisedTrainer,
    SyncCounters,
    TrainerBackend,
    WeightExporter,
    WeightReleaser,
    WorkerPool,
)

__all__ = [
    "AdvantageEstimator",
    "AdvantageResult",
    "Aggregate",
    "BuildsDockerfiles",
    "BusyClock",
    "DrainablePool",
    "EndsProcesses",
    "Harness",
    "Interruptible",
    "Logger",
    "LogprobScorer",
    "ReferenceScorer",
    "Loss",
    "LossContext",
    "LossOutput",
    "NATIVE_KERNELS",
    "NativeLoss",
    "LossRouting",
    "NodeConverter",
    "NumericsReport",
    "ObjectStore",
    "ParallelSettings",
    "ParallelTrainer",
    "PolicyFollower",
    "Renderer",
    "StreamsToolCalls",
    "SyncCounters",
    "TokenAdvantages",
    "ToolCallStream",
    "SampleBuffer",
    "Sampler",
    "SharedPool",
    "Sandbox",
    "SandboxBackend",
    "StopTrigger",
    "TrainerJob",
    "TrainerLauncher",
    "StreamingSampler",
    "SupervisedTrainer",
    "TaskSource",
    "TraceStore",
    "TrainerBackend",
    "TrainerLifecycle",
    "TrainerReattach",
    "WeightExporter",
    "WeightReleaser",
    "WorkerPool",
]
