"""``python -m rllm_core``: the ``rllm-core`` command, as ``torchrun -m rllm_core`` starts it."""

from rllm_core.cli import main

main()
