"""The training loop behind ``rllm-core run`` (``docs/running.md``).

One job per module: :mod:`.components` (plan -> built components), :mod:`.loop` (the
steps), :mod:`.folder` (the run folder), :mod:`.metrics` (metrics and episode records),
:mod:`.state` (data order, random generators), :mod:`.checkpoints`, :mod:`.plots` and
:mod:`.signals`. What a run shows is the CLI's (:mod:`rllm_core.cli.run_display`); session
seeding, policy sync and the gateway's address check are the rollout side's
(:mod:`rllm_core.rollout`).
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
