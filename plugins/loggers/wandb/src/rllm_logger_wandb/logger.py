"""The ``wandb`` logger: one Weights & Biases run per logger.

``log_metrics(3, {"reward/mean": 0.41})`` is ``run.log({"reward/mean": 0.41}, step=3)``: one
history row per step, the metric names as keys (slashes make sections in the W&B UI).
``log_event("checkpoint", {"path": "ckpt-3"})`` adds to the row of the latest ``log_metrics``
step (0 before the first) the key ``event/checkpoint``, a JSON array holding, for each
``checkpoint`` event logged since that ``log_metrics`` call, the line the ``jsonl`` logger
writes: ``[{"event":"checkpoint","path":"ckpt-3"}]``.

The run starts with wandb's console capture off (the run's own output stays as it is) and
``reinit="create_new"``, so several loggers, or the user's own runs, live side by side in one
process. ``close`` finishes the run.

What it writes:

- Metric values must be numbers: ints, floats, bools and numpy or torch scalars, written as
  floats (64-bit); anything else is skipped, as are the names wandb keeps for itself
  (``_step``, ``_runtime``, ``_timestamp`` and those starting with ``_wandb``).
- ``nan`` and ``inf`` metrics are written as they are (wandb stores ``NaN``, ``Infinity``).
- Event fields follow the ``jsonl`` logger's rules (see :mod:`rllm_core.logging_values`).
- wandb drops, with a warning, a step lower than one it has already written.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import wandb
from rllm_core.logging_values import event_json, metric_number

if TYPE_CHECKING:
    from rllm_logger_wandb.plugin import WandbLoggerConfig

__all__ = ["WandbLogger"]

_RESERVED = frozenset({"_step", "_runtime", "_timestamp"})


class WandbLogger:
    """A :class:`~rllm_core.ports.Logger` writing to a new wandb run. Thread-safe.

    ``path`` is the folder that receives wandb's files (``<path>/wandb/offline-run-*/``),
    created when missing; ``None`` leaves wandb's default: WANDB_DIR, else the working
    directory."""

    def __init__(
        self,
        *,
        mode: Literal["offline", "online", "disabled"] = "offline",
        project: str | None = None,
        entity: str | None = None,
        name: str | None = None,
        path: str | os.PathLike[str] | None = None,
        tags: Iterable[str] = (),
        group: str | None = None,
    ) -> None:
        if path is not None:
            Path(path).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            mode=mode,
            project=project,
            entity=entity,
            name=name,
            dir=None if path is None else str(path),
            tags=list(tags) or None,
            group=group,
            reinit="create_new",
            settings=wandb.Settings(console="off"),
        )
        self._lock = threading.Lock()
        self._closed = False
        self._step = 0
        self._events: dict[str, list[str]] = {}

    @classmethod
    def from_config(cls, config: WandbLoggerConfig) -> WandbLogger:
        """Build from the validated plan config (the component factory)."""
        return cls(
            mode=config.mode,
            project=config.project,
            entity=config.entity,
            name=config.name,
            path=config.path,
            tags=config.tags,
            group=config.group,
        )

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log one history row at ``step``, skipping values that are not numbers."""
        row = {}
        for name, value in metrics.items():
            number = metric_number(value)
            if isinstance(name, str) and number is not None and not _reserved(name):
                row[name] = number
        with self._lock:
            self._check_open()
            if step != self._step:
                self._events.clear()
            self._step = step
            if row:
                self.run.log(row, step=step)

    def log_event(self, name: str, fields: Mapping[str, Any]) -> None:
        """Add the event under ``event/<name>`` to the row of the latest metrics step."""
        line = event_json(name, fields)
        with self._lock:
            self._check_open()
            lines = self._events.setdefault(str(name), [])
            lines.append(line)
            self.run.log({f"event/{name}": "[" + ",".join(lines) + "]"}, step=self._step)

    def close(self) -> None:
        """Finish the run (in offline mode: flush it to disk); idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self.run.finish()

    def __enter__(self) -> WandbLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"WandbLogger(run={getattr(self.run, 'id', None)!r})"

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(
                f"the wandb logger of run {getattr(self.run, 'id', None)!r} is closed;"
                " build a new one to log more"
            )


def _reserved(name: str) -> bool:
    return name in _RESERVED or name.startswith("_wandb")
