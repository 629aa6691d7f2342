"""The Qwen3 thinking-template renderer for rllm-core.

The entry module is :mod:`rllm_renderer_qwen3.plugin`; it imports nothing heavy. The renderer
(:mod:`rllm_renderer_qwen3.renderer`) loads when a plan builds it.
"""
