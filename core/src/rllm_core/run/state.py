"""The loop's resumable state: the step counter, the data order and the random generators."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DataOrder", "LoopState", "capture_rngs", "restore_rngs", "seed_rngs"]


@dataclass
class DataOrder:
    """Which train tasks each step gets: a seeded permutation per epoch, read in order.

    Epoch ``e``'s permutation of ``range(size)`` comes from ``random.Random(f"{seed}:{e}")``,
    so it depends on nothing but the seed and the epoch. A batch never spans two epochs: when
    fewer than ``k`` tasks are left, the rest of the epoch is skipped and the next one starts,
    so a batch never holds a task twice.
    """

    size: int
    seed: int
    epoch: int = 0
    cursor: int = 0
    order: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("the train split holds no task; check [tasks]")
        if not self.order:
            self.order = self.permutation(self.epoch)

    def permutation(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def take(self, k: int) -> list[int]:
        """The next ``k`` task indices; raises ``ValueError`` when ``k`` exceeds the split."""
        if k > self.size:
            raise ValueError(
                f"batch_size {k} is larger than the {self.size} train tasks; lower"
                " [algorithm].batch_size or add tasks"
            )
        if self.cursor + k > self.size:
            self.epoch += 1
            self.cursor = 0
            self.order = self.permutation(self.epoch)
        picked = self.order[self.cursor : self.cursor + k]
        self.cursor += k
        return picked

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "seed": self.seed,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "order": list(self.order),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataOrder:
        return cls(
            size=int(data["size"]),
            seed=int(data["seed"]),
            epoch=int(data["epoch"]),
            cursor=int(data["cursor"]),
            order=[int(i) for i in data["order"]],
        )


def seed_rngs(seed: int) -> None:
    """Seed Python's global generator, and numpy's when numpy is installed."""
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        return
    np.random.seed(seed % 2**32)


def capture_rngs() -> dict[str, Any]:
    """Python's (and numpy's, when installed) global generator state as JSON-ready data."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss]}
    try:
        import numpy as np
    except ImportError:
        return state
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    return state


def restore_rngs(state: dict[str, Any]) -> None:
    """Undo :func:`capture_rngs`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


@dataclass
class LoopState:
    """``step``: training steps completed; ``data``: the order the next step reads from;
    ``rngs``: the generators' state after that step; ``buffer_watermark``: the sample
    buffer's committed watermark after it (async pipeline; -1 when nothing was committed)."""

    step: int
    data: DataOrder
    rngs: dict[str, Any] = field(default_factory=dict)
    buffer_watermark: int = -1

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "data": self.data.to_dict(),
            "rngs": self.rngs,
            "buffer_watermark": self.buffer_watermark,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoopState:
        return cls(
            step=int(data["step"]),
            data=DataOrder.from_dict(data["data"]),
            rngs=data["rngs"],
            buffer_watermark=int(data.get("buffer_watermark", -1)),
        )
