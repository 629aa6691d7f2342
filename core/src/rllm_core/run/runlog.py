"""The run log: what libraries report while a run builds and trains, kept out of the display.

While a :class:`RunLog` is open, every ``logging`` record at WARNING or above and every
``warnings.warn`` message (through :func:`logging.captureWarnings`, as
``<file>:<line>: <Category>: <message>``) is appended to ``run.log`` in the run folder
(``RunFolder.log``). Handlers that were on the root logger before keep seeing only the records
they saw before, so the terminal shows what it showed, minus library warnings. transformers'
own stderr handler is detached for as long as the log is open (its records reach the file
through the root logger instead), and transformers' and huggingface_hub's progress bars are
switched off through their own switches. :meth:`RunLog.close` puts every setting back.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, TracebackType

__all__ = ["RunLog"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Formatter(logging.Formatter):
    # captured warnings end in a newline; one record stays one block without a blank line after it
    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).rstrip("\n")


class RunLog:
    """Send library warnings and captured ``warnings`` to ``path`` and switch library progress
    bars off until :meth:`close`; usable as a context manager. ``path`` is appended to, so a
    resumed run adds to the log of its start."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._undo: list[Callable[[], None]] = []
        self.handler = logging.FileHandler(self.path, mode="a", encoding="utf-8")
        self.handler.setLevel(logging.WARNING)
        self.handler.setFormatter(_Formatter(_FORMAT))
        try:
            self._route_root()
            self._capture_warnings()
            self._quiet_huggingface_hub()
            self._quiet_transformers()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> RunLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Put back every logging, warning and progress-bar setting and close the file; a
        second call does nothing."""
        while self._undo:
            self._undo.pop()()
        self.handler.close()

    def _route_root(self) -> None:
        root = logging.getLogger()
        before = root.level
        # Existing handlers (the command line's stderr handler) keep their former threshold.
        for handler in list(root.handlers):
            if handler.level < before:
                self._undo.append(lambda h=handler, level=handler.level: h.setLevel(level))
                handler.setLevel(before)
        if before > logging.WARNING:
            root.setLevel(logging.WARNING)
            self._undo.append(lambda: root.setLevel(before))
        root.addHandler(self.handler)
        self._undo.append(lambda: root.removeHandler(self.handler))

    def _capture_warnings(self) -> None:
        captured = getattr(logging, "_warnings_showwarning", None) is not None
        if not captured:
            logging.captureWarnings(True)
            self._undo.append(lambda: logging.captureWarnings(False))
        # py.warnings must reach the root logger, whatever level or handlers it was given.
        py_warnings = logging.getLogger("py.warnings")
        self._detach(py_warnings)

    def _quiet_huggingface_hub(self) -> None:
        hub = _import_if_installed("huggingface_hub.utils")
        if hub is None or hub.are_progress_bars_disabled():
            return
        hub.disable_progress_bars()
        self._undo.append(hub.enable_progress_bars)

    def _quiet_transformers(self) -> None:
        # Importing it here (not when the core loads) costs a run about a second, and only
        # where transformers is installed; it must happen before a plugin loads a model.
        tf_logging = _import_if_installed("transformers.utils.logging")
        if tf_logging is None:
            return
        if tf_logging.is_progress_bar_enabled():
            tf_logging.disable_progress_bar()
            self._undo.append(tf_logging.enable_progress_bar)
        self._detach(logging.getLogger("transformers"))

    def _detach(self, logger: logging.Logger) -> None:
        """Let ``logger``'s records reach the root logger and nothing else, until close."""
        handlers = list(logger.handlers)
        propagate = logger.propagate
        for handler in handlers:
            logger.removeHandler(handler)
        logger.propagate = True

        def restore() -> None:
            logger.propagate = propagate
            for handler in handlers:
                logger.addHandler(handler)

        self._undo.append(restore)


def _import_if_installed(module: str) -> ModuleType | None:
    if module in sys.modules:
        return sys.modules[module]
    try:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return None
        return importlib.import_module(module)
    except Exception:  # a broken install must not stop a run that may never use it
        return None
