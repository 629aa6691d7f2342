"""Contracts for task sources and harnesses (agent loops)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from rllm_core.ports.sandboxes import Sandbox
from rllm_core.types import Grade, HarnessOutcome, LLMEndpoint, Task

__all__ = ["Harness", "TaskSource"]


@runtime_checkable
class TaskSource(Protocol):
    """Provides tasks and grades their outcomes.

    Contract:

    - ``tasks(split)`` returns the tasks of a split (``"train"``, ``"eval"``) in a stable order;
      task ids are unique within a source. An unknown split raises ``KeyError``.
    - ``grade(task, outcome, sandbox)`` returns the task's :class:`~rllm_core.types.Grade`.
      A verifier that cannot produce a reward (missing or unparseable reward file, timeout,
      crash) raises an error; it never returns a silent 0.

    Example::

        for task in source.tasks("train"):
            grade = await source.grade(task, outcome, sandbox)
    """

    def tasks(self, split: str = "train") -> Sequence[Task]: ...

    async def grade(
        self, task: Task, outcome: HarnessOutcome, sandbox: Sandbox | None
    ) -> Grade: ...


@runtime_checkable
class Harness(Protocol):
    """Runs one episode of one task.

    The harness talks to the model only through ``llm`` (an OpenAI-compatible endpoint for this
    episode's session; the gateway records the tokens) and acts only through ``sandbox``. It
    returns how the episode ended; it does not grade.

    Example::

        outcome = await harness.run(task, LLMEndpoint(base_url=url, api_key=key, model="policy"),
                                    sandbox)
    """

    async def run(
        self, task: Task, llm: LLMEndpoint, sandbox: Sandbox | None
    ) -> HarnessOutcome: ...
