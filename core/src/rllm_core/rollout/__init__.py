"""Rollouts: run a harness on groups of tasks through the gateway and grade the episodes.

:class:`RolloutRunner` turns a batch of tasks into groups of scored
:class:`~rllm_core.types.Episode` records (``docs/rollout.md``)::

    runner = RolloutRunner(
        task_source=source, harness=harness, sandbox_backend=backend, gateway=gateway,
        trace_store=store, settings=RolloutSettings(group_size=4, max_concurrency=8,
        max_infra_retries=2), run_id="run-1",
    )
    batch = await runner.run(source.tasks("train")[:8], step=0)
    check_failures(batch, max_fraction=0.5, context="step 0")  # too many excluded: stop
    datums = builder.build(batch.groups)
"""

from rllm_core.rollout.classify import (
    CONNECTION_ERROR_TYPES,
    InfraError,
    classify_exception,
    infra_outcome,
    model_server_failed,
    no_model_call,
)
from rllm_core.rollout.failures import (
    TooManyFailedRollouts,
    TooManyVerifierTimeouts,
    check_failures,
    failure_hint,
    failure_report,
)
from rllm_core.rollout.gateway import SessionGateway
from rllm_core.rollout.records import EventKind, InfraFailure, RolloutBatch, RolloutEvent
from rllm_core.rollout.runner import RolloutRunner
from rllm_core.rollout.sessions import SessionKey, rollout_session_id
from rllm_core.rollout.settings import RolloutSettings

__all__ = [
    "CONNECTION_ERROR_TYPES",
    "EventKind",
    "InfraError",
    "InfraFailure",
    "RolloutBatch",
    "RolloutEvent",
    "RolloutRunner",
    "RolloutSettings",
    "SessionGateway",
    "SessionKey",
    "TooManyFailedRollouts",
    "TooManyVerifierTimeouts",
    "check_failures",
    "classify_exception",
    "failure_hint",
    "failure_report",
    "infra_outcome",
    "model_server_failed",
    "no_model_call",
    "rollout_session_id",
]
