"""What watches a run: the plan's ``[[loggers]]`` and the plugins' lifecycle hooks.

:class:`RunObservers` is the one place the training loop reports to. Each step's record (the
``metrics.jsonl`` line) goes to every logger's ``log_metrics`` (numbers only, without
``step``) and then to the ``rllm_step_end`` hook; events (``resume``, ``checkpoint``,
``failure``, ``summary``) go to every logger's ``log_event``.

An observer never stops a run. A logger that raises is reported once (a display warning naming
the plan entry and the error) and skipped for the rest of the run; it is still closed at the
end. A hook implementation that raises is reported once per plugin and hook, and called again
at the next hook (in strict plugin mode, ``RLLM_CORE_STRICT_PLUGINS=1``, it raises instead).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rllm_core.plugins.manager import PluginManager
from rllm_core.types import RunInfo, RunStatus

__all__ = ["RunObservers", "numeric_metrics"]


def numeric_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics record, as floats, without ``step``: what a logger receives."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "step" or not isinstance(value, (int, float)):
            continue
        out[key] = float(value)
    return out


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class RunObservers:
    """The loggers (``(label, logger)`` pairs, the label naming the plan entry) and the
    lifecycle hooks of ``plugins`` for one run; ``warn`` shows a one-line warning.

    Call :meth:`run_start` once the run knows its state, :meth:`step_start` and
    :meth:`step_end` around each step, :meth:`event` for events, and :meth:`run_end` on every
    way out: it closes the loggers, then fires ``rllm_run_end``.
    """

    def __init__(
        self,
        *,
        loggers: Sequence[tuple[str, Any]],
        plugins: PluginManager,
        warn: Callable[[str], None],
    ) -> None:
        self.loggers = list(loggers)
        self.plugins = plugins
        self.warn = warn
        self.run: RunInfo | None = None
        self._failed_loggers: set[str] = set()
        self._reported_hooks: set[tuple[str, str]] = set()
        self._closed = False
        self._ended = False

    # ------------------------------------------------------------------ loggers

    def _each_logger(self, method: str, *args: Any) -> None:
        for label, logger in self.loggers:
            if label in self._failed_loggers:
                continue
            try:
                getattr(logger, method)(*args)
            except Exception as exc:
                self._failed_loggers.add(label)
                self.warn(
                    f"logger {label}: {method} raised {_one_line(exc)}; it is skipped for the"
                    " rest of the run"
                )

    def event(self, name: str, fields: Mapping[str, Any]) -> None:
        """Send the event ``name`` to every logger."""
        self._each_logger("log_event", name, dict(fields))

    def close_loggers(self) -> None:
        """Close every logger once (a failed one too); a raising ``close`` is reported."""
        if self._closed:
            return
        self._closed = True
        for label, logger in self.loggers:
            try:
                logger.close()
            except Exception as exc:
                if label not in self._failed_loggers:
                    self._failed_loggers.add(label)
                    self.warn(f"logger {label}: close raised {_one_line(exc)}")

    # ------------------------------------------------------------------ hooks

    def _hook_failed(self, plugin: str, hook: str, exc: Exception) -> None:
        if (plugin, hook) in self._reported_hooks:
            return
        self._reported_hooks.add((plugin, hook))
        self.warn(
            f"plugin {plugin}: {hook} raised {_one_line(exc)}; the run goes on (reported once)"
        )

    def run_start(self, run: RunInfo) -> None:
        """Fire ``rllm_run_start`` with ``run``, which every later hook receives too."""
        self.run = run
        self.plugins.notify_run_start(run, on_error=self._hook_failed)

    def step_start(self, step: int) -> None:
        """Fire ``rllm_step_start``."""
        if self.run is not None:
            self.plugins.notify_step_start(self.run, step, on_error=self._hook_failed)

    def step_end(self, step: int, record: Mapping[str, Any]) -> None:
        """Send the step's numbers to every logger, then fire ``rllm_step_end`` with a copy of
        ``record``."""
        self._each_logger("log_metrics", step, numeric_metrics(record))
        if self.run is not None:
            self.plugins.notify_step_end(self.run, step, dict(record), on_error=self._hook_failed)

    def run_end(self, status: RunStatus, error: BaseException | None = None) -> None:
        """Close the loggers, then fire ``rllm_run_end`` (once; later calls only close)."""
        self.close_loggers()
        if self._ended or self.run is None:
            return
        self._ended = True
        self.plugins.notify_run_end(self.run, status, error, on_error=self._hook_failed)
