"""The Terminus-2 harness for rllm-core: harbor's own Terminus-2 agent on rllm episodes.

The entry module is :mod:`rllm_harness_terminus_2.plugin` (config only). harbor needs Python
3.12 or newer, so it never loads here: :mod:`~rllm_harness_terminus_2.sideenv` builds a side
environment with it, :mod:`~rllm_harness_terminus_2.driver` is the module that environment's
interpreter runs (the agent, and an environment object forwarding its commands), and
:mod:`~rllm_harness_terminus_2.bridge` is this side of the socket between them;
:mod:`~rllm_harness_terminus_2.harness` runs an episode.
"""
