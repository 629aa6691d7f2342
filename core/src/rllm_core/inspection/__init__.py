"""Reading a finished (or still running) run folder back: the run's summary, its episodes and
the conversation of one episode rebuilt from the run's trace store.

:mod:`~rllm_core.inspection.runs` summarizes run folders, :mod:`~rllm_core.inspection.episodes`
finds episodes in ``episodes.jsonl`` and :mod:`~rllm_core.inspection.conversation` reads an
episode's traces through the plugin that wrote them. Every problem a user must act on is an
:class:`~rllm_core.inspection.errors.InspectionError` whose message names the path and what to
do.
"""

from rllm_core.inspection.errors import InspectionError

__all__ = ["InspectionError"]
