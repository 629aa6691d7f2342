"""The shell harness for rllm-core: a terminal agent that runs one command per turn.

The entry module is :mod:`rllm_harness_shell.plugin` (config and prompts); it does not import
the ``openai`` client. The reply format is parsed by :mod:`rllm_harness_shell.reply`, command
output is shaped by :mod:`rllm_harness_shell.observation`, and the loop is
:class:`rllm_harness_shell.harness.ShellHarness`.
"""
