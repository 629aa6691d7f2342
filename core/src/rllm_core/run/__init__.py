"""What every command that runs a plan shares, between the rollouts below and the RL pipeline
(:mod:`rllm_core.training`), SFT (:mod:`rllm_core.sft`), evaluation and inspection above.

One job per module: :mod:`.components` (plan -> built components, the keys a run fills in),
:mod:`.folder` (the run folder), :mod:`.state` (step, data order, random generators),
:mod:`.checkpoints`, :mod:`.lifecycle` (seed or resume, stop signals, ``save_every``, the
final checkpoint, ``summary.json``, the crash summary and the run and step hooks, once for
every loop), :mod:`.observers` (loggers and hooks), :mod:`.signals`, :mod:`.metrics` (metric
names and their reductions), :mod:`.plots`, :mod:`.runlog` and :mod:`.launch` (torchrun).
"""
