"""A plugin that records every lifecycle hook call, for tests of when and how hooks fire."""

from __future__ import annotations

from rllm_core import hookimpl


class Recorder:
    """Appends one tuple per lifecycle hook call to ``calls`` (its own list unless given one):
    ``("run_start", run)``, ``("step_start", step)``, ``("step_end", step, metrics)`` and
    ``("run_end", status, error)``."""

    def __init__(self, calls: list[tuple] | None = None) -> None:
        self.calls: list[tuple] = [] if calls is None else calls

    @hookimpl
    def rllm_run_start(self, run):
        self.calls.append(("run_start", run))

    @hookimpl
    def rllm_step_start(self, run, step):
        self.calls.append(("step_start", step))

    @hookimpl
    def rllm_step_end(self, run, step, metrics):
        self.calls.append(("step_end", step, dict(metrics)))

    @hookimpl
    def rllm_run_end(self, run, status, error):
        self.calls.append(("run_end", status, error))
