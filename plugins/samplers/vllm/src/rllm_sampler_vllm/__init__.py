"""A sampler for rllm-core over vLLM OpenAI-compatible servers.

The entry module is :mod:`rllm_sampler_vllm.plugin`; the pool is
:class:`rllm_sampler_vllm.pool.HttpWorkerPool`.
"""
