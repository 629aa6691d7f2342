"""The single-turn harness for rllm-core.

The entry module is :mod:`rllm_harness_single_turn.plugin`; it does not import the ``openai``
client. :mod:`rllm_core.kit.chat` (one chat call with the endpoint's failures mapped
to terminations) is also what the ``shell`` harness builds on.
"""
