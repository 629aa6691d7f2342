"""The ``hf`` renderer for rllm-core: any tokenizer with a chat template, through transformers.

The entry module is :mod:`rllm_renderer_hf.plugin`; it does not import transformers. The
renderer (:mod:`rllm_renderer_hf.renderer`) loads it when a plan builds the component.
"""
