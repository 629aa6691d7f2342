"""A trainer job for the island's lifecycle tests: the real job side
(:class:`~rllm_core.training.island.IslandIncarnation`) over a role that trains nothing.

``python island_fake_job.py STORE_ROOT RUN INCARNATION [POLL_S]``: each "round" takes the next
step whose ticket is in the store, a stop writes ``stopped-by-<trigger>`` under the run.
"""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

from rllm_core.training.island import IslandIncarnation
from rllm_core.training.shared import SharedRun
from rllm_object_store_file.objects import FileObjectStore


class CountingRole:
    """What :class:`IslandIncarnation` uses of a trainer role, counting steps."""

    def __init__(self, shared: SharedRun, poll_s: float) -> None:
        self.shared = shared
        self.plan = SimpleNamespace(scheduler=SimpleNamespace(poll_s=poll_s))
        self.state: SimpleNamespace | None = None
        self.calls: list[str] = []

    async def start(self, incarnation: int) -> None:
        self.calls.append("start")
        self.state = SimpleNamespace(step=int(self.shared.progress()[0]))

    async def train_round(self) -> bool:
        assert self.state is not None
        if self.shared.ticket(self.state.step + 1) is None:
            return False
        self.state.step += 1
        self.shared.put_progress(self.state.step, self.state.step)
        return True

    async def stop(self, trigger: str) -> None:
        self.shared.store.put(self.shared.key(f"stopped-by-{trigger}"), b"")


def main() -> None:
    root, run, incarnation = sys.argv[1], sys.argv[2], int(sys.argv[3])
    poll_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.02
    shared = SharedRun(FileObjectStore(root), run)
    role = CountingRole(shared, poll_s)
    ended = asyncio.run(IslandIncarnation(role, incarnation).run())  # type: ignore[arg-type]
    print(f"ended: {ended}")


if __name__ == "__main__":
    main()
