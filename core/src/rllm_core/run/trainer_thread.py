"""The one thread of a process that runs the trainer's computations."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any

__all__ = ["TrainerThread"]


class TrainerThread:
    """The one thread that does every training computation of a process (updates, weight
    exports and loads).

    Each thread that runs parallel torch work keeps its own OpenMP workers, and GNU OpenMP
    shortens its spin-waits once they outnumber the cores, which slowed the quickstart's
    train steps by about a third; one thread for the trainer keeps their number down.
    """

    def __init__(self) -> None:
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    async def call(self, call: Callable[[], Any]) -> Any:
        """Run ``call`` on the thread (started on first use)."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="rllm-trainer"
            )
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def shutdown(self) -> None:
        """Wait for the thread's work and end it; a later call starts a new one."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
