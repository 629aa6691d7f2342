"""ChatML renderers for rllm-core: the SmolLM2-Instruct and Qwen2.5-Instruct chat templates.

The entry module is :mod:`rllm_renderer_chatml.plugin`; it imports neither ``tokenizers`` nor
anything else heavy. The renderer (:mod:`rllm_renderer_chatml.renderer`) loads when a plan
builds it.
"""
