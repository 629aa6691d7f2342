"""Hook specifications: the reference for plugin authors.

A plugin is a module named by an entry point in the ``rllm_core`` group::

    [project.entry-points.rllm_core]
    my_loss = "my_loss_pkg.plugin"

It implements hooks with the :data:`hookimpl` marker. Registry hooks yield frozen specs from
:mod:`rllm_core.plugins.specs`; every registry hook is called once per plugin when the plugin
manager first collects components, and the yielded specs are attributed to that plugin's
distribution. Lifecycle hooks are called for every registered plugin, in registration order;
their return values are ignored.

Lifecycle hooks fire in this order, interleaved with the plan's ``[[loggers]]``::

    rllm_run_start(run)
    for each step:
        rllm_step_start(run, step)
        ... rollouts, training, the metrics.jsonl line ...
        loggers: log_metrics(step, numbers)      rllm_step_end(run, step, metrics)
        loggers: log_event("checkpoint", ...)    when [run].save_every checkpoints it
    loggers: log_event("checkpoint", ...)        the last finished step, unless saved or crashed
    loggers: log_event("failure", ...)           when the run failed
    summary.json written; loggers: log_event("summary", summary); loggers closed
    rllm_run_end(run, status, error)

A resumed run also sends loggers ``log_event("resume", {"step", "checkpoint"})`` before
``rllm_run_start``. An implementation that raises is reported once (a warning naming its
plugin and the hook) and the run goes on; with ``RLLM_CORE_STRICT_PLUGINS=1`` the error ends
the run instead.

A plugin's module must import only ``rllm_core`` and the standard library at import time:
heavy dependencies load inside the factory, usually through :func:`~rllm_core.plugins.specs.lazy`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pluggy

from rllm_core.plugins.specs import (
    AdvantageEstimatorSpec,
    HarnessSpec,
    LoggerSpec,
    LossSpec,
    ObjectStoreSpec,
    RendererSpec,
    SampleBufferSpec,
    SamplerSpec,
    SandboxBackendSpec,
    TaskSourceSpec,
    TraceStoreSpec,
    TrainerBackendSpec,
)
from rllm_core.types import RunInfo, RunStatus

PROJECT_NAME = "rllm_core"
"""The pluggy project name, which is also the entry-point group."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# -------------------------------------------------------------------------------------------
# Registry hooks: one per component kind
# -------------------------------------------------------------------------------------------


@hookspec
def rllm_losses() -> Iterable[LossSpec]:
    """Yield the policy and auxiliary losses this plugin provides.

    A plan selects a policy loss with ``[algorithm].loss`` and stacks auxiliary losses
    (``role="auxiliary"``) with ``[algorithm].aux_losses``. The factory receives the validated
    config and returns a :class:`~rllm_core.ports.Loss`.

    Example::

        @hookimpl
        def rllm_losses():
            yield LossSpec(name="reinforce-baseline", factory=lazy("my_pkg.loss:Baseline"),
                           config=BaselineConfig, summary="REINFORCE with a moving baseline")
    """


@hookspec
def rllm_advantage_estimators() -> Iterable[AdvantageEstimatorSpec]:
    """Yield the advantage estimators this plugin provides.

    A plan selects one with ``[algorithm].advantage``. The factory returns an
    :class:`~rllm_core.ports.AdvantageEstimator`.

    Example::

        @hookimpl
        def rllm_advantage_estimators():
            yield AdvantageEstimatorSpec(name="grpo", factory=lazy("my_pkg.adv:GRPO"),
                                         config=GRPOConfig, summary="group mean/std baseline")
    """


@hookspec
def rllm_renderers() -> Iterable[RendererSpec]:
    """Yield the chat renderers this plugin provides.

    A plan selects one with ``[renderer].name``. The factory returns a
    :class:`~rllm_core.ports.Renderer`.

    Example::

        @hookimpl
        def rllm_renderers():
            yield RendererSpec(name="chatml", factory=lazy("my_pkg.chatml:ChatML"),
                               config=ChatMLConfig, summary="ChatML templates")
    """


@hookspec
def rllm_sandbox_backends() -> Iterable[SandboxBackendSpec]:
    """Yield the sandbox backends this plugin provides.

    A plan selects one with ``[sandbox].name``. The factory returns a
    :class:`~rllm_core.ports.SandboxBackend`.

    Example::

        @hookimpl
        def rllm_sandbox_backends():
            yield SandboxBackendSpec(name="local", factory=lazy("my_pkg.local:LocalBackend"),
                                     config=LocalConfig, summary="bubblewrap sandboxes")
    """


@hookspec
def rllm_trainer_backends() -> Iterable[TrainerBackendSpec]:
    """Yield the trainer backends this plugin provides.

    A plan selects one with ``[trainer].name``. The factory returns a
    :class:`~rllm_core.ports.TrainerBackend`.

    Example::

        @hookimpl
        def rllm_trainer_backends():
            yield TrainerBackendSpec(name="torch", factory=lazy("my_pkg.backend:TorchBackend"),
                                     config=TorchConfig, summary="local transformers model")
    """


@hookspec
def rllm_harnesses() -> Iterable[HarnessSpec]:
    """Yield the harnesses (agent loops) this plugin provides.

    A plan selects one with ``[harness].name``. The factory returns a
    :class:`~rllm_core.ports.Harness`.

    Example::

        @hookimpl
        def rllm_harnesses():
            yield HarnessSpec(name="shell", factory=lazy("my_pkg.shell:ShellAgent"),
                              config=ShellConfig, summary="one shell command per turn")
    """


@hookspec
def rllm_task_sources() -> Iterable[TaskSourceSpec]:
    """Yield the task sources this plugin provides.

    A plan selects one with ``[tasks].name``. The factory returns a
    :class:`~rllm_core.ports.TaskSource`.

    Example::

        @hookimpl
        def rllm_task_sources():
            yield TaskSourceSpec(name="jsonl", factory=lazy("my_pkg.jsonl:JsonlTasks"),
                                 config=JsonlConfig, summary="question/answer JSONL files")
    """


@hookspec
def rllm_trace_stores() -> Iterable[TraceStoreSpec]:
    """Yield the trace stores this plugin provides.

    A plan selects one with ``[trace_store].name``. The factory returns a
    :class:`~rllm_core.ports.TraceStore`.

    Example::

        @hookimpl
        def rllm_trace_stores():
            yield TraceStoreSpec(name="deltachain", factory=lazy("my_pkg.store:DeltaChain"),
                                 config=DeltaChainConfig, summary="delta-chain segment files")
    """


@hookspec
def rllm_sample_buffers() -> Iterable[SampleBufferSpec]:
    """Yield the sample buffers this plugin provides.

    A plan selects one with ``[sample_buffer].name``. The factory returns a
    :class:`~rllm_core.ports.SampleBuffer`.

    Example::

        @hookimpl
        def rllm_sample_buffers():
            yield SampleBufferSpec(name="file", factory=lazy("my_pkg.buffer:FileBuffer"),
                                   config=FileBufferConfig, summary="fsynced append-only log")
    """


@hookspec
def rllm_object_stores() -> Iterable[ObjectStoreSpec]:
    """Yield the object stores this plugin provides.

    A plan selects one with ``[object_store].name``. The factory returns an
    :class:`~rllm_core.ports.ObjectStore`.

    Example::

        @hookimpl
        def rllm_object_stores():
            yield ObjectStoreSpec(name="file", factory=lazy("my_pkg.objects:FileStore"),
                                  config=FileStoreConfig, summary="objects in a directory")
    """


@hookspec
def rllm_loggers() -> Iterable[LoggerSpec]:
    """Yield the metrics loggers this plugin provides.

    A plan enables loggers with ``[[loggers]]`` entries. The factory returns a
    :class:`~rllm_core.ports.Logger`.

    Example::

        @hookimpl
        def rllm_loggers():
            yield LoggerSpec(name="jsonl", factory=lazy("my_pkg.log:JsonlLogger"),
                             config=JsonlLoggerConfig, summary="one JSON line per step")
    """


@hookspec
def rllm_samplers() -> Iterable[SamplerSpec]:
    """Yield the samplers this plugin provides: inference servers reached over the network.

    ``rllm-core gateway serve`` selects one (``--upstream URL`` builds ``sampler:vllm`` with
    ``{"urls": [...]}``); a training run samples from its trainer backend instead. The factory
    returns a :class:`~rllm_core.ports.Sampler`, usually also a
    :class:`~rllm_core.ports.WorkerPool` so that the gateway can report and close it.

    Example::

        @hookimpl
        def rllm_samplers():
            yield SamplerSpec(name="vllm", factory=lazy("my_pkg.pool:from_config"),
                              config=VllmConfig, summary="vLLM servers over HTTP")
    """


# -------------------------------------------------------------------------------------------
# Lifecycle hooks: observe a run
# -------------------------------------------------------------------------------------------


@hookspec
def rllm_run_start(run: RunInfo) -> None:
    """Called once per run, before its first step: the plan is resolved, the components are
    built, a resumed run has loaded its checkpoint, and the gateway is up.

    ``run`` is the :class:`~rllm_core.types.RunInfo` every later hook of the run receives:
    ``run_id`` (the run folder's name), ``name`` (``[run].name``), ``output_dir`` (the run
    folder), ``plan`` (the resolved plan, as in ``plan.resolved.json``) and ``started_at``
    (Unix time). A run that cannot start (``--resume`` without a checkpoint, the gateway port
    taken) fires no hook at all.

    Example::

        @hookimpl
        def rllm_run_start(run):
            print(f"run {run.name} writes to {run.output_dir}")
    """


@hookspec
def rllm_step_start(run: RunInfo, step: int) -> None:
    """Called at the start of each step, before its rollouts (``step`` counts from 1 and
    continues on resume: a run resumed from step 4 starts with step 5).

    A step that does not finish (stopped by a signal during its rollouts, failed on too many
    excluded rollouts, crashed) gets no ``rllm_step_end``; ``rllm_run_end`` follows.

    Example::

        @hookimpl
        def rllm_step_start(run, step):
            timer.start(step)
    """


@hookspec
def rllm_step_end(run: RunInfo, step: int, metrics: Mapping[str, float]) -> None:
    """Called once a step has trained and its ``metrics.jsonl`` line is written, after the
    ``[[loggers]]`` received that line, and before the step's checkpoint (if it has one).

    ``metrics`` is a copy of that line: ``step`` and every metric of the step, all numbers
    (the keys are listed in ``docs/running.md``).

    Example::

        @hookimpl
        def rllm_step_end(run, step, metrics):
            if metrics.get("reward/mean", 0.0) > 0.9:
                notify(f"{run.name} reached 0.9 at step {step}")
    """


@hookspec
def rllm_run_end(run: RunInfo, status: RunStatus, error: BaseException | None) -> None:
    """Called exactly once for every run that fired ``rllm_run_start``, on every way out,
    after ``summary.json`` is written and the ``[[loggers]]`` are closed.

    ``status`` is ``COMPLETED`` (every step ran; ``error`` is None), ``INTERRUPTED`` (stopped
    by SIGINT/SIGTERM, the last finished step checkpointed; ``error`` is None) or ``FAILED``
    (``error`` is the exception: :class:`~rllm_core.rollout.TooManyFailedRollouts` when a
    step's rollouts failed, or whatever a component raised; the run then exits with code 1).

    Example::

        @hookimpl
        def rllm_run_end(run, status, error):
            upload(run.output_dir) if status is RunStatus.COMPLETED else None
    """
