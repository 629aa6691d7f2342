"""The cli harness for rllm-core: the base for agents that are command-line programs.

The entry module is :mod:`rllm_harness_cli.plugin` (config and templating rules); the outcome
file format is :mod:`rllm_harness_cli.outcome`, the run is
:class:`rllm_harness_cli.harness.CliHarness`.
"""
