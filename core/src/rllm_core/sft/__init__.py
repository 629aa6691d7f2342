"""Supervised fine-tuning (``rllm-core sft``, ``docs/sft.md``).

- :mod:`~rllm_core.sft.data`: examples from chat JSONL, ``datasets`` files or a run's
  episodes (``from_run``);
- :mod:`~rllm_core.sft.tokens`: examples to datums with the plan's renderer;
- :mod:`~rllm_core.sft.batches`: eval split, epochs, shuffling, batches and packing;
- :mod:`~rllm_core.sft.step`: one supervised update on any trainer backend;
- :mod:`~rllm_core.sft.loop`: the run (metrics, eval, checkpoints, plots, export).
"""
