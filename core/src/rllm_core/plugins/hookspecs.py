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

Keys the run fills: a run writes some keys of a component's config itself (a store's
``path`` inside the run folder, a sampler's ``weights_dir``, a renderer's ``tokenizer``, a
trainer's ``seed``, ``deterministic``, ``logprob_temperature`` and ``total_steps``; the table
is :data:`rllm_core.plugins.run_keys.RUN_KEYS`), but only those its spec lists in the trait
``run_keys``, each a field of its config::

    yield ComponentSpec(kind="trace_store", name="mine", factory=..., config=MineConfig,
                        summary="...", traits={"run_keys": ("path",)})

A key the plan sets is left as written, except ``deterministic`` and
``logprob_temperature``, which follow ``[run]`` and ``[sampling]`` (with a note).

A plugin's module must import only ``rllm_core`` and the standard library at import time:
heavy dependencies load inside the factory, usually through :func:`~rllm_core.plugins.specs.lazy`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import pluggy

from rllm_core.plugins.run_keys import RUN_KEYS, run_key_choices
from rllm_core.plugins.specs import ComponentSpec, Kind, Trait
from rllm_core.ports import (
    NATIVE_KERNELS,
    AdvantageEstimator,
    Harness,
    Logger,
    Loss,
    ObjectStore,
    Renderer,
    SampleBuffer,
    Sampler,
    SandboxBackend,
    TaskSource,
    TraceStore,
    TrainerBackend,
    TrainerLauncher,
)
from rllm_core.types import RunInfo, RunStatus

PROJECT_NAME = "rllm_core"
"""The pluggy project name, which is also the entry-point group."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

F = TypeVar("F", bound=Callable[..., Any])


def component_hookspec(
    kind: str, *, port: type | None, traits: Mapping[str, Trait] | None = None
) -> Callable[[F], F]:
    """Declare a component kind by its registry hookspec.

    The decorated function's name is the hook a plugin implements; each spec it yields must be
    a :class:`~rllm_core.plugins.specs.ComponentSpec` of ``kind``. ``port`` is the Protocol
    the built component implements (the reference for its behaviour) and ``traits`` the
    kind's spec traits with their defaults. A kind the run writes config keys of
    (:data:`~rllm_core.plugins.run_keys.RUN_KEYS`) also gets the trait ``run_keys``: the keys
    of that table a spec accepts from the run, each a field of its config. Declaring a kind is
    all the plugin manager, ``rllm-core plugins`` and the hook reference need; a plan selects
    it once a plan section names the kind (:func:`rllm_core.plan.schema.component_section`).
    """

    def declare(function: F) -> F:
        declared = dict(traits or {})
        if kind in RUN_KEYS:
            declared["run_keys"] = Trait((), choices=run_key_choices(kind))
        Kind.declare(kind, hook_name=function.__name__, port=port, traits=declared)
        return hookspec(function)

    return declare


# -------------------------------------------------------------------------------------------
# Registry hooks: one per component kind
# -------------------------------------------------------------------------------------------


@component_hookspec(
    "loss",
    port=Loss,
    traits={"role": Trait("policy", choices=("policy", "auxiliary"))},
)
def rllm_losses() -> Iterable[ComponentSpec]:
    """Yield the policy and auxiliary losses this plugin provides.

    A plan selects a policy loss with ``[algorithm].loss`` and stacks auxiliary losses
    (``traits={"role": "auxiliary"}``) with ``[algorithm].aux_losses``. The factory receives
    the validated config and returns a :class:`~rllm_core.ports.Loss`.

    Example::

        @hookimpl
        def rllm_losses():
            yield ComponentSpec(
                kind="loss",
                name="reinforce-baseline",
                factory=lazy("my_pkg.loss:Baseline"),
                config=BaselineConfig,
                summary="REINFORCE with a moving baseline",
            )
    """


@component_hookspec(
    "advantage_estimator",
    port=AdvantageEstimator,
    traits={"teacher": Trait(False, choices=(True, False))},
)
def rllm_advantage_estimators() -> Iterable[ComponentSpec]:
    """Yield the advantage estimators this plugin provides.

    A plan selects one with ``[algorithm].advantage``. The factory returns an
    :class:`~rllm_core.ports.AdvantageEstimator`. The trait ``teacher`` (default False) says
    that the estimator distills a teacher: its config has the key ``teacher`` (a trainer
    backend's table, resolved and built as ``[algorithm].advantage.teacher``) and the
    estimator implements :class:`~rllm_core.ports.TokenAdvantages`.

    Example::

        @hookimpl
        def rllm_advantage_estimators():
            yield ComponentSpec(
                kind="advantage_estimator",
                name="grpo",
                factory=lazy("my_pkg.adv:GRPO"),
                config=GRPOConfig,
                summary="group mean/std baseline",
            )
    """


@component_hookspec("renderer", port=Renderer)
def rllm_renderers() -> Iterable[ComponentSpec]:
    """Yield the chat renderers this plugin provides.

    A plan selects one with ``[renderer].name``. The factory returns a
    :class:`~rllm_core.ports.Renderer`.

    Example::

        @hookimpl
        def rllm_renderers():
            yield ComponentSpec(
                kind="renderer",
                name="chatml",
                factory=lazy("my_pkg.chatml:ChatML"),
                config=ChatMLConfig,
                summary="ChatML templates",
            )
    """


@component_hookspec(
    "sandbox_backend",
    port=SandboxBackend,
    traits={"remote": Trait(False, choices=(True, False))},
)
def rllm_sandbox_backends() -> Iterable[ComponentSpec]:
    """Yield the sandbox backends this plugin provides.

    A plan selects one with ``[sandbox].name``. The factory returns a
    :class:`~rllm_core.ports.SandboxBackend`. The trait ``remote`` (default False) says that
    its sandboxes run on another machine, which cannot reach a gateway on this machine's
    loopback: ``plan check`` refuses a loopback ``[gateway].host`` when the harness's programs
    call the gateway from inside the sandbox (its config key ``network`` is ``"gateway"`` or
    ``"full"``). A backend that builds a spec's Dockerfile itself implements
    :class:`~rllm_core.ports.BuildsDockerfiles`: the rollout then hands it a task's
    Dockerfile and build context instead of the ``FROM`` image its task source would replay
    the Dockerfile on.

    Example::

        @hookimpl
        def rllm_sandbox_backends():
            yield ComponentSpec(
                kind="sandbox_backend",
                name="local",
                factory=lazy("my_pkg.local:LocalBackend"),
                config=LocalConfig,
                summary="bubblewrap sandboxes",
            )
    """


@component_hookspec(
    "trainer_backend",
    port=TrainerBackend,
    traits={
        "proximal_modes": Trait(("rollout",), choices=("rollout", "recompute")),
        "publishes_weights": Trait(False, choices=(True, False)),
        "exports_weights": Trait(False, choices=(True, False)),
        "packs_sequences": Trait(False, choices=(True, False)),
        "hosted_model": Trait(False, choices=(True, False)),
        "native_losses": Trait((), choices=NATIVE_KERNELS),
        "reference_kl": Trait((), choices=("loss", "reward")),
        "reference_kl_refusal": Trait(""),
        "entropy": Trait(False, choices=(True, False)),
        "entropy_refusal": Trait(""),
    },
)
def rllm_trainer_backends() -> Iterable[ComponentSpec]:
    """Yield the trainer backends this plugin provides.

    A plan selects one with ``[trainer].name``. The factory returns a
    :class:`~rllm_core.ports.TrainerBackend`. The trait ``proximal_modes`` lists the
    ``[algorithm].proximal`` choices the backend honours (``"rollout"`` always;
    ``"recompute"`` when it implements :class:`~rllm_core.ports.LogprobScorer`); ``plan
    check`` refuses any other choice, naming the backend. The trait ``publishes_weights``
    (default False) says that the backend's sampler may keep sampling while the trainer
    trains: every ``optim_step`` publishes the new version to the sampler, which switches
    between calls (a call in flight finishes on the version it started with and reports it).
    ``[run].pipeline = "async"`` needs it; ``plan check`` refuses async with a backend
    without it, naming the backend. The trait ``exports_weights`` (default False) says that the
    backend implements :class:`~rllm_core.ports.WeightExporter`, which a ``[sampler]`` section
    (model servers kept on the policy) needs; ``plan check`` refuses one with a backend
    without it, naming both. The trait ``packs_sequences`` (default False) says that the
    backend trains a datum whose ``metadata["packed_lengths"]`` (a list of lengths summing to
    its token count) splits it into examples exactly as if each were its own datum: positions
    restart and attention stops at every example's start, whose first token gets logprob 0;
    ``[sft].packing`` needs it. The trait ``hosted_model`` (default False) says that the
    backend's ``model`` key names a model its remote service hosts (``Qwen/Qwen3-8B`` as the
    service spells it), so nothing is resolved or loaded on this machine: the plan names the
    renderer's ``tokenizer`` itself. The trait ``native_losses`` (default empty) lists the
    server-side loss kernels the backend can train with in one fused pass instead of its
    custom-loss path (see :mod:`rllm_core.algorithms.native_losses`); such a backend implements
    :class:`~rllm_core.ports.LossRouting`, its config has the key ``loss_path``, and ``plan
    check`` refuses ``loss_path = "native"`` for a plan whose
    objective has no such kernel, with the reason. The trait ``reference_kl`` (default empty)
    lists the ``[algorithm.kl].in`` placements the backend honours (it implements
    :class:`~rllm_core.ports.ReferenceScorer`, and with ``"loss"`` passes
    ``LossInputs.ref_logprobs`` from the datums' ``ref_logprobs``); the trait ``entropy``
    (default False) says that it passes ``LossInputs.entropy`` when the objective
    ``needs_entropy``. ``plan check`` refuses ``[algorithm.kl] coef > 0`` and
    ``entropy_coef > 0`` elsewhere, quoting ``reference_kl_refusal`` / ``entropy_refusal``
    (a reason, default empty) when the backend gives one.

    Example::

        @hookimpl
        def rllm_trainer_backends():
            yield ComponentSpec(
                kind="trainer_backend",
                name="torch",
                factory=lazy("my_pkg.backend:TorchBackend"),
                config=TorchConfig,
                summary="local transformers model",
            )
    """


@component_hookspec("harness", port=Harness)
def rllm_harnesses() -> Iterable[ComponentSpec]:
    """Yield the harnesses (agent loops) this plugin provides.

    A plan selects one with ``[harness].name``. The factory returns a
    :class:`~rllm_core.ports.Harness`. A harness whose programs run inside the sandbox and
    call the gateway from there names the network they need in its config key ``network``
    (``"gateway"`` or ``"full"``), which its ``sandbox_network`` declares; ``plan check``
    reads the key to refuse a gateway a remote sandbox backend cannot reach.

    Example::

        @hookimpl
        def rllm_harnesses():
            yield ComponentSpec(
                kind="harness",
                name="shell",
                factory=lazy("my_pkg.shell:ShellAgent"),
                config=ShellConfig,
                summary="one shell command per turn",
            )
    """


@component_hookspec("task_source", port=TaskSource)
def rllm_task_sources() -> Iterable[ComponentSpec]:
    """Yield the task sources this plugin provides.

    A plan selects one with ``[tasks].name``. The factory returns a
    :class:`~rllm_core.ports.TaskSource`.

    Example::

        @hookimpl
        def rllm_task_sources():
            yield ComponentSpec(
                kind="task_source",
                name="jsonl",
                factory=lazy("my_pkg.jsonl:JsonlTasks"),
                config=JsonlConfig,
                summary="question/answer JSONL files",
            )
    """


@component_hookspec("trace_store", port=TraceStore)
def rllm_trace_stores() -> Iterable[ComponentSpec]:
    """Yield the trace stores this plugin provides.

    A plan selects one with ``[trace_store].name``. The factory returns a
    :class:`~rllm_core.ports.TraceStore`.

    Example::

        @hookimpl
        def rllm_trace_stores():
            yield ComponentSpec(
                kind="trace_store",
                name="deltachain",
                factory=lazy("my_pkg.store:DeltaChain"),
                config=DeltaChainConfig,
                summary="delta-chain segment files",
            )
    """


@component_hookspec("sample_buffer", port=SampleBuffer)
def rllm_sample_buffers() -> Iterable[ComponentSpec]:
    """Yield the sample buffers this plugin provides.

    A plan selects one with ``[sample_buffer].name``. The factory returns a
    :class:`~rllm_core.ports.SampleBuffer`.

    Example::

        @hookimpl
        def rllm_sample_buffers():
            yield ComponentSpec(
                kind="sample_buffer",
                name="file",
                factory=lazy("my_pkg.buffer:FileBuffer"),
                config=FileBufferConfig,
                summary="fsynced append-only log",
            )
    """


@component_hookspec("object_store", port=ObjectStore)
def rllm_object_stores() -> Iterable[ComponentSpec]:
    """Yield the object stores this plugin provides.

    A plan selects one with ``[object_store].name``. The factory returns an
    :class:`~rllm_core.ports.ObjectStore`.

    Example::

        @hookimpl
        def rllm_object_stores():
            yield ComponentSpec(
                kind="object_store",
                name="file",
                factory=lazy("my_pkg.objects:FileStore"),
                config=FileStoreConfig,
                summary="objects in a directory",
            )
    """


@component_hookspec("logger", port=Logger)
def rllm_loggers() -> Iterable[ComponentSpec]:
    """Yield the metrics loggers this plugin provides.

    A plan enables loggers with ``[[loggers]]`` entries. The factory returns a
    :class:`~rllm_core.ports.Logger`.

    Example::

        @hookimpl
        def rllm_loggers():
            yield ComponentSpec(
                kind="logger",
                name="jsonl",
                factory=lazy("my_pkg.log:JsonlLogger"),
                config=JsonlLoggerConfig,
                summary="one JSON line per step",
            )
    """


@component_hookspec("sampler", port=Sampler, traits={"shared": Trait(False, choices=(True, False))})
def rllm_samplers() -> Iterable[ComponentSpec]:
    """Yield the samplers this plugin provides: inference servers reached over the network.

    ``rllm-core gateway serve`` selects one (``--upstream URL`` builds ``sampler:vllm`` with
    ``{"urls": [...]}``); ``rllm-core run`` and ``rllm-core eval`` sample from the plan's
    ``[sampler]`` when it has one, and from the trainer backend's own sampler otherwise. The
    factory returns a :class:`~rllm_core.ports.Sampler`, usually also a
    :class:`~rllm_core.ports.WorkerPool` so that the gateway can report and close it; a
    ``[sampler]`` must also be a :class:`~rllm_core.ports.PolicyFollower`, which the run keeps
    on the trainer's weights (a build error otherwise).

    Trait ``shared`` (default ``False``): the sampler is a :class:`~rllm_core.ports.SharedPool`,
    so gateway processes other than the run's can send to its servers; a plan may then set
    ``[gateway].workers`` above 1 (``plan check`` refuses it for a sampler without the trait).

    Example::

        @hookimpl
        def rllm_samplers():
            yield ComponentSpec(
                kind="sampler",
                name="vllm",
                factory=lazy("my_pkg.pool:from_config"),
                config=VllmConfig,
                summary="vLLM servers over HTTP",
            )
    """


@component_hookspec(
    "trainer_launcher",
    port=TrainerLauncher,
    traits={"places_on_nodes": Trait(False, choices=(True, False))},
)
def rllm_trainer_launchers() -> Iterable[ComponentSpec]:
    """Yield the trainer launchers this plugin provides: ways to start each trainer
    incarnation as a job of its own (the trainer on its own island, see
    :mod:`rllm_core.training.island`).

    A plan selects one with ``[scheduler].launcher``, by name (``launcher = "modal"``) or as
    a table with ``name`` and the launcher's keys (``launcher = { name = "modal", image =
    "...", gpu = "A100" }``); ``"in-process"`` and ``"local-process"`` are built in and name
    no plugin. The factory returns a :class:`~rllm_core.ports.TrainerLauncher`, which the
    ``--role trainer`` process builds (no other process does) and drives as it drives the
    local-process launcher, ``[scheduler].ready_timeout_s`` included. The launched job meets
    the scheduler only in the run's object store: a launcher lists ``store`` in its trait
    ``run_keys`` (a config field, not a plan key) and is built with the plan's built
    ``[object_store]`` there; ``plan check`` refuses a launcher in a plan without one. A built
    launcher with a ``close`` method (sync or async) is closed when the scheduler ends, after
    every job it launched was released. The trait ``places_on_nodes`` (default False) says
    that the launcher runs each job on the machine its command file's ``node`` names (a
    convertible node, ``[scheduler].nodes``); ``plan check`` refuses convertible nodes with a
    launcher without it, which would drain a node for a trainer that runs elsewhere.

    Example::

        @hookimpl
        def rllm_trainer_launchers():
            yield ComponentSpec(
                kind="trainer_launcher",
                name="slurm",
                factory=lazy("my_pkg.slurm:SlurmLauncher.from_config"),
                config=SlurmConfig,
                summary="one Slurm job per trainer incarnation",
                traits={"run_keys": ("store",)},
            )
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
