"""A sampler for rllm-core over vLLM OpenAI-compatible servers, kept on a trainer's policy.

The entry module is :mod:`rllm_sampler_vllm.plugin`; the sampler is
:class:`rllm_sampler_vllm.follower.VllmSampler`, over the pool
:class:`rllm_sampler_vllm.pool.HttpWorkerPool`; :mod:`rllm_sampler_vllm.serve` starts ``vllm
serve`` when asked to.
"""
