"""Algorithm building blocks shared by the run loop, trainer backends and loss plugins.

The pure-Python pieces that turn rollouts into training data are exported here:
:func:`merge_trajectory`, :func:`trajectories_from_traces` and :class:`DatumBuilder` (see
``docs/algorithms/datums.md``). Importing this package never imports torch; modules that need
it (:mod:`rllm_core.algorithms.tensors`) and the aggregation helpers are imported explicitly
(``from rllm_core.algorithms.aggregation import make_aggregate``).
"""

from rllm_core.algorithms.datums import (
    HISTORY_BREAK_REASONS,
    count_history_breaks,
    count_incomplete_chains,
    count_tool_calls,
    merge_trajectory,
    trajectories_from_traces,
)
from rllm_core.algorithms.groups import DatumBatch, DatumBuilder, DatumReport

__all__ = [
    "HISTORY_BREAK_REASONS",
    "DatumBatch",
    "DatumBuilder",
    "DatumReport",
    "count_history_breaks",
    "count_incomplete_chains",
    "count_tool_calls",
    "merge_trajectory",
    "trajectories_from_traces",
]
