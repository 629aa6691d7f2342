"""The mini-swe-agent harness for rllm-core: mini-swe-agent's own agent loop on rllm episodes.

The entry module is :mod:`rllm_harness_mini_swe_agent.plugin` (config only); it imports neither
mini-swe-agent nor litellm. :mod:`~rllm_harness_mini_swe_agent.harness` runs an episode,
:mod:`~rllm_harness_mini_swe_agent.library` builds the library's agent from its config files,
:mod:`~rllm_harness_mini_swe_agent.environment` runs its commands in the rllm sandbox,
:mod:`~rllm_harness_mini_swe_agent.models` points its litellm models at the gateway,
:mod:`~rllm_harness_mini_swe_agent.bridge` joins its thread to the event loop, and
:mod:`~rllm_harness_mini_swe_agent.termination` maps how it ended.
"""
