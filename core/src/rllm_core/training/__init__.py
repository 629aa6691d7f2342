"""The RL pipeline behind ``rllm-core run`` (``docs/running.md``), on the run lifecycle of
:mod:`rllm_core.run`.

One job per module: :mod:`.loop` (one process: rollouts and training), :mod:`.pipeline` (the
producer half: tasks -> rollouts -> datums -> sample buffer and ticket), :mod:`.update` (the
trainer half's policy update), :mod:`.roles` (a split run's sampler and trainer processes),
:mod:`.shared` (their meeting place in an object store), :mod:`.cuts` (checkpoint cuts and
policy releases in an object store) and :mod:`.scheduler` (a trainer started and stopped on
demand).
"""
