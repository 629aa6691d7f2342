"""Evaluation behind ``rllm-core eval``: pass@k over a task split (``docs/running.md``).

:mod:`.scoring` turns a rollout batch into per-task results and the summary (pass@k, pass@1,
mean reward), :mod:`.folder` writes the results folder, :mod:`.runner` runs the attempts
through the in-process gateway, :mod:`.display` shows progress with live accuracy.
"""

from rllm_core.evaluation.folder import EvalFolder
from rllm_core.evaluation.runner import (
    CheckpointNotFound,
    EvalResult,
    Evaluation,
    checkpoint_state_dir,
)
from rllm_core.evaluation.scoring import TaskResult, summarize, task_results

__all__ = [
    "CheckpointNotFound",
    "EvalFolder",
    "EvalResult",
    "Evaluation",
    "TaskResult",
    "checkpoint_state_dir",
    "summarize",
    "task_results",
]
