"""The training loop behind ``rllm-core run`` (``docs/running.md``).

One job per module: :mod:`.components` (plan -> built components), :mod:`.loop` (the
steps), :mod:`.folder` (the run folder), :mod:`.metrics` (metrics and episode records),
:mod:`.state` (data order, random generators), :mod:`.checkpoints`, :mod:`.plots`,
:mod:`.display`, :mod:`.signals` and :mod:`.sessions` (per-rollout sampling seeds).
"""

from rllm_core.training.checkpoints import latest_checkpoint, load_checkpoint, save_checkpoint
from rllm_core.training.folder import RunFolder
from rllm_core.training.state import DataOrder, LoopState

__all__ = [
    "DataOrder",
    "LoopState",
    "RunFolder",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
]
